"""``Topology.lookup_join``: rows, kinds, the cache, order, lookups in flight, error policies, checkpoints.

A :class:`Store` answers lookups from a dict and records every call's keys;
it can hold the lookups of chosen keys on an ``asyncio.Event`` that the test
releases, so what is in flight is decided by the test, never by time.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.testing import SimulatedCluster
from tests.support.held_calls import HeldCalls, until_true

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

CUSTOMERS = {"ada": "Ada Lovelace", "bob": "Bob Kahn", "cy": "Cy Young"}


class Store(HeldCalls):
    """An async ``lookup(keys)`` over ``rows`` that records each call's keys and holds calls asking for a
    key of ``held`` until :meth:`release`."""

    def __init__(self, rows: dict[Any, Any] | None = None, held: set[Any] | None = None) -> None:
        super().__init__()
        self.rows = CUSTOMERS if rows is None else rows
        self.held = set() if held is None else held
        self.calls: list[list[Any]] = []
        self.returned: list[list[Any]] = []
        self.in_flight = self.most_in_flight = 0
        self.failures: dict[Any, int] = {}  # key -> lookups asking for it that raise before any answers

    async def __call__(self, keys: list[Any]) -> dict[Any, Any]:
        self.calls.append(list(keys))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self._changed()
        try:
            for key in keys:
                if key in self.held:
                    await self.hold(key)
            for key in keys:
                if self.failures.get(key, 0):
                    self.failures[key] -= 1
                    raise ConnectionError(f"store down for {key}")
            return {key: self.rows[key] for key in keys if key in self.rows}
        finally:
            self.in_flight -= 1
            self.returned.append(list(keys))
            self._changed()


def enrich(lookup: Any, **options: Any) -> sl.Topology:
    """QueueSource 'orders' -> lookup_join 'customer' (SAME_KEY) -> CollectSink 'out'."""
    topology = sl.Topology("orders")
    orders = topology.add_source("orders", sl.QueueSource())
    joined = topology.lookup_join("customer", lookup, **options).set_input(orders, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    return topology


def out(records: list[sl.Record]) -> list[tuple[Any, Any, Any]]:
    return [(r.key, r.value, r.ts) for r in records]


async def send_batch(job: sl.Job, keys: list[str], first: int = 0) -> None:
    """Send ``keys`` with values first, first + 1, ... (queued together: the source takes them as one batch)."""
    for position, key in enumerate(keys):
        await job.send("orders", key, first + position, float(first + position))


async def finish(job: sl.Job) -> sl.JobResult:
    await job.close_source("orders")
    return await job.wait()


async def run_batch(topology: sl.Topology, keys: list[str]) -> sl.JobResult:
    """Run ``topology`` on one batch of ``keys`` to its end."""
    async with sl.start(topology) as job:
        await send_batch(job, keys)
        return await finish(job)


async def test_inner_joins_each_record_with_its_row_and_drops_those_without() -> None:
    """The default value is (value, row); 'zed' has no row and is dropped; ts and order kept."""
    store = Store()
    async with sl.start(enrich(store)) as job:
        await send_batch(job, ["ada", "zed", "bob", "ada"])
        result = await finish(job)
    assert out(result.sink("out")) == [
        ("ada", (0, "Ada Lovelace"), 0.0), ("bob", (2, "Bob Kahn"), 2.0), ("ada", (3, "Ada Lovelace"), 3.0),
    ]  # fmt: skip
    assert store.calls == [["ada", "zed", "bob"]]  # the batch's distinct keys, once each


async def test_left_keeps_records_without_a_row_and_fn_makes_the_value() -> None:
    """how='left' with fn(key, value, row): a record without a row gets row=None."""
    store = Store()

    def labelled(key: str, amount: int, name: str | None) -> str:
        return f"{name or 'unknown'} paid {amount}"

    async with sl.start(enrich(store, how="left", fn=labelled)) as job:
        await send_batch(job, ["zed", "cy"])
        result = await finish(job)
    assert out(result.sink("out")) == [("zed", "unknown paid 0", 0.0), ("cy", "Cy Young paid 1", 1.0)]


async def test_cached_keys_are_not_asked_again_and_keys_without_a_row_are_cached_too() -> None:
    """The second batch asks only for its uncached key; 'zed' (no row) was cached as having none."""
    store = Store()
    async with sl.start(enrich(store, how="left")) as job:
        await send_batch(job, ["ada", "zed"])
        await job.settle()
        await send_batch(job, ["zed", "ada", "bob", "bob"], first=2)
        result = await finish(job)
    assert store.calls == [["ada", "zed"], ["bob"]]
    assert [r.value for r in result.sink("out")] == [
        (0, "Ada Lovelace"), (1, None), (2, None), (3, "Ada Lovelace"), (4, "Bob Kahn"), (5, "Bob Kahn"),
    ]  # fmt: skip
    statistics = result.statistics.nodes["customer"]
    assert (statistics.lookups, statistics.cache_hits) == (2, 2)


async def test_cache_size_zero_asks_every_batch_again() -> None:
    """cache_size=0: each batch's distinct keys are asked, batch after batch."""
    store = Store()
    async with sl.start(enrich(store, cache_size=0)) as job:
        await send_batch(job, ["ada", "ada"])
        await job.settle()
        await send_batch(job, ["ada"], first=2)
        result = await finish(job)
    assert store.calls == [["ada"], ["ada"]]
    assert len(result.sink("out")) == 3


