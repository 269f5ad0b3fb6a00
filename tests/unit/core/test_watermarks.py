"""Watermarks come from the sources: lateness is the same at every parallelism, inputs take the minimum."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

import streamlet as sl
from tests.conftest import pairs


class Collect(sl.Task):
    """Emits one record per window: key ``inputs.window``, value the window's values in arrival order."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, [record.value for record in inputs.get()])


def keyed_window_job(records: list[sl.Record], parallelism: int, **source: Any) -> sl.Topology:
    """records -> 'w' (TimeWindow(10, event), SAME_KEY, ``parallelism``) -> 'out', late port -> 'late'."""
    topology = sl.Topology("keyed")
    events = topology.add_source("in", records, **source)
    window = topology.add_task("w", Collect, parallelism=parallelism, window=sl.TimeWindow(10, time="event"))
    window.set_input(events, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(window)
    topology.add_sink("late", sl.CollectSink()).set_input(window, out_port=sl.LATE)
    return topology


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_which_records_are_late_does_not_depend_on_the_parallelism(parallelism: int) -> None:
    """The issue's case: a@100, b@5, c@7, d@8 in batches of one. The source's watermark is 100 after a,
    so b, c and d are late at parallelism 1, 2 and 3 alike (per-instance watermarks made it 3, 2 and 2)."""
    records = [sl.Record("a", "a", 100), sl.Record("b", "b", 5), sl.Record("c", "c", 7), sl.Record("d", "d", 8)]
    result = sl.run(keyed_window_job(records, parallelism), batch_size=1)
    assert sorted(r.key for r in result.sink("late")) == ["b", "c", "d"]
    assert (pairs(result.sink("out")), result.statistics.late) == ([((100, 110), ["a"])], 3)


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_out_of_orderness_bound_keeps_records_on_time(parallelism: int) -> None:
    """Watermarks(out_of_orderness=95): the watermark after a@100 is 5, so b, c, d are on time in [0, 10)."""
    records = [sl.Record("a", "a", 100), sl.Record("b", "b", 5), sl.Record("c", "c", 7), sl.Record("d", "d", 8)]
    topology = keyed_window_job(records, parallelism, watermarks=sl.Watermarks(out_of_orderness=95))
    result = sl.run(topology, batch_size=1)
    windows: dict[Any, list[str]] = {}  # each instance has its own windows: put them together by bounds
    for bounds, values in pairs(result.sink("out")):
        windows.setdefault(bounds, []).extend(values)
    assert (sorted((k, sorted(v)) for k, v in windows.items()), result.sink("late")) == (
        [((0, 10), ["b", "c", "d"]), ((100, 110), ["a"])],
        [],
    )


def test_a_two_input_task_takes_the_minimum_of_its_inputs_watermarks() -> None:
    """Left a@0, b@15 and right c@5: the task's watermark is the minimum, so c is on time and joins a."""
    topology = sl.Topology("join")
    left = topology.add_source("left", [sl.Record("k", "a", 0), sl.Record("k", "b", 15)])
    right = topology.add_source("right", [sl.Record("k", "c", 5)])
    join = topology.add_task("join", TwoPorts, window=sl.TimeWindow(10, time="event"))
    join.set_input(left, in_port=0).set_input(right, in_port=1)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    topology.add_sink("late", sl.CollectSink()).set_input(join, out_port=sl.LATE)
    result = sl.run(topology, batch_size=1)
    assert (pairs(result.sink("out")), result.sink("late")) == (
        [((0, 10), (["a"], ["c"])), ((10, 20), (["b"], []))],
        [],
    )


class TwoPorts(sl.Task):
    """Two inputs: emits each window's values per port."""

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_inputs(2)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, ([r.value for r in inputs.get(0)], [r.value for r in inputs.get(1)]))


def test_a_watermark_function_sets_punctuated_watermarks_and_never_goes_back() -> None:
    """Watermarks(fn=...): a record saying 20 closes [0, 10), so 5 is late; a later 3 is ignored (and
    logged once), so 25 stays in its own window and nothing else is late."""
    records = [
        sl.Record("k", {"v": 1}, 1), sl.Record("k", {"v": 2, "wm": 20}, 2), sl.Record("k", {"v": 5}, 5),
        sl.Record("k", {"v": 6, "wm": 3}, 25), sl.Record("k", {"v": 7, "wm": 1}, 26),
    ]  # fmt: skip
    marks = sl.Watermarks(fn=lambda record: record.value.get("wm"))
    with structlog.testing.capture_logs() as logged:
        result = sl.run(keyed_window_job(records, 1, watermarks=marks), batch_size=1)
    values = [(window, [v["v"] for v in batch]) for window, batch in pairs(result.sink("out"))]
    assert (values, [r.value["v"] for r in result.sink("late")]) == ([((0, 10), [1, 2]), ((20, 30), [6, 7])], [5])
    assert [entry["event"] for entry in logged if entry["log_level"] == "warning"] == ["watermark went back: ignored"]


