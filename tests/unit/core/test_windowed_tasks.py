"""Windows in running topologies: execute per window, windowed sources, late output, manual-clock time."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.model.clock import Timer
from tests.conftest import as_listed, pairs, values

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


class Collect(sl.Task):
    """Emits one record per window: key ``inputs.window``, value the window's values."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, values(inputs.get()))


class CollectThenDone(Collect):
    """Collect, and emit ``("done", None)`` from finish."""

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit("done", None)


def at(*times: float) -> list[sl.Record]:
    """Records whose value is their event time ``ts``."""
    return [sl.Record("k", ts, ts) for ts in times]


def windowed_task(items: list[Any], window: sl.WindowSpec, task: Any = Collect) -> sl.Topology:
    """source 'in' -> task 'w' with ``window`` -> CollectSink 'out'."""
    topology = sl.Topology("windows")
    source = topology.add_source("in", items)
    node = topology.add_task("w", task, window=window).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    return topology


THREES = [((0, 3), [0, 1, 2]), ((3, 6), [3, 4, 5]), ((6, 8), [6, 7])]


def test_count_window_task_executes_once_per_window() -> None:
    """window=CountWindow(3) over 8 records: execute sees (0,3), (3,6), then the partial (6,8)."""
    result = sl.run(windowed_task(list(range(8)), sl.CountWindow(3)))
    assert pairs(result.sink("out")) == THREES


def test_windowed_source_windows_its_consumer() -> None:
    """add_source(..., window=CountWindow(3)) gives the consuming task the same windows."""
    topology = sl.Topology("windows")
    source = topology.add_source("in", list(range(8)), window=sl.CountWindow(3))
    node = topology.add_task("w", Collect).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    assert pairs(sl.run(topology).sink("out")) == THREES


OUT_OF_ORDER = at(1, 7, 3, 12, 4, 18, 25, 11, 9, 31)


def event_topology(late: list[sl.Record]) -> sl.Topology:
    """Event-time TimeWindow(10) task 'w' -> 'out'; its LATE port -> 'late'; on_late appends to ``late``."""
    topology = windowed_task(OUT_OF_ORDER, sl.TimeWindow(10, time="event", on_late=late.append))
    topology.add_sink("late", sl.CollectSink()).set_input("w", out_port=sl.LATE)
    return topology


def test_event_time_window_contents_and_timestamps() -> None:
    """Out-of-order records land in the windows of their ts; each output's ts is its window's last tick.

    Batches of one record: the source's watermark follows every record (bound 0), so 4, 11 and 9 are late.
    """
    result = sl.run(event_topology([]), batch_size=1)
    assert result.sink("out") == [
        sl.Record((0, 10), [1, 7, 3], 9.999),
        sl.Record((10, 20), [12, 18], 19.999),
        sl.Record((20, 30), [25], 29.999),
        sl.Record((30, 40), [31], 39.999),
    ]


def test_late_records_reach_the_late_port_on_late_and_statistics() -> None:
    """Records behind the watermark go to the LATE sink and on_late, and are counted in statistics.late."""
    late: list[sl.Record] = []
    result = sl.run(event_topology(late), batch_size=1)
    assert result.sink("late") == at(4, 11, 9)
    assert late == at(4, 11, 9)
    assert result.statistics.late == 3


def test_end_of_stream_closes_open_windows_before_finish() -> None:
    """Windows the watermark never passed run at end of stream, before finish()."""
    result = sl.run(windowed_task(at(1, 2, 13), sl.TimeWindow(10, time="event"), CollectThenDone))
    assert pairs(result.sink("out")) == [((0, 10), [1, 2]), ((10, 20), [13]), ("done", None)]


def queue_topology(window: sl.WindowSpec, emitted: list[sl.Record], arrived: asyncio.Event) -> sl.Topology:
    """QueueSource 'in' -> task 'w' with ``window`` -> a CallbackSink that records and sets ``arrived``."""

    def deliver(record: sl.Record) -> None:
        emitted.append(record)
        arrived.set()

    topology = sl.Topology("clocked")
    source = topology.add_source("in", sl.QueueSource())
    node = topology.add_task("w", Collect, window=window).set_input(source)
    topology.add_sink("out", sl.CallbackSink(deliver)).set_input(node)
    return topology