async def test_the_cache_evicts_the_least_recently_used_key() -> None:
    """cache_size=2: ada, bob cached; a hit on ada; cy evicts bob (not ada); bob is asked again."""
    store = Store()
    async with sl.start(enrich(store, cache_size=2)) as job:
        for position, keys in enumerate((["ada", "bob"], ["ada"], ["cy"], ["ada", "bob"])):
            await send_batch(job, keys, first=10 * position)
            await job.settle()
        await finish(job)
    assert store.calls == [["ada", "bob"], ["cy"], ["bob"]]


async def test_cached_answers_expire_cache_ttl_seconds_of_the_job_clock_after_their_fetch() -> None:
    """cache_ttl=10 on a manual clock: a hit at 9 does not extend ada's entry; at 10 it is asked again."""
    store = Store()
    clock = sl.ManualClock(start=100.0)
    async with sl.start(enrich(store, cache_ttl=10.0), clock=clock) as job:
        await send_batch(job, ["ada"])
        await job.settle()
        clock.advance(9.0)
        await send_batch(job, ["ada"], first=1)
        await job.settle()
        assert store.calls == [["ada"]]
        clock.advance(1.0)
        await send_batch(job, ["ada"], first=2)
        result = await finish(job)
    assert store.calls == [["ada"], ["ada"]]
    assert len(result.sink("out")) == 3


async def test_output_keeps_input_order_when_lookups_finish_in_reverse() -> None:
    """Three batches' lookups in flight, released last first: the output is in input order, and a cached
    key's record behind a lookup in flight waits for it."""
    store = Store(held={"ada", "bob", "cy"})
    async with sl.start(enrich(store, concurrency=4)) as job:
        await send_batch(job, ["ada"])
        await store.until(lambda: len(store.calls) == 1)
        await send_batch(job, ["bob"], first=1)
        await store.until(lambda: len(store.calls) == 2)
        await send_batch(job, ["cy", "ada"], first=2)  # ada: in flight already, not asked again
        await store.until(lambda: len(store.calls) == 3)
        for key in ("cy", "bob", "ada"):
            store.release(key)
            await store.until(lambda key=key: [key] in store.returned)
        result = await finish(job)
    assert store.calls == [["ada"], ["bob"], ["cy"]]
    assert [(r.key, r.value[0]) for r in result.sink("out")] == [("ada", 0), ("bob", 1), ("cy", 2), ("ada", 3)]


