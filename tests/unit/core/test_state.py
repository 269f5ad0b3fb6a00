"""Keyed state: get/put/delete/items, checkpoints through msgpack, splitting by key, rescaling on restore."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

import streamlet as sl
from streamlet.core.model.segments import DEFAULT_SEGMENTS, SegmentTable
from tests.conftest import pairs

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

SNAPSHOT_KEYS: list[Any] = ["a", "b", 7, -3, 2.5, b"raw", ("user", 1), ("nested", ("x", 2)), None]


def msgpack_round_trip(data: Any) -> Any:
    """``data`` as it comes back from a checkpoint file."""
    return msgpack.unpackb(msgpack.packb(data), strict_map_key=False)


def filled() -> sl.KeyedState:
    """State holding ``SNAPSHOT_KEYS[i] -> i``."""
    state = sl.KeyedState()
    for index, key in enumerate(SNAPSHOT_KEYS):
        state.put(key, index)
    return state


def test_get_returns_the_stored_value_or_the_default() -> None:
    """get gives what put stored, else the default (None unless given)."""
    state = sl.KeyedState()
    state.put("a", 1)
    state.put("a", 2)
    assert (state.get("a"), state.get("b"), state.get("b", 0)) == (2, None, 0)


def test_delete_forgets_a_key_and_ignores_a_missing_one() -> None:
    """delete removes the key; deleting an absent key is not an error."""
    state = sl.KeyedState()
    state.put("a", 1)
    state.delete("a")
    state.delete("never")
    assert (state.get("a"), len(state)) == (None, 0)


def test_items_lists_pairs_in_insertion_order_and_allows_deleting_while_iterating() -> None:
    """items() is a copy: deleting during the loop neither fails nor skips pairs."""
    state = sl.KeyedState()
    for key, value in [("a", 1), ("b", 2), ("c", 3)]:
        state.put(key, value)
    seen = []
    for key, value in state.items():
        seen.append((key, value))
        state.delete(key)
    assert (seen, len(state)) == ([("a", 1), ("b", 2), ("c", 3)], 0)


def contents(snapshot: bytes) -> list[tuple[Any, Any]]:
    """The (key, value) pairs a snapshot restores to."""
    state = sl.KeyedState()
    state.restore(snapshot)
    return list(state.items())


def test_checkpoint_is_msgpack_bytes() -> None:
    """A snapshot is one msgpack document: the key/value map."""
    state = sl.KeyedState()
    state.put("a", 1)
    assert msgpack.unpackb(state.checkpoint()) == {"a": 1}


def test_checkpoint_is_a_copy() -> None:
    """Changing the state after checkpoint() does not change the snapshot."""
    state = sl.KeyedState()
    state.put("a", 1)
    snapshot = state.checkpoint()
    state.put("a", 2)
    state.put("b", 3)
    assert contents(snapshot) == [("a", 1)]


def test_checkpoint_restore_round_trip_through_msgpack_keeps_tuple_keys() -> None:
    """Tuple keys (nested too) come back as tuples, so get() finds them."""
    restored = sl.KeyedState()
    restored.restore(msgpack_round_trip(filled().checkpoint()))
    assert list(restored.items()) == list(filled().items())
    assert restored.get(("nested", ("x", 2))) == 7


def test_restore_replaces_the_contents() -> None:
    """Keys absent from the snapshot are gone after restore."""
    state = sl.KeyedState()
    state.put("old", 1)
    state.restore(msgpack.packb({"new": 2}))
    assert list(state.items()) == [("new", 2)]


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_partition_puts_every_key_in_its_same_key_part(parts: int) -> None:
    """Part i holds exactly the keys that SAME_KEY routes to instance i (also after msgpack)."""
    for snapshot in (filled().checkpoint(), msgpack_round_trip(filled().checkpoint())):
        split = sl.KeyedState.partition(snapshot, parts)
        assert len(split) == parts
        placed = {index: [value for _, value in contents(part)] for index, part in enumerate(split)}
        expected: dict[int, list[int]] = {index: [] for index in range(parts)}
        for value, key in enumerate(SNAPSHOT_KEYS):
            expected[SegmentTable.contiguous(DEFAULT_SEGMENTS, parts).owner(key)].append(value)
        assert placed == expected


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_merge_of_partition_has_exactly_the_same_pairs(parts: int) -> None:
    """merge(partition(s, n)) holds every pair of s once, nothing else."""
    snapshot = filled().checkpoint()
    merged = sl.KeyedState.merge(sl.KeyedState.partition(snapshot, parts))
    assert sorted(contents(merged), key=repr) == sorted(contents(snapshot), key=repr)


class CountPerKey(sl.Task):
    """Counts records per key in keyed state; finish emits ``(key, count)`` for each key it holds."""

    def __init__(self, counted: Callable[[int], None] = lambda n: None) -> None:
        self.counted = counted  # told how many records each execute counted

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + 1)
        self.counted(len(inputs.get()))

    def finish(self, outputs: sl.Outputs) -> None:
        for key, count in self.state.items():
            outputs.emit(key, count)


def counting(parallelism: int, counted: Callable[[int], None] = lambda n: None) -> sl.Topology:
    """QueueSource 'in' -> CountPerKey 'count' (SAME_KEY, ``parallelism``) -> CollectSink 'out'."""
    topology = sl.Topology("counts")
    source = topology.add_source("in", sl.QueueSource())
    count = topology.add_task("count", lambda: CountPerKey(counted), parallelism=parallelism)
    count.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology


KEYS: list[Any] = [f"user{n}" for n in range(12)] + [("pair", n) for n in range(4)]
FIRST_RUN = [key for n, key in enumerate(KEYS) for _ in range(n % 3 + 1)]
SECOND_RUN = [key for n, key in enumerate(KEYS) for _ in range(n % 2 + 1)]


class Crash(Exception):
    """Ends the first run without finishing it, as a killed process would."""


async def run_until_checkpoint_then_crash(store: sl.InMemoryCheckpointStore, parallelism: int) -> None:
    """Send FIRST_RUN, checkpoint once every record is counted, then crash."""
    total = 0
    all_counted = asyncio.Event()

    def counted(records: int) -> None:
        nonlocal total
        total += records
        if total == len(FIRST_RUN):
            all_counted.set()

    async with sl.start(counting(parallelism, counted), checkpoint_store=store) as job:
        for key in FIRST_RUN:
            await job.send("in", key, 1)
        await asyncio.wait_for(all_counted.wait(), timeout=10)
        await job.checkpoint()
        raise Crash


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1), (1, 4)])
async def test_restart_with_other_parallelism_resplits_keyed_state(before: int, after: int) -> None:
    """State checkpointed by n instances is split by key over m: every key's count continues exactly."""
    store = sl.InMemoryCheckpointStore()
    with pytest.raises(Crash):
        await run_until_checkpoint_then_crash(store, before)
    assert store.epochs() == [1]
    async with sl.start(counting(after), checkpoint_store=store) as job:
        for key in SECOND_RUN:
            await job.send("in", key, 1)
        await job.close_source("in")
        result = await job.wait()
    expected = Counter(FIRST_RUN) + Counter(SECOND_RUN)
    assert sorted(pairs(result.sink("out")), key=repr) == sorted(expected.items(), key=repr)


def test_get_and_put_take_their_arguments_by_keyword_too() -> None:
    """``get(key, default=...)`` and ``put(key=..., value=...)``, as ``StateStore`` declares them."""
    state = sl.KeyedState()
    state.put(key="a", value=1)
    assert (state.get("a", default=0), state.get("b", default=0)) == (1, 0)