def first_timer(clock: sl.ManualClock, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set when something first schedules a timer on ``clock``.

    Only task 'w' uses the clock, and only once its window holds records: the
    event says the records sent so far (one batch) are in the window.
    """
    scheduled = asyncio.Event()
    call_at = clock.call_at

    def watched(when: float, callback: Callable[[], None]) -> Timer:
        scheduled.set()
        return call_at(when, callback)

    monkeypatch.setattr(clock, "call_at", watched)
    return scheduled


async def test_processing_time_window_closes_when_the_manual_clock_passes_its_end(
    manual_clock: sl.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TimeWindow(10) driven by a ManualClock: advancing to 10 runs the window [0,10)."""
    emitted: list[sl.Record] = []
    arrived = asyncio.Event()
    scheduled = first_timer(manual_clock, monkeypatch)
    async with sl.start(queue_topology(sl.TimeWindow(10), emitted, arrived), clock=manual_clock) as job:
        for value in ("a", "b", "c"):
            await job.send("in", "k", value)
        await asyncio.wait_for(scheduled.wait(), timeout=10)
        assert emitted == []
        manual_clock.advance(10)
        await asyncio.wait_for(arrived.wait(), timeout=10)
        assert emitted == [sl.Record((0, 10), ["a", "b", "c"], 9.999)]


async def test_count_or_time_window_closes_by_time_on_the_manual_clock(
    manual_clock: sl.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CountOrTimeWindow(10, 5) with two records: advancing 5 s closes the window (0, 5)."""
    emitted: list[sl.Record] = []
    arrived = asyncio.Event()
    scheduled = first_timer(manual_clock, monkeypatch)
    async with sl.start(queue_topology(sl.CountOrTimeWindow(10, 5), emitted, arrived), clock=manual_clock) as job:
        await job.send("in", "k", "a")
        await job.send("in", "k", "b")
        await asyncio.wait_for(scheduled.wait(), timeout=10)
        manual_clock.advance(5)
        await asyncio.wait_for(arrived.wait(), timeout=10)
        assert emitted == [sl.Record((0.0, 5.0), ["a", "b"], 0.0)]


def rejects(message: str) -> pytest.RaisesExc[sl.TopologyError]:
    """Expect a TopologyError whose message is exactly ``message``."""
    return pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$")


def test_windowed_source_feeding_a_sink_is_rejected() -> None:
    """Windows are applied by tasks: a windowed source straight into a sink is an error."""
    topology = sl.Topology("t")
    source = topology.add_source("in", [1], window=sl.CountWindow(3))
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    with rejects("sink 'out' input port 0: windowed source 'in' feeds a sink directly; windows are applied by tasks"):
        topology.validate()


def test_task_with_own_window_fed_by_windowed_source_is_rejected() -> None:
    """A task cannot have a window of its own and a windowed source as input."""
    topology = sl.Topology("t")
    source = topology.add_source("in", [1], window=sl.CountWindow(3))
    topology.add_task("w", Collect, window=sl.CountWindow(2)).set_input(source)
    with rejects("task 'w' input port 0 is fed by windowed source 'in', but the task has a window of its own"):
        topology.validate()


class EmitBoth(Collect):
    """Collect, with one record through ``emit`` and one through ``emit_all``; and one more from finish."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit("one", len(inputs.get()))
        outputs.emit_all([("all", len(inputs.get()))])

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit("done", None)


def bounds(records: list[sl.Record]) -> list[tuple[Any, Any, Any, Any]]:
    """``(key, value, window_start, window_end)`` of every record."""
    return [(r.key, r.value, r.window_start, r.window_end) for r in records]


def test_records_emitted_in_a_window_carry_its_bounds() -> None:
    """emit and emit_all inside a window make WindowRecords; emit from finish has no bounds."""
    result = sl.run(windowed_task(at(0.5, 1.5, 2.5), sl.TimeWindow(2.0, time="event"), EmitBoth))
    assert bounds(result.sink("out")) == [
        ("one", 2, 0.0, 2.0),
        ("all", 2, 0.0, 2.0),
        ("one", 1, 2.0, 4.0),
        ("all", 1, 2.0, 4.0),
        ("done", None, None, None),
    ]


def test_window_reduce_results_carry_their_window_bounds(each_state_backend: str) -> None:
    """window_reduce over event-time windows: each (key, sum) knows its window's start and end (on RocksDB a
    window's keys come in the order of its layout)."""
    topology = sl.Topology("sums")
    source = topology.add_source("in", [sl.Record("a", 1, 0.5), sl.Record("b", 2, 1.0), sl.Record("a", 3, 2.5)])
    node = topology.window_reduce("sum", "sum", window=sl.TimeWindow(2.0, time="event")).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    expected = [("a", 1, 0.0, 2.0), ("b", 2, 0.0, 2.0), ("a", 3, 2.0, 4.0)]
    assert as_listed(bounds(sl.run(topology).sink("out")), each_state_backend) == as_listed(
        expected, each_state_backend
    )


def test_records_of_tasks_without_windows_have_no_bounds() -> None:
    """A plain task's records read None for window_start and window_end."""
    topology = sl.Topology("plain")
    source = topology.add_source("in", [("a", 1)])
    node = topology.map("m", lambda r: (r.key, r.value)).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    assert bounds(sl.run(topology).sink("out")) == [("a", 1, None, None)]


class CollectAndCount(Collect):
    """Two outputs: each window's values on port 0, how many there were on port 1."""

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_outputs(2)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, values(inputs.get()), port=0)
        outputs.emit(inputs.window, len(inputs.get()), port=1)


def test_late_port_comes_after_the_declared_output_ports() -> None:
    """A task declaring 2 outputs has ports 0, 1 and LATE, each reaching only the sink wired to it."""
    topology = sl.Topology("ports")
    source = topology.add_source("in", at(1, 12, 4))
    node = topology.add_task("w", CollectAndCount, window=sl.TimeWindow(10, time="event")).set_input(source)
    for name, port in (("values", 0), ("counts", 1), ("late", sl.LATE)):
        topology.add_sink(name, sl.CollectSink()).set_input(node, out_port=port)
    result = sl.run(topology, batch_size=1)
    assert (pairs(result.sink("values")), pairs(result.sink("counts")), result.sink("late")) == (
        [((0, 10), [1]), ((10, 20), [12])],
        [((0, 10), 1), ((10, 20), 1)],
        at(4),
    )


def test_late_port_of_a_source_is_rejected() -> None:
    """Sources have no late port: out_port=LATE from a source fails validation naming both nodes."""
    topology = sl.Topology("t")
    source = topology.add_source("in", [1], window=sl.TimeWindow(10, time="event"))
    node = topology.add_task("w", Collect).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    topology.add_sink("late", sl.CollectSink()).set_input(source, out_port=sl.LATE)
    with rejects("source 'in' has 1 output port but output port -1 was connected to 'late'"):
        topology.validate()


def test_unconnected_late_port_drops_late_records_counting_them_as_late_and_discarded() -> None:
    """With nothing on the LATE port, late records still reach on_late, then are dropped and counted twice."""
    late: list[sl.Record] = []
    result = sl.run(windowed_task(OUT_OF_ORDER, sl.TimeWindow(10, time="event", on_late=late.append)), batch_size=1)
    assert (late, result.statistics.late, result.statistics.discarded) == (at(4, 11, 9), 3, 3)


class PortAndWindow(sl.Task):
    """Two inputs; emits ``(port that woke it, inputs.window)`` and the values of each port."""

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_inputs(2)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit((inputs.port, inputs.window), [values(inputs.get(0)), values(inputs.get(1))])


def two_inputs(first: sl.NodeHandle | str, second: sl.NodeHandle | str, topology: sl.Topology, **options: Any) -> None:
    """Task 'w' (PortAndWindow, ``options``) fed by ``first`` on port 0 and ``second`` on port 1 -> sink 'out'."""
    node = topology.add_task("w", PortAndWindow, **options).set_input(first, in_port=0).set_input(second, in_port=1)
    topology.add_sink("out", sl.CollectSink()).set_input(node)


def test_own_window_windows_every_input_port() -> None:
    """add_task(window=...) on a 2-input task: one window holds the records of both ports, per port."""
    topology = sl.Topology("t")
    two_inputs(topology.add_source("a", at(1, 2)), topology.add_source("b", at(3)), topology, window=sl.CountWindow(3))
    assert pairs(sl.run(topology).sink("out")) == [((None, (0, 3)), [[1, 2], [3]])]


def test_windowed_source_windows_only_the_ports_it_feeds() -> None:
    """A windowed source on port 0 and a plain one on port 1: port 1's batches reach execute unwindowed."""
    topology = sl.Topology("t")
    windowed = topology.add_source("a", at(1, 2), window=sl.TimeWindow(10, time="event"))
    two_inputs(windowed, topology.add_source("b", at(30)), topology)
    assert sorted(pairs(sl.run(topology).sink("out")), key=repr) == [
        ((0, (0, 10)), [[1, 2], []]),
        ((1, None), [[], [30]]),
    ]


class EventTimes(sl.Task):
    """Emits one record per window: key ``inputs.window``, value the ``ts`` of each of its records."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, [record.ts for record in inputs.get()])


def test_event_time_window_places_a_record_without_ts_at_the_job_clock_time() -> None:
    """A Record with ts None lands in the window of clock.now() (1000: [960, 1020)) and keeps ts None."""
    topology = windowed_task([sl.Record("k", "no ts")], sl.TimeWindow(60, time="event"), EventTimes)
    assert pairs(sl.run(topology, clock=sl.ManualClock(start=1000.0)).sink("out")) == [((960, 1020), [None])]


def test_a_record_without_ts_does_not_move_the_watermark() -> None:
    """Only the sources' watermarks move event time: after a ts-less record placed at clock 1000, a record
    with event time 30 (one batch later) is still on time."""
    topology = windowed_task([sl.Record("k", "no ts"), *at(30)], sl.TimeWindow(60, time="event"))
    topology.add_sink("late", sl.CollectSink()).set_input("w", out_port=sl.LATE)
    result = sl.run(topology, clock=sl.ManualClock(start=1000.0), batch_size=1)
    assert (pairs(result.sink("out")), result.sink("late")) == ([((0, 60), [30]), ((960, 1020), ["no ts"])], [])