async def test_no_more_than_concurrency_lookups_are_in_flight() -> None:
    """concurrency=2, every lookup held: two are called, the third waits until one returns."""
    store = Store(held={"ada", "bob", "cy"})
    async with sl.start(enrich(store, concurrency=2)) as job:
        for position, key in enumerate(("ada", "bob", "cy")):
            await send_batch(job, [key], first=position)
            if position < 2:
                await store.until(lambda position=position: len(store.calls) == position + 1)
        instance = job._plan.instances["customer"][0]  # type: ignore[union-attr]
        await until_true(lambda: len(instance.uncalled_lookups) == 1)  # type: ignore[attr-defined]
        assert store.calls == [["ada"], ["bob"]]  # cy's lookup was made, and waits for room
        store.release("bob")
        await store.until(lambda: len(store.calls) == 3)
        assert store.calls[2] == ["cy"]
        store.release("ada")
        store.release("cy")
        result = await finish(job)
    assert store.most_in_flight == 2
    assert [r.key for r in result.sink("out")] == ["ada", "bob", "cy"]


async def test_fail_a_raising_lookup_stops_the_job_naming_node_and_key() -> None:
    """on_error='fail': the TaskError names the task, instance and the batch's first key, with the error."""
    store = Store()
    store.failures = {"bob": 1}
    message = (
        "task 'customer' instance 0 failed on lookup of the batch with key 'ada': ConnectionError: store down for bob"
    )
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$") as caught:
        await run_batch(enrich(store), ["ada", "bob"])
    assert (caught.value.task, caught.value.key) == ("customer", "ada")


async def test_fail_a_lookup_past_its_timeout_stops_the_job() -> None:
    """timeout=0.05 seconds of real time: a lookup that never returns is a TimeoutError for its batch."""
    store = Store(held={"slow"})
    message = (
        "task 'customer' instance 0 failed on lookup of the batch with key 'slow': "
        "TimeoutError: the lookup took longer than timeout=0.05 seconds"
    )
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$"):
        await run_batch(enrich(store, timeout=0.05), ["slow"])


async def test_skip_dead_letters_every_record_of_the_failed_lookup_and_nothing_else() -> None:
    """on_error='skip': the failed batch's three records are dead letters; the next batch joins."""
    store = Store()
    store.failures = {"bob": 1}
    async with sl.start(enrich(store, on_error="skip")) as job:
        await send_batch(job, ["ada", "bob", "ada"])
        await job.settle()
        await send_batch(job, ["ada", "cy"], first=3)
        result = await finish(job)
    error = "ConnectionError: store down for bob"
    assert [(d.task, d.record.key, d.record.value, d.error) for d in result.dead_letters] == [
        ("customer", "ada", 0, error), ("customer", "bob", 1, error), ("customer", "ada", 2, error),
    ]  # fmt: skip
    assert [(r.key, r.value) for r in result.sink("out")] == [("ada", (3, "Ada Lovelace")), ("cy", (4, "Cy Young"))]
    assert store.calls == [["ada", "bob"], ["ada", "cy"]]  # nothing of the failed lookup was cached


async def test_restart_looks_up_again_and_each_record_comes_out_once() -> None:
    """on_error='restart': the failed lookup is made again; every record comes out once, in order."""
    store = Store()
    store.failures = {"bob": 1}
    async with sl.start(enrich(store, on_error="restart")) as job:
        await send_batch(job, ["ada", "bob", "ada"])
        result = await finish(job)
    assert store.calls == [["ada", "bob"], ["ada", "bob"]]
    assert [(r.key, r.value[0]) for r in result.sink("out")] == [("ada", 0), ("bob", 1), ("ada", 2)]
    assert result.statistics.restarts == 1


async def test_an_answer_that_is_not_a_dict_fails_the_lookup() -> None:
    """A lookup answering a list is a TypeError for its batch."""

    async def listing(keys: list[str]) -> Any:
        return list(keys)

    with pytest.raises(sl.TaskError, match=r"TypeError: the lookup must return a dict of key -> row, got \['ada'\]$"):
        await run_batch(enrich(listing), ["ada"])


