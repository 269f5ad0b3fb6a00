"""State TTL: ``add_task(..., state_ttl=seconds)`` expires a key's entry that long after its last write.

Time is the job clock's: a ``ManualClock`` here, advanced by the test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.state.changelog import Increment, changelog
from streamlet.core.state.expiring import ExpiringState
from streamlet.core.state.keyed import _unpack

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

TimedState = Callable[[float, Callable[[], float]], Any]


class Clock:
    """A time the test sets, for an ExpiringState alone."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time


@pytest.fixture
def timed_state(each_state_backend: str, tmp_path: Path) -> TimedState:
    """Makes a state with a TTL on the backend under test (RocksDB's with a cache of 4 values)."""
    if each_state_backend == "memory":
        return ExpiringState
    backend = sl.RocksDBState(tmp_path, cache_entries=4)
    return lambda ttl, now: backend.open("job", "task", 0, 4096, ttl, now)


def test_an_entry_expires_ttl_seconds_after_its_last_write(timed_state: TimedState) -> None:
    """a written at 0 lives until 10 (exclusive); b rewritten at 12 lives until 22; expired entries are
    neither read, listed nor counted."""
    clock = Clock()
    state = timed_state(10.0, clock.now)
    state.put("a", 1)
    clock.time = 4.0
    state.put("b", 2)
    clock.time = 9.5
    assert (state.get("a"), sorted(state.items()), len(state)) == (1, [("a", 1), ("b", 2)], 2)
    clock.time = 10.0
    assert (state.get("a", "gone"), list(state.items()), len(state)) == ("gone", [("b", 2)], 1)
    clock.time = 12.0
    state.put("b", 3)
    clock.time = 21.9
    assert state.get("b") == 3
    clock.time = 22.0
    assert (state.get("b"), len(state)) == (None, 0)


def test_expired_entries_are_reclaimed_on_access_without_a_full_sweep(timed_state: TimedState) -> None:
    """Three thousand keys written at 0: one put at 10 drops them all, values and write times (they are the
    oldest writes)."""
    clock = Clock()
    state = timed_state(10.0, clock.now)
    for index in range(3000):
        state.put(index, index)
    clock.time = 10.0
    state.put("new", 1)
    assert (list(state.values), _unpack(state.checkpoint_written())) == (["new"], {"new": 10.0})


def test_the_write_times_checkpointed_are_those_of_the_values_even_if_the_clock_moved_between(
    timed_state: TimedState,
) -> None:
    """A wall clock goes on while a checkpoint is taken: a written at 0 is saved by the values' checkpoint at 9.5
    and must keep its write time in the write times' at 10 (else a restore counts it as written then, and an
    entry that expired comes back for a whole TTL)."""
    clock = Clock()
    state = timed_state(10.0, clock.now)
    state.put("a", 1)
    clock.time = 5.0
    state.put("b", 2)
    clock.time = 9.5
    values = state.checkpoint()
    clock.time = 10.0
    written = state.checkpoint_written()
    assert (_unpack(values), _unpack(written)) == ({"a": 1, "b": 2}, {"a": 0.0, "b": 5.0})
    restored = timed_state(10.0, clock.now)
    restored.restore(values)
    restored.restore_written(written)
    assert (restored.get("a", "gone"), restored.get("b")) == ("gone", 2)


@pytest.mark.parametrize("incremental", [False, True])
def test_a_value_pushed_out_of_the_cache_before_the_database_was_made_is_checkpointed(
    timed_state: TimedState, incremental: bool
) -> None:
    """On RocksDB (a cache of 4 values) a is pushed out of the cache by e, waiting to be written; b to e are then
    deleted (the cache is empty, the database still unmade, as nothing was read from it): a is still in the
    checkpoint, values and write time."""
    clock = Clock()
    state = timed_state(10.0, clock.now)
    for key in "abcde":
        state.put(key, 1)
    for key in "bcde":
        state.delete(key)
    values = state.checkpoint_increment() if incremental else state.checkpoint()
    if isinstance(values, Increment):  # RocksDB's first increment: its chunk holds the whole state
        values = changelog([values.chunk], values.segments)
    assert (_unpack(values), _unpack(state.checkpoint_written())) == ({"a": 1}, {"a": 0.0})


