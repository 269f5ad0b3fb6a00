"""Exact window arithmetic: time in whole ticks of ``time_unit``, bounds that hold their records, results
stamped with the window's last tick so cascaded windows line up."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamlet as sl
from streamlet.core.model.windows import Ticks
from tests.spec.budget import capped


class Contents(sl.Task):
    """Emits each window's bounds with the event times of its records."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, sorted(record.ts for record in inputs.get()))


def windows_of(stamps: list[float], window: sl.TimeWindow) -> list[tuple[tuple[float, float], list[float]]]:
    """``(bounds, event times)`` of every window ``stamps`` fall in (one key, in order)."""
    topology = sl.Topology("ticks")
    source = topology.add_source("s", [sl.Record("k", index, ts) for index, ts in enumerate(stamps)])
    contents = topology.add_task("contents", Contents, window=window).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(contents)
    return sorted((record.key, record.value) for record in sl.run(topology).sink("out"))


def test_sub_second_tumbling_windows_hold_their_records_and_report_exact_bounds() -> None:
    """0.3 and 0.35 share (0.3, 0.4); 0.45 and 0.5 are apart: (0.4, 0.5) and (0.5, 0.6)."""
    assert windows_of([0.3, 0.35, 0.45, 0.5], sl.TimeWindow(0.1, time="event")) == [
        ((0.3, 0.4), [0.3, 0.35]),
        ((0.4, 0.5), [0.45]),
        ((0.5, 0.6), [0.5]),
    ]


def test_sliding_windows_use_the_same_bounds_as_tumbling_ones() -> None:
    """A sliding window's bounds come from the same tick arithmetic: 0.35 is in (0.2, 0.4) and (0.3, 0.5)."""
    assert windows_of([0.35], sl.TimeWindow(0.2, slide=0.1, time="event")) == [
        ((0.2, 0.4), [0.35]),
        ((0.3, 0.5), [0.35]),
    ]


def test_a_size_that_is_not_a_whole_number_of_slides_puts_each_record_in_its_own_windows() -> None:
    """Size 5 ms, slide 2 ms: 0 ms is in (-4, 1), (-2, 3) and (0, 5); 1 ms only in the last two."""
    window = sl.TimeWindow(0.005, slide=0.002, time="event")
    assert windows_of([0.0, 0.001], window) == [
        ((-0.004, 0.001), [0.0]),
        ((-0.002, 0.003), [0.0, 0.001]),
        ((0.0, 0.005), [0.0, 0.001]),
    ]


def test_processing_time_bounds_are_exact_too() -> None:
    """Under a manual clock at 0.35, a 0.1 s processing-time window is (0.3, 0.4)."""
    topology = sl.Topology("processing")
    source = topology.add_source("s", [("k", 1)])
    contents = topology.add_task("contents", Contents, window=sl.TimeWindow(0.1)).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(contents)
    [record] = sl.run(topology, clock=sl.ManualClock(start=0.35)).sink("out")
    assert (record.key, record.value) == ((0.3, 0.4), [0.35])


def test_cascaded_windows_line_up() -> None:
    """Per-second sums fed into 3 s windows give one 3 per window: each result carries its window's last tick."""
    topology = sl.Topology("cascade")
    seconds = topology.add_source("s", [sl.Record("k", 1, second + 0.5) for second in range(9)])
    per_second = topology.window_reduce("per-second", "sum", window=sl.TimeWindow(1, time="event"))
    per_three = topology.window_reduce("per-three", "sum", window=sl.TimeWindow(3, time="event"))
    per_second.set_input(seconds)
    per_three.set_input(per_second)
    topology.add_sink("out", sl.CollectSink()).set_input(per_three)
    result = sl.run(topology)
    assert [(r.window, r.value, r.ts) for r in result.sink("out")] == [
        ((0.0, 3.0), 3, 2.999), ((3.0, 6.0), 3, 5.999), ((6.0, 9.0), 3, 8.999),
    ]  # fmt: skip
    assert result.statistics.late == 0


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (sl.TimeWindow(0.0015), "window size 0.0015 is not a whole number of ticks of time_unit 0.001 s"),
        (sl.TimeWindow(1, slide=0.2505), "window slide 0.2505 is not a whole number of ticks of time_unit 0.001 s"),
        (sl.TimeWindow(1, time="event", allowed_lateness=0.0001),
         "window allowed_lateness 0.0001 is not a whole number of ticks of time_unit 0.001 s"),
        (sl.TimeWindow(1, time_unit=0), "window time_unit must be > 0, got 0"),
    ],
)  # fmt: skip
def test_a_size_that_is_not_whole_ticks_is_refused(window: sl.TimeWindow, message: str) -> None:
    with pytest.raises(sl.TopologyError) as refused:
        sl.Topology("t").window_reduce("w", "sum", window=window)
    assert str(refused.value) == f"task 'w': {message}"


