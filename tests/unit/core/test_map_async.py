"""``Topology.map_async``: calls in flight, order, watermarks, error policies, checkpoints, settle, processes, rescale.

A :class:`Gate` holds calls in flight deterministically: a held key's call
waits for its own ``asyncio.Event``; the test releases them in the order it
wants and waits on events (a call started, a call returned), never on time.
"""

from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.testing import SimulatedCluster
from tests.support.held_calls import HeldCalls, until_true

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


class Gate(HeldCalls):
    """An async function for ``map_async`` that doubles values and holds the calls of chosen keys."""

    def __init__(self, held: set[str] | None = None, *, results: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.held = held  # keys whose calls wait to be released (None: every key's)
        self.results = results or {}  # a key's answer other than (key, 2 * value)
        self.started: list[str] = []
        self.returned: list[str] = []
        self.in_flight = self.most_in_flight = 0

    async def __call__(self, record: sl.Record) -> Any:
        self.started.append(record.key)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self._changed()
        if self.held is None or record.key in self.held:
            await self.hold(record.key)
        else:
            await asyncio.sleep(0)  # yield, so other calls start while this one is in flight
        self.in_flight -= 1
        self.returned.append(record.key)
        self._changed()
        return self.results.get(record.key, (record.key, record.value * 2))


def enrich(fn: Any, **options: Any) -> sl.Topology:
    """QueueSource 's' -> map_async 'enrich' -> CollectSink 'out'."""
    topology = sl.Topology("enrichment")
    source = topology.add_source("s", sl.QueueSource())
    mapped = topology.map_async("enrich", fn, **options).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(mapped)
    return topology


def out(records: list[sl.Record]) -> list[tuple[Any, Any, Any]]:
    return [(r.key, r.value, r.ts) for r in records]


async def send_all(job: sl.Job, keys: str, ts: float | None = None) -> None:
    for position, key in enumerate(keys):
        await job.send("s", key, position, ts if ts is None else ts + position)


async def finish(job: sl.Job) -> sl.JobResult:
    await job.close_source("s")
    return await job.wait()


async def run_all(topology: sl.Topology, keys: Any) -> sl.JobResult:
    """Send ``keys`` (values 0, 1, ...), end the input, return the result."""
    async with sl.start(topology) as job:
        for position, key in enumerate(keys):
            await job.send("s", key, position)
        return await finish(job)


async def test_ordered_results_come_in_input_order_when_calls_finish_in_reverse() -> None:
    """ordered=True: d, c, b, a return in that order; a, b, c, d come out."""
    gate = Gate()
    async with sl.start(enrich(gate, concurrency=4)) as job:
        await send_all(job, "abcd", ts=1.0)
        await gate.until(lambda: len(gate.started) == 4)
        for key in "dcba":
            gate.release(key)
            await gate.until(lambda key=key: key in gate.returned)
        result = await finish(job)
    assert out(result.sink("out")) == [("a", 0, 1.0), ("b", 2, 2.0), ("c", 4, 3.0), ("d", 6, 4.0)]


async def test_unordered_results_come_in_completion_order() -> None:
    """ordered=False: results leave as their calls complete (no watermark in between: no event time)."""
    gate = Gate()
    async with sl.start(enrich(gate, concurrency=4, ordered=False)) as job:
        await send_all(job, "abcd")
        await gate.until(lambda: len(gate.started) == 4)
        for key in "cadb":
            gate.release(key)
            await gate.until(lambda key=key: key in gate.returned)
        result = await finish(job)
    assert [r.key for r in result.sink("out")] == ["c", "a", "d", "b"]


async def test_none_drops_the_record() -> None:
    """An answer of None emits nothing for that record; the others come out."""
    gate = Gate(set(), results={"b": None})
    async with sl.start(enrich(gate)) as job:
        await send_all(job, "abc")
        result = await finish(job)
    assert [r.key for r in result.sink("out")] == ["a", "c"]


async def test_results_keep_the_input_records_ts() -> None:
    """Each result carries its input record's ts, whatever the answer's key."""
    gate = Gate(set(), results={"a": ("x", 1), "b": ("y", 2)})
    async with sl.start(enrich(gate)) as job:
        await job.send("s", "a", 0, 10.5)
        await job.send("s", "b", 0, 3.25)
        result = await finish(job)
    assert out(result.sink("out")) == [("x", 1, 10.5), ("y", 2, 3.25)]


def test_no_more_than_concurrency_calls_are_in_flight() -> None:
    """20 records in one batch with concurrency=3: at most 3 calls at once, exactly 3 at the peak."""
    gate = Gate(set())
    topology = sl.Topology("limited")
    source = topology.add_source("s", [(f"k{i}", i) for i in range(20)])
    mapped = topology.map_async("enrich", gate, concurrency=3).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(mapped)
    result = sl.run(topology)
    assert gate.most_in_flight == 3
    assert [r.value for r in result.sink("out")] == [2 * i for i in range(20)]


async def yield_often() -> None:
    """Let every other task run as far as it can (the source until it waits on room downstream)."""
    for _ in range(100):
        await asyncio.sleep(0)


async def test_a_full_instance_stops_taking_input() -> None:
    """concurrency=2, calls held: 2 calls start, 2 batches wait in its inbox, 10 records stay in the source queue."""
    gate = Gate()
    async with sl.start(enrich(gate, concurrency=2)) as job:
        feed = job._plan.feeds["s"]  # type: ignore[union-attr]
        inbox = job._plan.instances["enrich"][0].inbox  # type: ignore[union-attr]
        for i in range(2):
            await job.send("s", f"k{i}", i)
            await gate.until(lambda i=i: len(gate.started) == i + 1)
        for batch in range(4):
            for i in range(2 + 10 * batch, 12 + 10 * batch):
                await job.send("s", f"k{i}", i)
            await yield_often()  # room for the next sends, if the job takes them
        await until_true(lambda: (inbox.queued(0), feed.qsize()) == (2, 10))
        assert len(gate.started) == 2  # and no call more: the full instance took nothing
        for i in range(42):
            gate.release(f"k{i}")
        await job.settle()
        assert feed.qsize() == 0
        result = await finish(job)
    assert [r.value for r in result.sink("out")] == [2 * i for i in range(42)]


def windowed(gate: Gate) -> sl.Topology:
    """Event-time source -> unordered map_async -> per-second counts (late records to 'late')."""
    topology = sl.Topology("windowed")
    source = topology.add_source("s", sl.QueueSource(), watermarks=sl.Watermarks())
    mapped = topology.map_async("enrich", gate, ordered=False).set_input(source)
    counts = topology.window_reduce("count", "count", window=sl.TimeWindow(1.0, time="event")).set_input(mapped)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    topology.add_sink("late", sl.CollectSink()).set_input(counts, out_port=sl.LATE)
    return topology


async def test_unordered_results_never_overtake_a_watermark_that_followed_their_record() -> None:
    """'a' (ts 0.5) is held while 'b' (ts 5.0, behind the watermark 0.5) returns: 'b' waits; no result is late."""
    gate = Gate({"a"})
    async with sl.start(windowed(gate)) as job:
        await job.send("s", "a", 1, 0.5)
        await gate.until(lambda: "a" in gate.started)
        await job.send("s", "b", 1, 5.0)
        await gate.until(lambda: "b" in gate.returned)
        gate.release("a")
        result = await finish(job)
    assert out(result.sink("out")) == [("a", 1, 0.999), ("b", 1, 5.999)]
    assert result.sink("late") == []
    assert result.statistics.late == 0


async def fails_on_b(record: sl.Record) -> tuple[str, int]:
    if record.key == "b":
        raise ValueError("no b")
    return record.key, record.value


async def test_fail_a_raising_call_stops_the_job_naming_node_and_key() -> None:
    """on_error='fail': the TaskError names the task, instance and record key, with the error."""
    message = "task 'enrich' instance 0 failed on record with key 'b': ValueError: no b"
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$") as caught:
        await run_all(enrich(fails_on_b), "abc")
    assert (caught.value.task, caught.value.key) == ("enrich", "b")


async def test_fail_a_call_past_its_timeout_stops_the_job_naming_node_and_key() -> None:
    """timeout=0.05 (real time): a call that never returns stops the job with a TimeoutError for its key."""
    gate = Gate({"slow"})
    message = (
        "task 'enrich' instance 0 failed on record with key 'slow': "
        "TimeoutError: the call took longer than timeout=0.05 seconds"
    )
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$"):
        await run_all(enrich(gate, timeout=0.05), ["slow"])


async def test_skip_dead_letters_the_failing_record_and_the_others_come_out() -> None:
    """on_error='skip': 'b' is a dead letter with its error; 'a' and 'c' come out in order."""
    async with sl.start(enrich(fails_on_b, on_error="skip")) as job:
        await send_all(job, "abc")
        result = await finish(job)
    assert [r.key for r in result.sink("out")] == ["a", "c"]
    assert [(d.task, d.record.key, d.error) for d in result.dead_letters] == [("enrich", "b", "ValueError: no b")]


class FailsOnce:
    """Raises on the first call for 'b', answers every later one."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, record: sl.Record) -> tuple[str, int]:
        self.calls.append(record.key)
        if record.key == "b" and self.calls.count("b") == 1:
            raise ValueError("once")
        return record.key, record.value


async def test_restart_calls_the_failed_record_again_and_each_result_comes_once() -> None:
    """on_error='restart': 'b' is called twice and every record's result comes out once, in order."""
    fn = FailsOnce()
    async with sl.start(enrich(fn, on_error="restart")) as job:
        await send_all(job, "abc")
        result = await finish(job)
    assert [r.key for r in result.sink("out")] == ["a", "b", "c"]
    assert sorted(fn.calls) == ["a", "b", "b", "c"]
    assert result.statistics.restarts == 1


class Crash(Exception):
    """Stops a job the hard way."""


async def checkpoint_then_crash(gate: Gate, checkpoints: Path) -> None:
    """'a', 'b' sent; once 'b' has answered, 'c' and 'd' and a checkpoint; then a crash."""
    async with sl.start(enrich(gate, concurrency=2), checkpoint_dir=checkpoints) as job:
        await send_all(job, "ab")
        await gate.until(lambda: "b" in gate.returned)
        await job.send("s", "c", 2)
        await job.send("s", "d", 3)
        await job.checkpoint()
        assert gate.started == ["a", "b", "c"]
        assert job._result().sink("out") == []
        raise Crash


async def test_a_checkpoint_with_calls_in_flight_and_answers_held_restores_exactly(tmp_path: Path) -> None:
    """In flight, answered-but-held and taken-uncalled records survive a crash; only unanswered ones are called anew."""
    gate = Gate({"a", "c"})
    with pytest.raises(Crash):
        await checkpoint_then_crash(gate, tmp_path)
    again = Gate(set())
    async with sl.start(enrich(again, concurrency=2), checkpoint_dir=tmp_path) as job:
        await job.send("s", "e", 4)
        result = await finish(job)
    assert sorted(again.started) == ["a", "c", "d", "e"]
    assert [(r.key, r.value) for r in result.sink("out")] == [("a", 0), ("b", 2), ("c", 4), ("d", 6), ("e", 8)]


async def test_settle_waits_for_calls_in_flight() -> None:
    """settle() returns only once every call has returned and its result reached the sink."""
    gate = Gate({"a", "b", "c"})
    async with sl.start(enrich(gate, ordered=False)) as job:
        await send_all(job, "abc")
        await gate.until(lambda: len(gate.started) == 3)
        settling = asyncio.create_task(job.settle())
        await yield_often()
        assert not settling.done()  # three calls are held: settle cannot be done, however long it ran
        for key in "abc":
            gate.release(key)
        await settling
        assert sorted(r.key for r in job._result().sink("out")) == ["a", "b", "c"]
        await finish(job)


async def tagged(record: sl.Record) -> tuple[str, tuple[str, int]] | None:
    """Module level, so forked processes have it: a little work in flight, every seventh record dropped."""
    await asyncio.sleep(0)
    return None if record.value % 7 == 0 else (record.key, (record.key, record.value))


def parallel(count: int = 400) -> sl.Topology:
    topology = sl.Topology("parallel-enrich")
    source = topology.add_source("s", [(f"u{i % 13}", i) for i in range(count)])
    mapped = topology.map_async("enrich", tagged, concurrency=8, parallelism=2)
    mapped.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(mapped)
    return topology


def by_key(records: list[sl.Record]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = {}
    for record in records:
        grouped.setdefault(record.key, []).append(tuple(record.value))
    return grouped


def test_with_two_processes_results_equal_the_in_process_run() -> None:
    """processes=2 gives the in-process result: every key's results, in that key's input order."""
    alone = sl.run(parallel()).sink("out")
    assert len(alone) == 400 - len(range(0, 400, 7))
    assert by_key(sl.run(parallel(), processes=2).sink("out")) == by_key(alone)


async def test_a_live_rescale_mid_stream_keeps_every_result_exactly_once() -> None:
    """2 -> 3 instances a third of the way in, 3 -> 1 at two thirds, calls in flight: each result once."""
    gate = Gate(set())
    topology = sl.Topology("rescaled")
    source = topology.add_source("s", sl.QueueSource())
    mapped = topology.map_async("enrich", gate, concurrency=4, parallelism=2)
    mapped.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(mapped)
    async with sl.start(topology) as job:
        for step, instances in ((0, 3), (1, 1), (2, None)):
            for i in range(step * 300, step * 300 + 300):
                await job.send("s", f"u{i % 17}", i)
            if instances is not None:
                await job.rescale("enrich", instances)
        result = await finish(job)
    assert job.reconfigurations == 2
    assert sorted(r.value for r in result.sink("out")) == [2 * i for i in range(900)]
    for key, values in by_key_values(result.sink("out")).items():
        assert values == sorted(values), key


def by_key_values(records: list[sl.Record]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for record in records:
        grouped.setdefault(record.key, []).append(record.value)
    return grouped


def test_map_async_refuses_a_concurrency_below_one() -> None:
    """concurrency=0 is a TopologyError naming the task."""
    topology = sl.Topology("bad")
    message = "task 'enrich': concurrency must be a whole number >= 1, got 0"
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        topology.map_async("enrich", fails_on_b, concurrency=0)


def test_map_async_refuses_to_run_inside_a_loop() -> None:
    """A map_async task on a cycle is a TopologyError naming it."""
    topology = sl.Topology("looped")
    source = topology.add_source("s", [("a", 1)])
    mapped = topology.map_async("enrich", fails_on_b).set_input(source)
    mapped.set_input(mapped)
    topology.set_max_iterations(3)
    with pytest.raises(sl.TopologyError, match=r"^task 'enrich': map_async cannot run inside a loop$"):
        topology.validate()


def keyed(fn: Any, parallelism: int) -> sl.Topology:
    """QueueSource 's' -> map_async 'enrich' (by SAME_KEY, concurrency 2) -> CollectSink 'out'."""
    topology = sl.Topology("keyed-enrichment")
    source = topology.add_source("s", sl.QueueSource())
    mapped = topology.map_async("enrich", fn, concurrency=2, parallelism=parallelism)
    mapped.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(mapped)
    return topology


async def checkpoint_alone_then_crash(gate: Gate, checkpoints: Path) -> None:
    """One instance: 'a' held, 'b' answered behind it, 'c' and 'd' taken at the barrier; a checkpoint, a crash."""
    async with sl.start(keyed(gate, 1), checkpoint_dir=checkpoints) as job:
        await send_all(job, "ab")
        await gate.until(lambda: "b" in gate.returned)
        await job.send("s", "c", 2)
        await job.send("s", "d", 3)
        await job.checkpoint()
        raise Crash


async def test_a_restore_with_more_instances_splits_the_stored_calls_by_key(tmp_path: Path) -> None:
    """Taken with 1 instance, restored with 2: each stored record goes to its key's instance, each result once."""
    with pytest.raises(Crash):
        await checkpoint_alone_then_crash(Gate({"a", "c"}), tmp_path)
    again = Gate(set())
    async with sl.start(keyed(again, 2), checkpoint_dir=tmp_path) as job:
        result = await finish(job)
    assert sorted(again.started) == ["a", "c", "d"]
    assert sorted((r.key, r.value) for r in result.sink("out")) == [("a", 0), ("b", 2), ("c", 4), ("d", 6)]


async def test_on_a_two_worker_cluster_map_async_gives_the_in_process_result() -> None:
    """A simulated 2-worker cluster runs the parallel job to the in-process result."""
    async with sl.start(parallel()) as job:
        expected = by_key((await job.wait()).sink("out"))
    async with SimulatedCluster(workers=2, checkpoint_interval=None) as cluster:
        outcome = await cluster.run(parallel(), job="enrich")
    assert outcome.state == "FINISHED", outcome.reason
    assert by_key(outcome.collected["out"]) == expected


def plain_double(record: sl.Record) -> tuple[Any, Any]:
    return record.key, 2 * record.value


async def async_double(record: sl.Record) -> tuple[Any, Any]:
    return record.key, 2 * record.value


def test_map_async_refuses_a_plain_function_when_the_topology_is_built() -> None:
    """A plain def is refused naming the task and the function, pointing to map."""
    topology = sl.Topology("bad")
    message = (
        "task 'enrich': fn must be an async def function (or a lambda returning an awaitable), "
        "got the plain function 'plain_double': use map for a plain one"
    )
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        topology.map_async("enrich", plain_double)


@pytest.mark.parametrize("on_error", ["fail", "skip", "restart"])
def test_a_lambda_that_returns_no_awaitable_fails_the_job_whatever_the_policy(on_error: str) -> None:
    """Told from a call's failure at the first record: a TopologyError naming the task, not a record's error."""
    topology = sl.Topology("bad")
    source = topology.add_source("in", [("a", 1), ("b", 2)])
    enrich = topology.map_async("enrich", lambda record: (record.key, record.value), on_error=on_error)
    topology.add_sink("out", sl.CollectSink()).set_input(enrich.set_input(source))
    message = (
        "task 'enrich': map_async's fn must be an async def function (or return an awaitable); "
        "fn(record) returned tuple"
    )
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        sl.run(topology)


def test_map_async_takes_what_returns_an_awaitable() -> None:
    """async def, a lambda returning a coroutine, a wrapper (functools.wraps) and a partial all run."""

    @functools.wraps(async_double)
    def wrapped(record: sl.Record) -> Any:
        return async_double(record)

    for fn in (async_double, lambda record: async_double(record), wrapped, functools.partial(async_double)):
        topology = sl.Topology("fine")
        source = topology.add_source("in", [("a", 1), ("b", 2)])
        doubled = topology.map_async("double", fn).set_input(source)
        topology.add_sink("out", sl.CollectSink()).set_input(doubled)
        assert [(r.key, r.value) for r in sl.run(topology).sink("out")] == [("a", 2), ("b", 4)]
