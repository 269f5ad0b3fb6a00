"""The rebalance policy: which migrations spread a running job over the workers now present."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from streamlet.adaptation.rebalance import Migration, rebalance


def counts(placed: dict[str, str], workers: list[str]) -> list[int]:
    held = Counter(placed.values())
    return [held[worker] for worker in workers]


def apply(placed: dict[str, str], moves: list[Migration]) -> dict[str, str]:
    after = dict(placed)
    for move in moves:
        assert after[move.instance] == move.source
        after[move.instance] = move.target
    return after


def test_instances_move_from_the_fullest_worker_to_the_emptiest() -> None:
    placed = {"words.0": "w0", "count.0": "w0", "count.1": "w0", "count.2": "w0", "out.0": "w1"}
    moves = rebalance(placed, {"w0": 0, "w1": 4, "w2": 4}, lambda instance: instance.startswith("count"))
    assert moves == [Migration("count.2", "w0", "w2"), Migration("count.1", "w0", "w1")]  # fewest first
    assert counts(apply(placed, moves), ["w0", "w1", "w2"]) == [2, 2, 1]


def test_sources_and_sinks_stay_where_they_are_even_when_that_leaves_it_uneven() -> None:
    placed = {"words.0": "w0", "words.1": "w0", "words.2": "w0", "count.0": "w1"}
    assert rebalance(placed, {"w0": 4, "w1": 4, "w2": 4}, lambda instance: instance.startswith("count")) == []


def test_room_and_constraints_limit_the_targets() -> None:
    placed = {f"count.{index}": "w0" for index in range(6)}
    moves = rebalance(placed, {"w0": 0, "w1": 1, "w2": 8}, lambda _: True, lambda _, worker: worker != "w2")
    assert moves == [Migration("count.5", "w0", "w1")]  # w1 has room for one; count may not run on w2


def test_an_even_job_does_not_move() -> None:
    placed = {"a.0": "w0", "a.1": "w1", "b.0": "w0", "b.1": "w1", "c.0": "w2"}
    assert rebalance(placed, {"w0": 4, "w1": 4, "w2": 4}, lambda _: True) == []


def test_a_task_with_most_instances_on_the_fullest_worker_spreads_first() -> None:
    placed = {"a.0": "w0", "b.0": "w0", "b.1": "w0", "b.2": "w0"}
    assert rebalance(placed, {"w0": 0, "w1": 4}, lambda _: True) == [
        Migration("b.2", "w0", "w1"),
        Migration("b.1", "w0", "w1"),
    ]


@given(
    st.dictionaries(st.integers(0, 40), st.sampled_from(["w0", "w1", "w2", "w3"]), max_size=30),
    st.integers(1, 4),
)
def test_with_room_everywhere_every_worker_ends_within_one_of_the_others(where: dict[int, str], workers: int) -> None:
    placed = {f"t.{index}": worker for index, worker in where.items()}
    present = [f"w{index}" for index in range(4)][: max(workers, 1)]
    room = {worker: 100 for worker in present}
    moves = rebalance(placed, room, lambda _: True)
    after = apply(placed, moves)
    on_present = counts(after, present)
    assert all(move.target in present for move in moves)
    assert len({move.instance for move in moves}) == len(moves)  # no instance moves twice
    if all(worker in present for worker in placed.values()):
        assert max(on_present, default=0) - min(on_present, default=0) <= 1
