"""The session-table balancer as a pure function (segment loads in, moves out), with Partial Key Grouping and
the seed's S for comparison."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamlet.adaptation.session_table import (
    DEFAULT_TOLERANCE,
    balance,
    best_possible,
    imbalance,
    instance_loads,
    partial_key_grouping,
    speedstream_s,
)
from streamlet.core.model.partition import stable_hash
from streamlet.core.model.segments import SegmentTable, segment_of


def test_even_instances_are_left_alone() -> None:
    decision = balance([5] * 8, SegmentTable.contiguous(8, 2).owners, 2)
    assert (decision.moves, decision.before, decision.after) == ((), 1.0, 1.0)
    assert decision.reason == "imbalance 1.00: even enough"


def test_nothing_sent_moves_nothing() -> None:
    assert balance([0] * 8, SegmentTable.contiguous(8, 2).owners, 2).reason == "no records in the window"


def test_the_least_active_segments_move_first_and_a_hot_one_stays() -> None:
    # instance 0: a hot segment (10) and three quiet ones (1 each); instance 1: four quiet ones
    loads = [10, 1, 1, 1, 1, 1, 1, 1]
    decision = balance(loads, SegmentTable.contiguous(8, 2).owners, 2)
    assert decision.table_moves() == {1: 1, 2: 1, 3: 1}
    assert [(move.source, move.target, move.load) for move in decision.moves] == [(0, 1, 1)] * 3
    assert decision.before == pytest.approx(13 / 8.5)
    assert decision.after == pytest.approx(10 / 8.5) == best_possible(loads, 2)  # the hot segment alone: the bound
    assert decision.reason == "imbalance 1.53 -> 1.18 by moving 3 segments"


def test_a_hot_segment_alone_cannot_be_helped() -> None:
    decision = balance([10, 0, 0, 0, 1, 1, 1, 1], SegmentTable.contiguous(8, 2).owners, 2)
    assert decision.moves == ()
    assert decision.reason == "imbalance 1.43: no move helps (a hot segment)"


def test_a_segment_bigger_than_half_the_gap_moves_when_nothing_smaller_can() -> None:
    # 12 against 4: half the gap is 4, the smallest segment is 6; moving it leaves 6 against 10 (better than
    # 12), and then a quiet segment of 2 back makes it 8 and 8
    decision = balance([6, 6, 0, 0, 2, 2, 0, 0], SegmentTable.contiguous(8, 2).owners, 2)
    assert decision.table_moves() == {0: 1, 4: 0}
    assert (decision.before, decision.after) == (1.5, 1.0)


def test_loads_and_table_must_match() -> None:
    with pytest.raises(ValueError, match="3 segment loads for a table of 8 segments"):
        balance([1, 2, 3], SegmentTable.contiguous(8, 2).owners, 2)


def zipf_keys(exponent: float, keys: int, records: int) -> list[str]:
    rng = random.Random(7)
    weights = [1 / rank**exponent for rank in range(1, keys + 1)]
    return rng.choices([f"user{rank}" for rank in range(keys)], weights, k=records)


@pytest.mark.parametrize("exponent", [1.1, 1.5])
def test_zipf_keys_end_as_even_as_their_hottest_key_allows(exponent: float) -> None:
    keys = zipf_keys(exponent, 10_000, 100_000)
    loads = [0] * 128
    for key in keys:
        loads[segment_of(key, 128)] += 1
    owners = SegmentTable.contiguous(128, 4).owners
    decision = balance(loads, owners, 4)
    moved = SegmentTable(owners, 4).moved_to(decision.table_moves()).owners
    after = imbalance(instance_loads(loads, moved, 4))
    top_key_bound = max(1.0, 4 * max(keys.count(key) for key in set(keys[:50])) / len(keys))
    assert after == pytest.approx(decision.after)
    assert after < imbalance(instance_loads(loads, owners, 4))  # better than hashing
    if exponent == 1.1:
        assert after <= 1 + DEFAULT_TOLERANCE
    else:
        assert after <= top_key_bound * 1.05  # within 5 % of what no key -> instance mapping can beat


@given(
    loads=st.lists(st.integers(0, 1_000), min_size=16, max_size=16),
    instances=st.integers(1, 5),
    shuffle=st.randoms(use_true_random=False),
)
def test_moves_never_make_it_worse_nor_beat_the_bound(loads: list[int], instances: int, shuffle: random.Random) -> None:
    owners = list(SegmentTable.contiguous(16, instances).owners)
    shuffle.shuffle(owners)
    decision = balance(loads, owners, instances)
    moved = SegmentTable(tuple(owners), instances).moved_to(decision.table_moves()).owners
    after = imbalance(instance_loads(loads, moved, instances))
    assert after == pytest.approx(decision.after)
    assert best_possible(loads, instances) - 1e-9 <= after <= decision.before + 1e-9
    assert all(move.source == owners[move.segment] != move.target for move in decision.moves)
    assert all(move.load > 0 for move in decision.moves)  # idle segments are not worth a move


def test_partial_key_grouping_sends_each_key_to_the_less_loaded_of_its_two_choices() -> None:
    first, second = stable_hash("a") % 4, stable_hash(["pkg-second-choice", "a"]) % 4
    second = second if second != first else (first + 1) % 4
    counts = partial_key_grouping(["a"] * 5, 4)
    assert counts[first] == 3
    assert counts[second] == 2
    assert sum(counts) == 5


def test_partial_key_grouping_evens_out_a_skewed_stream_better_than_hashing() -> None:
    keys = zipf_keys(1.1, 10_000, 50_000)
    hashed = [0] * 4
    for key in keys:
        hashed[stable_hash(key) % 4] += 1
    assert imbalance(partial_key_grouping(keys, 4)) < min(1.05, imbalance(hashed))


def test_speedstream_s_is_the_halved_mean_distance_from_the_means() -> None:
    assert speedstream_s([0.5, 0.5], [100, 100]) == 0
    # CPU 0.2 / 0.6 (mean 0.4), memory 10 / 30 (mean 20): each node 0.2 + 10 away, halved
    assert speedstream_s([0.2, 0.6], [10, 30]) == pytest.approx((0.2 + 10) / 2)
    with pytest.raises(ValueError, match="one CPU and one memory figure per node"):
        speedstream_s([0.1], [])