def test_a_task_without_state_ttl_gets_plain_keyed_state(each_state_backend: str) -> None:
    """Only a task with a TTL pays for it: the others get the backend's state itself."""
    kinds: list[str] = []

    class Look(sl.Task):
        def prepare(self, config: dict[str, Any]) -> None:
            kinds.append(type(self.state).__name__)

        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            pass

    topology = sl.Topology("kinds")
    source = topology.add_source("in", [1])
    topology.add_task("plain", Look).set_input(source)
    topology.add_task("timed", Look, state_ttl=5).set_input(source)
    sl.run(topology)
    prefix = "" if each_state_backend == "memory" else "Rocks"
    assert sorted(kinds) == [f"{prefix}ExpiringState", f"{prefix}KeyedState"]


async def test_a_reduce_with_state_ttl_starts_a_key_again_once_it_expired(manual_clock: sl.ManualClock) -> None:
    """Running sums with state_ttl=10 (given through the reduce helper): writes at 0, 5 and 14 keep 'a'
    alive; at 24, 10 s after the last write, it starts again from the new value."""
    seen: list[sl.Record] = []
    topology = sl.Topology("sums")
    source = topology.add_source("in", sl.QueueSource())
    sums = topology.reduce("sum", lambda total, value: total + value, state_ttl=10).set_input(source)
    topology.add_sink("out", seen.append).set_input(sums)
    async with sl.start(topology, clock=manual_clock) as job:
        for step in (0, 5, 9, 10):
            manual_clock.advance(step)
            await job.send("in", "a", 1)
            await job.settle()
        await job.close_source("in")
        await job.wait()
    assert [(record.key, record.value, record.ts) for record in seen] == [
        ("a", 1, 0),
        ("a", 2, 5),
        ("a", 3, 14),
        ("a", 1, 24),
    ]


# -- checkpoints -------------------------------------------------------------------------------


class Last(sl.Task):
    """Stores each record's value under its key; a value of '?' asks instead: emits the key's value."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            if record.value == "?":
                outputs.emit(record.key, self.state.get(record.key))
            else:
                self.state.put(record.key, record.value)


def lasting(seen: list[sl.Record], state_ttl: float | None, parallelism: int = 1) -> sl.Topology:
    """QueueSource 'in' -> Last 't' (``state_ttl``, ``parallelism``, SAME_KEY) -> a sink appending to ``seen``."""
    topology = sl.Topology("last")
    source = topology.add_source("in", sl.QueueSource())
    node = topology.add_task("t", Last, parallelism=parallelism, state_ttl=state_ttl)
    node.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", seen.append).set_input(node)
    return topology


class Crash(Exception):
    """Leaves a job's ``async with`` without finishing it, like a crash."""


async def write_then_crash(
    store: sl.InMemoryCheckpointStore, state_ttl: float | None, writes: list[tuple[float, Any, Any]], at: float
) -> None:
    """Run 1 on a ManualClock: ``(clock time, key, value)`` writes, a checkpoint at ``at``, then a crash."""
    clock = sl.ManualClock()

    async def crashing() -> None:
        async with sl.start(lasting([], state_ttl), clock=clock, checkpoint_store=store) as job:
            for when, key, value in writes:
                clock.advance(when - clock.now())
                await job.send("in", key, value)
                await job.settle()
            clock.advance(at - clock.now())
            await job.checkpoint()
            raise Crash

    with pytest.raises(Crash):
        await crashing()


async def ask(job: sl.Job, seen: list[sl.Record], *keys: Any) -> list[tuple[Any, Any]]:
    """The values of ``keys`` now, as the task reads them."""
    del seen[:]
    for key in keys:
        await job.send("in", key, "?")
    await job.settle()
    return sorted((record.key, record.value) for record in seen)