class ProgressSource(sl.Source):
    """Two 'partitions' read in turn; the reader's event-time progress is the minimum over them."""

    def __init__(self, partitions: list[list[float]]) -> None:
        self.partitions = partitions

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return ProgressReader(self.partitions)


class ProgressReader(sl.SourceReader):
    def __init__(self, partitions: list[list[float]]) -> None:
        self.pending = [list(p) for p in partitions]
        self.top = [float("-inf")] * len(partitions)
        self.turn = 0

    async def read(self, max_records: int) -> list[sl.Record] | None:
        for _ in range(len(self.pending)):
            partition, self.turn = self.turn, (self.turn + 1) % len(self.pending)
            if self.pending[partition]:
                ts = self.pending[partition].pop(0)
                self.top[partition] = max(self.top[partition], ts)
                return [sl.Record(f"p{partition}", ts, ts)]
        return None

    def event_time_progress(self) -> float | None:
        return min(self.top)


def test_a_reader_that_tracks_its_partitions_sets_the_watermark() -> None:
    """Partition 0 is at 50 while partition 1 trails at 1..8: the watermark is partition 1's, so none of its
    records is late (the largest event time read, 50, would have made them all late)."""
    topology = sl.Topology("partitions")
    source = topology.add_source("in", ProgressSource([[50, 51, 52], [1, 4, 8]]))
    window = topology.add_task("w", Collect, window=sl.TimeWindow(10, time="event")).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(window)
    topology.add_sink("late", sl.CollectSink()).set_input(window, out_port=sl.LATE)
    result = sl.run(topology, batch_size=1)
    assert (pairs(result.sink("out")), result.sink("late")) == ([((0, 10), [1, 4, 8]), ((50, 60), [50, 51, 52])], [])


async def test_an_idle_source_holds_nobody_back(manual_clock: sl.ManualClock) -> None:
    """'quiet' reads nothing; after idle_after=5 s of the clock it declares itself idle, and the window
    [0, 10) fires on 'busy''s watermark alone (until then the minimum over both inputs held it)."""
    emitted: list[sl.Record] = []
    arrived = asyncio.Event()

    def deliver(record: sl.Record) -> None:
        emitted.append(record)
        arrived.set()

    topology = sl.Topology("idle")
    busy = topology.add_source("busy", sl.QueueSource())
    quiet = topology.add_source("quiet", sl.QueueSource(), watermarks=sl.Watermarks(idle_after=5))
    window = topology.add_task("w", Collect, window=sl.TimeWindow(10, time="event"))
    window.set_input(busy).set_input(quiet)
    topology.add_sink("out", sl.CallbackSink(deliver)).set_input(window)
    async with sl.start(topology, clock=manual_clock) as job:
        await job.send("busy", "k", "a", ts=1)
        await job.send("busy", "k", "b", ts=12)
        await job.settle()
        assert emitted == []
        manual_clock.advance(5)
        await asyncio.wait_for(arrived.wait(), timeout=10)
        assert emitted == [sl.Record((0, 10), ["a"], 9.999)]
        await job.send("quiet", "k", "c", ts=13)  # it reads again: it holds the watermark back again
        await job.send("busy", "k", "d", ts=25)
        await job.settle()
        assert emitted == [sl.Record((0, 10), ["a"], 9.999)]
        await job.close_source("busy")
        await job.close_source("quiet")
        await job.wait()
    assert [(r.key, r.value) for r in emitted] == [((0, 10), ["a"]), ((10, 20), ["b", "c"]), ((20, 30), ["d"])]


def test_watermarks_are_validated_naming_the_source() -> None:
    """A negative bound, a non-positive idle time or a wrong type: TopologyError naming the source."""
    topology = sl.Topology("bad")
    cases = [
        (sl.Watermarks(out_of_orderness=-1), "source 's': watermarks out_of_orderness must be a number >= 0, got -1"),
        (sl.Watermarks(idle_after=0), "source 's': watermarks idle_after must be > 0, got 0"),
        (5, "source 's': watermarks must be a Watermarks, got 5"),
    ]
    for marks, message in cases:
        with pytest.raises(sl.TopologyError) as caught:
            topology.add_source("s", [1], watermarks=marks)  # type: ignore[arg-type]
        assert str(caught.value) == message