async def test_a_failing_fn_follows_the_policy_for_its_record_only() -> None:
    """on_error='skip': fn raising on bob's row dead-letters bob; ada and cy come out."""

    def shout(key: str, value: int, row: str) -> str:
        if key == "bob":
            raise ValueError("no shouting at bob")
        return row.upper()

    store = Store()
    async with sl.start(enrich(store, fn=shout, on_error="skip")) as job:
        await send_batch(job, ["ada", "bob", "cy"])
        result = await finish(job)
    assert [(r.key, r.value) for r in result.sink("out")] == [("ada", "ADA LOVELACE"), ("cy", "CY YOUNG")]
    assert [(d.record.key, d.error) for d in result.dead_letters] == [("bob", "ValueError: no shouting at bob")]


def test_lookup_join_refuses_an_unknown_how_naming_the_node() -> None:
    topology = sl.Topology("bad")
    message = "task 'customer': how must be one of ('inner', 'left'), got 'outer'"
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        topology.lookup_join("customer", Store(), how="outer")


def test_lookup_join_refuses_an_input_not_partitioned_by_same_key() -> None:
    topology = sl.Topology("bad")
    orders = topology.add_source("orders", [("ada", 1)])
    topology.lookup_join("customer", Store()).set_input(orders)
    with pytest.raises(sl.TopologyError, match=r"^task 'customer' input port 0: a join's inputs are partitioned by"):
        topology.validate()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("cache_size", -1, "cache_size must be a whole number >= 0, got -1"),
        ("cache_ttl", 0, "cache_ttl must be a number of seconds > 0 or None, got 0"),
        ("concurrency", 0, "concurrency must be a whole number >= 1, got 0"),
        ("timeout", -1.0, "timeout must be a number of seconds > 0 or None, got -1.0"),
    ],
)
def test_lookup_join_refuses_bad_limits(option: str, value: Any, message: str) -> None:
    topology = sl.Topology("bad")
    with pytest.raises(sl.TopologyError, match=f"^task 'customer': {re.escape(message)}$"):
        topology.lookup_join("customer", Store(), **{option: value})


class Crash(Exception):
    """Stops a job the hard way."""


async def checkpoint_then_crash(store: Store, checkpoints: Path) -> None:
    """ada's lookup held, bob's answered behind it, cy taken at the barrier (lookups full); then a crash."""
    async with sl.start(enrich(store, concurrency=2), checkpoint_dir=checkpoints) as job:
        await send_batch(job, ["ada"])
        await store.until(lambda: len(store.calls) == 1)
        await send_batch(job, ["bob"], first=1)
        await store.until(lambda: ["bob"] in store.returned)
        await send_batch(job, ["cy"], first=2)
        await job.checkpoint()
        assert job._result().sink("out") == []  # bob's joined record waits behind ada's
        raise Crash


async def test_a_checkpoint_with_lookups_in_flight_restores_exactly(tmp_path: Path) -> None:
    """After the restore only the records not yet joined are looked up; every record comes out once."""
    with pytest.raises(Crash):
        await checkpoint_then_crash(Store(held={"ada", "cy"}), tmp_path)
    again = Store()
    async with sl.start(enrich(again, concurrency=2), checkpoint_dir=tmp_path) as job:
        await send_batch(job, ["bob"], first=3)
        result = await finish(job)
    assert sorted(key for call in again.calls for key in call) == ["ada", "bob", "cy"]
    assert [(r.key, r.value[0]) for r in result.sink("out")] == [("ada", 0), ("bob", 1), ("cy", 2), ("bob", 3)]


async def directory(keys: list[str]) -> dict[str, str]:
    """Module level, so forked processes have it: a row for every key but multiples of 5."""
    await asyncio.sleep(0)
    return {key: key.upper() for key in keys if int(key[1:]) % 5}