async def test_expired_entries_stay_out_of_checkpoints_and_expiry_goes_on_after_a_restore() -> None:
    """a written at 0 and b at 6, checkpoint at 11: a has expired and is not in it, b is, written at 6.
    Resumed at 15, b is still there; at 16 (10 s after its write in run 1, not after the restore) it is gone."""
    store = sl.InMemoryCheckpointStore()
    await write_then_crash(store, 10, [(0, "a", "x"), (6, "b", "y")], at=11)
    latest = store.latest()
    assert latest is not None
    [snapshot] = latest[1]["tasks"]["t"]
    assert (_unpack(snapshot["state"]), _unpack(snapshot["state_written"])) == ({"b": "y"}, {"b": 6})
    seen: list[sl.Record] = []
    clock = sl.ManualClock(start=15)
    async with sl.start(lasting(seen, 10), clock=clock, checkpoint_store=store) as job:
        assert await ask(job, seen, "a", "b") == [("a", None), ("b", "y")]
        clock.advance(1)
        assert await ask(job, seen, "b") == [("b", None)]
        await job.close_source("in")
        await job.wait()


async def test_state_checkpointed_without_a_ttl_counts_as_written_at_the_restore() -> None:
    """A checkpoint of the task before it had state_ttl: resumed at 100 with state_ttl=10, a lives to 110."""
    store = sl.InMemoryCheckpointStore()
    await write_then_crash(store, None, [(0, "a", "x")], at=50)
    seen: list[sl.Record] = []
    clock = sl.ManualClock(start=100)
    async with sl.start(lasting(seen, 10), clock=clock, checkpoint_store=store) as job:
        clock.advance(9)
        assert await ask(job, seen, "a") == [("a", "x")]
        clock.advance(1)
        assert await ask(job, seen, "a") == [("a", None)]
        await job.close_source("in")
        await job.wait()


async def test_write_times_are_split_by_key_when_a_resume_changes_the_parallelism() -> None:
    """Six keys written at 0 by one instance, resumed by two at 5: each still expires at 10."""
    store = sl.InMemoryCheckpointStore()
    keys = [f"k{index}" for index in range(6)]
    await write_then_crash(store, 10, [(0, key, key.upper()) for key in keys], at=1)
    seen: list[sl.Record] = []
    clock = sl.ManualClock(start=5)
    async with sl.start(lasting(seen, 10, parallelism=2), clock=clock, checkpoint_store=store) as job:
        assert await ask(job, seen, *keys) == [(key, key.upper()) for key in keys]
        clock.advance(5)
        assert await ask(job, seen, *keys) == [(key, None) for key in keys]
        await job.close_source("in")
        await job.wait()


async def test_write_times_move_with_their_keys_in_a_live_rescale() -> None:
    """Six keys written at 0 by one instance; at 5 the task goes to three instances live, and k0 is written
    again at 6: at 10 the other five are gone, k0 lives to 16; back to one instance, it still does."""
    seen: list[sl.Record] = []
    keys = [f"k{index}" for index in range(6)]
    clock = sl.ManualClock()
    async with sl.start(lasting(seen, 10), clock=clock) as job:
        for key in keys:
            await job.send("in", key, key.upper())
        await job.settle()
        clock.advance(5)
        await job.rescale("t", 3)
        clock.advance(1)
        await job.send("in", "k0", "again")
        await job.settle()
        clock.advance(4)
        assert await ask(job, seen, *keys) == [("k0", "again"), *((key, None) for key in keys[1:])]
        await job.rescale("t", 1)
        clock.advance(5.5)
        assert await ask(job, seen, "k0") == [("k0", "again")]
        clock.advance(0.5)
        assert await ask(job, seen, "k0") == [("k0", None)]
        await job.close_source("in")
        await job.wait()


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize("state_ttl", [0, -1, "5", True, float("nan")])
def test_a_state_ttl_that_is_not_a_positive_number_is_refused_naming_the_task(state_ttl: Any) -> None:
    topology = sl.Topology("bad")
    message = f"task 't': state_ttl must be a number of seconds > 0, got {state_ttl!r}"
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        topology.add_task("t", Last, state_ttl=state_ttl)
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        topology.map("t", lambda r: (r.key, r.value), state_ttl=state_ttl)