def test_a_coarser_time_unit_counts_in_its_own_ticks() -> None:
    """With time_unit=1 (seconds), a 2 s window stamps its results one second before its end."""
    topology = sl.Topology("coarse")
    source = topology.add_source("s", [sl.Record("k", 1, 0.4), sl.Record("k", 1, 1.4)])
    summed = topology.window_reduce("sum", "sum", window=sl.TimeWindow(2, time="event", time_unit=1))
    topology.add_sink("out", sl.CollectSink()).set_input(summed.set_input(source))
    assert [(r.window, r.value, r.ts) for r in sl.run(topology).sink("out")] == [((0.0, 2.0), 2, 1.0)]


def test_ticks_round_trip_the_bounds_users_write() -> None:
    ticks = Ticks(0.001)
    assert [ticks.seconds(ticks.of(x)) for x in (0.1, 0.3, 0.35, 1e6 + 0.001)] == [0.1, 0.3, 0.35, 1e6 + 0.001]


@settings(max_examples=capped(200), deadline=None)
@given(
    size_ms=st.integers(min_value=1, max_value=500),
    slide_divisor=st.sampled_from([1, 2, 3, 5]),
    stamps_ms=st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=40),
)
def test_every_record_lies_inside_the_bounds_reported_for_its_window(
    size_ms: int, slide_divisor: int, stamps_ms: list[int]
) -> None:
    """Whatever the size and slide (whole milliseconds) and the times (sorted, so none is late), each window's
    records satisfy start <= ts < end, and every record is in some window."""
    slide_ms = max(1, size_ms // slide_divisor)
    stamps = sorted(ms / 1000 for ms in stamps_ms)
    window = sl.TimeWindow(size_ms / 1000, slide=slide_ms / 1000, time="event")
    seen: dict[float, int] = {}
    for (start, end), times in windows_of(stamps, window):
        assert all(start <= ts < end for ts in times), (start, end, times)
        for ts in times:
            seen[ts] = seen.get(ts, 0) + 1
    assert set(seen) == set(stamps)


def test_window_bounds_keep_the_type_of_the_timestamps() -> None:
    """Int timestamps give int window bounds (whole seconds); float timestamps float ones: a sink storing
    window_start/window_end keeps the user's type."""

    def bounds(stamps: list[float]) -> list[tuple[object, object, type]]:
        topology = sl.Topology("typed")
        source = topology.add_source("e", [sl.Record("a", 1, ts) for ts in stamps])
        summed = topology.window_reduce("sum", "sum", window=sl.TimeWindow(60, time="event")).set_input(source)
        topology.add_sink("out", sl.CollectSink()).set_input(summed)
        return [(r.window_start, r.window_end, type(r.window_start)) for r in sl.run(topology).sink("out")]

    assert bounds([5, 65]) == [(0, 60, int), (60, 120, int)]
    assert bounds([5.5, 65.0]) == [(0.0, 60.0, float), (60.0, 120.0, float)]


def test_session_bounds_keep_the_type_of_the_timestamps() -> None:
    """Event-time sessions too: int timestamps give int bounds where they are whole seconds."""

    def bounds(stamps: list[float]) -> list[tuple[object, object, type]]:
        topology = sl.Topology("typed-sessions")
        source = topology.add_source("e", [sl.Record("a", 1, ts) for ts in stamps])
        window = sl.SessionWindow(5, time="event")
        summed = topology.window_reduce("sum", "sum", window=window).set_input(source)
        topology.add_sink("out", sl.CollectSink()).set_input(summed)
        return [(r.window_start, r.window_end, type(r.window_start)) for r in sl.run(topology).sink("out")]

    assert bounds([1, 3, 20]) == [(1, 8, int), (20, 25, int)]
    assert bounds([1.5, 20.0]) == [(1.5, 6.5, float), (20.0, 25.0, float)]
