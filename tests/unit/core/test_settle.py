"""job.settle(): waits until every record sent so far has been processed, without sleeps."""

from __future__ import annotations

import pytest

import streamlet as sl
from streamlet.core.runtime.channel import LocalChannel
from streamlet.core.runtime.plan import Placement
from tests.conftest import pairs
from tests.unit.core.test_cycles import Halve


def doubling(seen: list[sl.Record]) -> sl.Topology:
    """QueueSource 'in' -> map doubling values -> callback sink appending to ``seen``."""
    topology = sl.Topology("doubling")
    numbers = topology.add_source("in", sl.QueueSource())
    twice = topology.map("twice", lambda r: (r.key, r.value * 2)).set_input(numbers)
    topology.add_sink("out", seen.append).set_input(twice)
    return topology


def per_minute(seen: list[sl.Record]) -> sl.Topology:
    """QueueSource 'in' -> processing-time count per 60 s window -> callback sink appending to ``seen``."""
    topology = sl.Topology("per-minute")
    requests = topology.add_source("in", sl.QueueSource())
    counted = topology.window_reduce("count", "count", window=sl.TimeWindow(60.0)).set_input(requests)
    topology.add_sink("out", seen.append).set_input(counted)
    return topology


async def test_settle_after_sends_returns_with_every_record_in_the_sink() -> None:
    """Every record sent before settle() has reached the sink when it returns."""
    seen: list[sl.Record] = []
    async with sl.start(doubling(seen), batch_size=4, channel_capacity=1) as job:
        for index in range(50):
            await job.send("in", f"k{index}", index)
        await job.settle()
        assert pairs(seen) == [(f"k{i}", i * 2) for i in range(50)]


async def test_settle_then_advance_then_settle_shows_a_time_window_result(manual_clock: sl.ManualClock) -> None:
    """With a ManualClock: send, settle, advance past the window's end, settle: the window's count is out."""
    seen: list[sl.Record] = []
    manual_clock.advance(125)
    async with sl.start(per_minute(seen), clock=manual_clock) as job:
        await job.send("in", "user42", "a")
        await job.send("in", "user42", "b")
        await job.settle()
        manual_clock.advance(60)
        await job.settle()
        assert [(r.key, r.value, r.window, r.ts) for r in seen] == [("user42", 2, (120.0, 180.0), 179.999)]


async def test_settle_does_not_close_open_windows(manual_clock: sl.ManualClock) -> None:
    """Records settled into a window that the clock has not passed yet stay in it: nothing comes out."""
    seen: list[sl.Record] = []
    async with sl.start(per_minute(seen), clock=manual_clock) as job:
        await job.send("in", "user42", "a")
        await job.settle()
        assert seen == []
        await job.close_source("in")
        await job.wait()
    assert [(r.key, r.value, r.window) for r in seen] == [("user42", 1, (0.0, 60.0))]


async def test_settle_waits_for_records_going_round_a_loop() -> None:
    """In a halving loop every number sent has left the loop, with its iteration count, when settle returns."""
    seen: list[sl.Record] = []
    topology = sl.Topology("halving")
    numbers = topology.add_source("numbers", sl.QueueSource())
    halve = topology.add_task("halve", Halve)
    halve.set_input(numbers).set_input(halve, out_port=0, partitioning=sl.SAME_KEY)
    topology.add_sink("done", seen.append).set_input(halve, out_port=1)
    topology.set_max_iterations(20)
    async with sl.start(topology, batch_size=2, channel_capacity=1) as job:
        for number in (1, 2, 8, 1024):
            await job.send("numbers", str(number), number)
        await job.settle()
        assert sorted(pairs(seen)) == [("1", 0), ("1024", 10), ("2", 1), ("8", 3)]


async def test_settle_on_an_idle_job_returns_at_once() -> None:
    """A job with nothing sent is idle: settle() returns without anything else happening."""
    seen: list[sl.Record] = []
    async with sl.start(doubling(seen)) as job:
        await job.settle()
        await job.settle()
        assert job.statistics().nodes["out"].records_in == 0


async def test_settle_raises_the_error_that_stopped_the_job() -> None:
    """A job stopped by a failing sink makes settle() raise that error instead of waiting or returning."""
    topology = sl.Topology("failing")
    numbers = topology.add_source("in", sl.QueueSource())
    topology.add_sink("out", lambda r: 1 / 0).set_input(numbers)
    steps: list[str] = []
    failure = r"^sink 'out' instance 0 failed writing the record with key 'k': ZeroDivisionError"
    with pytest.raises(sl.SinkError, match=failure):
        await send_then_settle(topology, steps)
    assert steps == ["sent"]


async def send_then_settle(topology: sl.Topology, steps: list[str]) -> None:
    """Send one record to 'in', settle, and note each step that returned."""
    async with sl.start(topology) as job:
        await job.send("in", "k", 1)
        steps.append("sent")
        await job.settle()
        steps.append("settled")


async def test_settle_refuses_a_placed_job() -> None:
    """A job split between processes cannot see every inbox: settle() says it works in-process only."""
    everything_here = Placement(job="doubling", local=lambda node, index: True, remote=None, expose=None)  # type: ignore[arg-type]
    job = sl.Job(doubling([]), channel_factory=LocalChannel, placement=everything_here)
    with pytest.raises(sl.JobError, match=r"settle\(\) works for in-process jobs"):
        await job.settle()