def parallel(count: int = 600) -> sl.Topology:
    topology = sl.Topology("parallel-lookups")
    source = topology.add_source("s", [(f"u{i % 23}", i) for i in range(count)])
    joined = topology.lookup_join("names", directory, parallelism=2, cache_size=8, concurrency=2)
    joined.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    return topology


def by_key(records: list[sl.Record]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = {}
    for record in records:
        grouped.setdefault(record.key, []).append(tuple(record.value))
    return grouped


def expected_parallel(count: int = 600) -> dict[str, list[Any]]:
    """Every record whose key has a row, with it, in each key's input order."""
    grouped: dict[str, list[Any]] = {}
    for i in range(count):
        key = f"u{i % 23}"
        if i % 23 % 5:
            grouped.setdefault(key, []).append((i, key.upper()))
    return grouped


def test_in_process_and_with_two_processes_every_record_is_joined_once_in_key_order() -> None:
    """processes=2 gives the exact expected joins, each key's records in input order."""
    assert by_key(sl.run(parallel()).sink("out")) == expected_parallel()
    assert by_key(sl.run(parallel(), processes=2).sink("out")) == expected_parallel()


async def test_a_live_rescale_mid_stream_joins_every_record_once() -> None:
    """2 -> 3 instances a third of the way in, 3 -> 1 at two thirds, lookups in flight: each record once."""
    store = Store(rows={f"u{i}": i for i in range(17)})
    topology = sl.Topology("rescaled")
    source = topology.add_source("orders", sl.QueueSource())
    joined = topology.lookup_join("customer", store, concurrency=2, cache_size=4, parallelism=2)
    joined.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    async with sl.start(topology) as job:
        for step, instances in ((0, 3), (1, 1), (2, None)):
            for i in range(step * 300, step * 300 + 300):
                await job.send("orders", f"u{i % 17}", i)
            if instances is not None:
                await job.rescale("customer", instances)
        result = await finish(job)
    assert job.reconfigurations == 2
    assert sorted(r.value for r in result.sink("out")) == [(i, i % 17) for i in range(900)]
    for key, values in by_key(result.sink("out")).items():
        assert values == sorted(values), key


async def test_a_restore_with_more_instances_looks_up_the_stored_records_on_their_keys_instances(
    tmp_path: Path,
) -> None:
    """Taken with 1 instance, restored with 2: every stored record is joined once, on its key's instance."""
    with pytest.raises(Crash):
        await checkpoint_then_crash(Store(held={"ada", "cy"}), tmp_path)
    again = Store()
    async with sl.start(enrich(again, concurrency=2, parallelism=2), checkpoint_dir=tmp_path) as job:
        result = await finish(job)
    assert sorted(key for call in again.calls for key in call) == ["ada", "cy"]
    assert sorted((r.key, r.value[0]) for r in result.sink("out")) == [("ada", 0), ("bob", 1), ("cy", 2)]


async def test_on_a_simulated_two_worker_cluster_lookup_join_gives_the_expected_joins() -> None:
    async with SimulatedCluster(workers=2, checkpoint_interval=None) as cluster:
        outcome = await cluster.run(parallel(), job="lookups")
    assert outcome.state == "FINISHED", outcome.reason
    assert by_key(outcome.collected["out"]) == expected_parallel()


class Pooled:
    """A lookup with ``connect()``: each instance enters its own session (a pool, say) for its lifetime."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.closed: list[int] = []

    async def __call__(self, keys: list[str]) -> dict[str, str]:
        raise AssertionError("an instance calls its session's lookup, not this one")

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Any]:
        session = len(self.opened)
        self.opened.append(session)

        async def lookup(keys: list[str]) -> dict[str, tuple[str, int]]:
            return {key: (key.upper(), session) for key in keys}

        try:
            yield lookup
        finally:
            self.closed.append(session)


def test_a_lookup_with_connect_gets_one_session_per_instance_closed_at_the_end() -> None:
    """parallelism=2: two sessions opened and closed; every record joined through its instance's session."""
    pooled = Pooled()
    topology = sl.Topology("pooled")
    source = topology.add_source("s", [(f"k{i % 20}", i) for i in range(30)])
    joined = topology.lookup_join("names", pooled, parallelism=2).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    records = sl.run(topology).sink("out")
    assert sorted(pooled.opened) == sorted(pooled.closed) == [0, 1]
    sessions = {record.key: record.value[1][1] for record in records}
    assert sorted(r.value[0] for r in records) == list(range(30))
    assert all(r.value[1] == (r.key.upper(), sessions[r.key]) for r in records)
    assert set(sessions.values()) == {0, 1}  # both instances had keys, each through its own session


async def test_a_watermark_waits_behind_the_records_still_looked_up() -> None:
    """ada (ts 0.5) is looked up while the watermark passes 0.5: the window downstream gets it, none late."""
    store = Store(held={"ada"})
    topology = sl.Topology("windowed")
    source = topology.add_source("orders", sl.QueueSource(), watermarks=sl.Watermarks())
    joined = topology.lookup_join("customer", store).set_input(source, partitioning=sl.SAME_KEY)
    counts = topology.window_reduce("count", "count", window=sl.TimeWindow(1.0, time="event")).set_input(joined)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    topology.add_sink("late", sl.CollectSink()).set_input(counts, out_port=sl.LATE)
    async with sl.start(topology) as job:
        await job.send("orders", "ada", 1, 0.5)
        await store.until(lambda: store.calls == [["ada"]])
        await job.send("orders", "bob", 1, 5.0)
        await store.until(lambda: ["bob"] in store.returned)
        store.release("ada")
        result = await finish(job)
    assert out(result.sink("out")) == [("ada", 1, 0.999), ("bob", 1, 5.999)]
    assert result.sink("late") == []
    assert result.statistics.late == 0


ROWS: dict[str, Any] = {
    "flat": {"count": 0, "name": "Ada"},  # handed out as a shallow copy
    "nested": {"count": 0, "tags": ["a"]},  # as a deep copy
    "listed": [0, "Ada"],
}


def counting(key: Any, value: Any, row: Any) -> Any:
    """A fn that changes the row it is given, as careless code does."""
    if isinstance(row, dict):
        row["count"] += 1
        row.get("tags", []).append("x")
        return row["count"]
    row[0] += 1
    return row[0]


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_a_fn_that_changes_its_row_cannot_change_what_later_records_get(kind: str) -> None:
    """The cached row is not handed out: each record's fn sees the row as the lookup answered it."""

    async def rows(keys: list[Any]) -> dict[Any, Any]:
        return {key: ROWS[kind] for key in keys}

    topology = sl.Topology("careless")
    source = topology.add_source("in", [("k", n) for n in range(4)])
    joined = topology.lookup_join("j", rows, fn=counting).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    assert [r.value for r in sl.run(topology, batch_size=1).sink("out")] == [1, 1, 1, 1]
    assert ROWS["flat"]["count"] == ROWS["nested"]["count"] == ROWS["listed"][0] == 0


def test_a_task_downstream_that_changes_the_paired_row_cannot_change_the_cache() -> None:
    """With the default fn the row travels in the output value: a downstream change stays there."""

    async def rows(keys: list[Any]) -> dict[Any, Any]:
        return {key: {"seen": 0} for key in keys}

    def bump(record: sl.Record) -> tuple[Any, Any]:
        row = record.value[1]
        row["seen"] += 1
        return record.key, row["seen"]

    topology = sl.Topology("downstream")
    source = topology.add_source("in", [("k", n) for n in range(4)])
    joined = topology.lookup_join("j", rows).set_input(source, partitioning=sl.SAME_KEY)
    bumped = topology.map("bump", bump).set_input(joined)
    topology.add_sink("out", sl.CollectSink()).set_input(bumped)
    assert [r.value for r in sl.run(topology, batch_size=1).sink("out")] == [1, 1, 1, 1]
