"""Window logic driven directly: boundaries, time kinds, lateness, idle timeout, snapshots, spec validation."""

from __future__ import annotations

import re
from typing import Any

import msgpack
import pytest

import streamlet as sl
from streamlet.core.windows.build import logic_for
from streamlet.core.windows.fold import ClosedWindow, WindowLogic
from tests.conftest import values
from tests.support.elements import el


def numbers(*items: int) -> list[Any]:
    """Records whose value is the item, without an event time."""
    return [el("k", item) for item in items]


def at(*times: float) -> list[Any]:
    """Records whose value is their event time ``ts``."""
    return [el("k", ts, ts) for ts in times]


def spans(windows: list[ClosedWindow]) -> list[tuple[float, float, list[Any]]]:
    """``(start, end, values)`` of every window."""
    return [(window.start, window.end, values(window.all_records())) for window in windows]


def add(logic: WindowLogic, batch: list[Any], now: float = 0.0) -> tuple[list[Any], list[Any]]:
    """Closed windows as spans and late records as values."""
    closed, late = logic.add(0, batch, now)
    return spans(closed), values(late)


def test_tumbling_count_windows_cut_every_size_records() -> None:
    """CountWindow(3) over 8 records: windows [0,3) and [3,6) close as they fill; nothing is late."""
    logic = logic_for(sl.CountWindow(3))
    assert add(logic, numbers(*range(8))) == ([(0, 3, [0, 1, 2]), (3, 6, [3, 4, 5])], [])


def test_partial_count_window_ends_at_the_last_index() -> None:
    """close_all gives the partial window with end = records seen."""
    logic = logic_for(sl.CountWindow(3))
    add(logic, numbers(*range(8)))
    assert spans(logic.close_all()) == [(6, 8, [6, 7])]
    assert spans(logic.close_all()) == []


def test_count_window_boundaries_do_not_depend_on_batches() -> None:
    """Batches of 2 close the same windows, each as soon as its last record arrives."""
    logic = logic_for(sl.CountWindow(3))
    results = [add(logic, numbers(first, first + 1))[0] for first in range(0, 8, 2)]
    assert results == [[], [(0, 3, [0, 1, 2])], [(3, 6, [3, 4, 5])], []]


def test_sliding_count_windows_overlap() -> None:
    """CountWindow(4, slide=2) over 7 records: [0,4), [2,6) full, then partial [4,7) and [6,7)."""
    logic = logic_for(sl.CountWindow(4, slide=2))
    assert add(logic, numbers(*range(7))) == ([(0, 4, [0, 1, 2, 3]), (2, 6, [2, 3, 4, 5])], [])
    assert spans(logic.close_all()) == [(4, 7, [4, 5, 6]), (6, 7, [6])]


def test_window_keeps_records_per_port_and_lists_them_in_port_order() -> None:
    """A window's records are kept per input port; all_records() is port 0's then port 1's."""
    logic = logic_for(sl.CountWindow(3))
    logic.add(1, numbers(10), 0.0)
    [window], _ = logic.add(0, numbers(1, 2), 0.0)
    assert window.records == {1: numbers(10), 0: numbers(1, 2)}
    assert values(window.all_records()) == [1, 2, 10]


def test_processing_time_window_assigned_by_now_and_closed_when_now_passes_its_end() -> None:
    """TimeWindow(10): records go to the window holding ``now``; it closes once now >= its end."""
    logic = logic_for(sl.TimeWindow(10))
    assert add(logic, numbers(1), now=1.0) == ([], [])
    assert add(logic, numbers(2), now=9.5) == ([], [])
    assert add(logic, numbers(3), now=10.0) == ([(0, 10, [1, 2])], [])
    assert logic.next_deadline() == 20
    assert spans(logic.on_time(19.9)) == []
    assert spans(logic.on_time(20.0)) == [(10, 20, [3])]
    assert logic.next_deadline() is None


def test_sliding_processing_time_window_puts_a_batch_in_every_window_holding_now() -> None:
    """TimeWindow(10, slide=5): a batch at now=7 is in [0,10) and [5,15)."""
    logic = logic_for(sl.TimeWindow(10, slide=5))
    add(logic, numbers(1), now=7.0)
    assert add(logic, numbers(2), now=12.0) == ([(0, 10, [1])], [])
    assert spans(logic.on_time(15.0)) == [(5, 15, [1, 2])]
    assert spans(logic.close_all()) == [(10, 20, [2])]


def test_event_time_window_closes_when_the_watermark_reaches_its_end() -> None:
    """Event time: the window [0,10) fires when the input's watermark reaches 10, not before (records alone
    never move it: the watermark comes from the sources)."""
    logic = logic_for(sl.TimeWindow(10, time="event"))
    assert add(logic, at(1, 5, 9.5, 12), now=100.0) == ([], [])
    assert spans(logic.advance(9.999)) == []
    assert spans(logic.advance(10)) == [(0, 10, [1, 5, 9.5])]
    assert spans(logic.advance(10)) == []  # the same watermark again fires nothing


def test_event_time_record_behind_the_watermark_is_late_and_counted() -> None:
    """A record for a window the watermark passed is returned as late; out-of-order records still count."""
    logic = logic_for(sl.TimeWindow(10, time="event"))
    add(logic, at(1, 12))
    logic.advance(12)
    assert add(logic, at(3, 11, 9.99)) == ([], [3, 9.99])
    assert logic.late == 2
    assert spans(logic.close_all()) == [(10, 20, [12, 11])]


def test_a_watermark_never_goes_back() -> None:
    """advance() with a lower watermark than before changes nothing: [0,10) stays fired, 5 stays late."""
    logic = logic_for(sl.TimeWindow(10, time="event"))
    add(logic, at(1))
    assert spans(logic.advance(15)) == [(0, 10, [1])]
    assert spans(logic.advance(3)) == []
    assert add(logic, at(5)) == ([], [5])


def test_allowed_lateness_fires_a_window_again_for_each_late_record() -> None:
    """allowed_lateness=5: [0,10) fires on time at watermark 10, again (late, with all it holds) for ts 8 at
    watermark 12, and is forgotten at 15, after which ts 9 is late."""
    logic = logic_for(sl.TimeWindow(10, time="event", allowed_lateness=5))
    add(logic, at(1, 12))
    [on_time] = logic.advance(12)
    assert (spans([on_time]), on_time.firing) == ([(0, 10, [1])], "on_time")
    fired, late = logic.add(0, at(8), 0.0)
    assert ([(w.start, w.end, [r[2] for r in w.all_records()], w.firing) for w in fired], late) == (
        [(0, 10, [1, 8], "late")],
        [],
    )
    assert spans(logic.advance(15)) == []
    assert add(logic, at(9)) == ([], [9])
    assert logic.late == 1


def test_a_late_record_for_a_window_that_never_opened_fires_it_alone() -> None:
    """Within allowed_lateness, a late record whose window had no records fires it with just itself."""
    logic = logic_for(sl.TimeWindow(10, time="event", allowed_lateness=20))
    add(logic, at(25))
    logic.advance(25)
    fired, late = logic.add(0, at(7), 0.0)
    assert ([(w.start, w.end, w.firing) for w in fired], late) == ([(0, 10, "late")], [])


def test_sliding_event_window_holds_a_record_in_every_window_containing_it() -> None:
    """TimeWindow(10, slide=5, event): ts 7 is in [0,10) and [5,15); ts 12 in [5,15) and [10,20)."""
    logic = logic_for(sl.TimeWindow(10, slide=5, time="event"))
    add(logic, at(7, 12))
    assert spans(logic.advance(12)) == [(0, 10, [7])]
    assert spans(logic.close_all()) == [(5, 15, [7, 12]), (10, 20, [12])]


def test_sliding_event_record_is_late_only_when_all_its_windows_closed() -> None:
    """ts 8 after the watermark passed 10 still joins [5,15); ts 4 (windows [-5,5), [0,10)) is late."""
    logic = logic_for(sl.TimeWindow(10, slide=5, time="event"))
    add(logic, at(7, 12))
    logic.advance(12)
    assert add(logic, at(8, 4)) == ([], [4])
    assert logic.late == 1
    assert spans(logic.advance(16)) == [(5, 15, [7, 12, 8])]


def test_record_without_event_time_uses_now() -> None:
    """An event-time window places a record with ts None at ``now``."""
    logic = logic_for(sl.TimeWindow(10, time="event"))
    add(logic, numbers(1), now=13.0)
    assert spans(logic.advance(20)) == [(10, 20, [1])]


def test_offset_moves_every_window_start() -> None:
    """TimeWindow(10, offset=3): windows are [-7,3), [3,13), [13,23): 2 and 3 fall apart, 12 joins 3."""
    logic = logic_for(sl.TimeWindow(10, time="event", offset=3))
    add(logic, at(2, 3, 12, 13))
    assert spans(logic.close_all()) == [(-7, 3, [2]), (3, 13, [3, 12]), (13, 23, [13])]


def test_early_firing_fires_open_windows_that_took_records_by_the_clock() -> None:
    """early_firing=2: [0,10) fires early at now 102 with what it holds, not again until it takes more,
    then on time at the watermark."""
    logic = logic_for(sl.TimeWindow(10, time="event", early_firing=2))
    add(logic, at(1), now=100.0)
    assert logic.next_deadline() == 102.0
    assert spans(logic.on_time(101.9)) == []
    [early] = logic.on_time(102.0)
    assert (spans([early]), early.firing) == ([(0, 10, [1])], "early")
    assert logic.next_deadline() is None  # nothing new since: no early firing due
    add(logic, at(4), now=103.0)
    assert [w.firing for w in logic.on_time(105.0)] == ["early"]
    [on_time] = logic.advance(10)
    assert (spans([on_time]), on_time.firing) == ([(0, 10, [1, 4])], "on_time")


def test_event_time_window_has_no_clock_deadline_without_idle_timeout() -> None:
    """Event-time windows close by watermark only: next_deadline is None, on_time closes nothing."""
    logic = logic_for(sl.TimeWindow(10, time="event"))
    add(logic, at(3), now=100.0)
    assert logic.next_deadline() is None
    assert spans(logic.on_time(10_000.0)) == []


def test_idle_timeout_closes_open_windows() -> None:
    """idle_timeout=5: no record for 5 s after the last arrival closes every open window."""
    logic = logic_for(sl.TimeWindow(10, time="event", idle_timeout=5))
    add(logic, at(3, 14), now=100.0)
    assert logic.next_deadline() == 105.0
    assert spans(logic.on_time(104.9)) == []
    assert spans(logic.on_time(105.0)) == [(0, 10, [3]), (10, 20, [14])]
    assert logic.next_deadline() is None


def test_records_for_windows_closed_by_idle_timeout_are_late() -> None:
    """After an idle close the watermark stands at the closed windows' end."""
    logic = logic_for(sl.TimeWindow(10, time="event", idle_timeout=5))
    add(logic, at(3), now=100.0)
    logic.on_time(105.0)
    assert add(logic, at(9, 10), now=106.0) == ([], [9])


def test_count_or_time_window_closes_at_count() -> None:
    """CountOrTimeWindow(3, 5): the third record closes the window; (start, end) = (opened, closed)."""
    logic = logic_for(sl.CountOrTimeWindow(3, 5))
    assert add(logic, numbers(1, 2), now=1.0) == ([], [])
    assert add(logic, numbers(3, 4), now=2.0) == ([(1.0, 2.0, [1, 2, 3])], [])
    assert logic.next_deadline() == 7.0


def test_count_or_time_window_closes_seconds_after_it_opened() -> None:
    """With fewer than count records the window closes at opened + seconds."""
    logic = logic_for(sl.CountOrTimeWindow(3, 5))
    add(logic, numbers(1), now=1.0)
    assert logic.next_deadline() == 6.0
    assert spans(logic.on_time(5.9)) == []
    assert spans(logic.on_time(6.0)) == [(1.0, 6.0, [1])]
    assert logic.next_deadline() is None


def test_count_or_time_window_overdue_closes_before_the_next_batch_opens_a_new_one() -> None:
    """A batch arriving after the deadline first closes the old window, then opens one at now."""
    logic = logic_for(sl.CountOrTimeWindow(3, 5))
    add(logic, numbers(1), now=1.0)
    assert add(logic, numbers(2), now=8.0) == ([(1.0, 6.0, [1])], [])
    assert spans(logic.close_all()) == [(8.0, 13.0, [2])]


def test_count_or_time_window_splits_a_large_batch() -> None:
    """A batch of 7 with count 3 closes two full windows and leaves one record open."""
    logic = logic_for(sl.CountOrTimeWindow(3, 5))
    assert add(logic, numbers(*range(7)), now=2.0) == ([(2.0, 2.0, [0, 1, 2]), (2.0, 2.0, [3, 4, 5])], [])
    assert spans(logic.close_all()) == [(2.0, 7.0, [6])]


SPECS = [
    sl.CountWindow(3),
    sl.CountWindow(4, slide=2),
    sl.TimeWindow(10),
    sl.TimeWindow(10, slide=5),
    sl.TimeWindow(10, time="event", allowed_lateness=2),
    sl.TimeWindow(10, slide=5, time="event", idle_timeout=30),
    sl.CountOrTimeWindow(3, 5),
]
# (now, event times of the batch); the snapshot is taken after the first three steps
STEPS: list[tuple[float, list[float]]] = [
    (1.0, [1, 4]),
    (4.0, [12, 2]),
    (6.0, [7]),
    (11.0, [13, 3, 25]),
    (13.0, [21]),
    (26.0, [33, 14]),
]


def drive(logic: WindowLogic, steps: list[tuple[float, list[float]]]) -> list[Any]:
    """Feed ``steps``, calling on_time half a second after each; what came out of each call."""
    out: list[Any] = []
    for now, times in steps:
        out.append(add(logic, at(*times), now))
        out.append(spans(logic.on_time(now + 0.5)))
    return out


def finish(logic: WindowLogic) -> list[Any]:
    """The windows close_all gives and the late count."""
    return [spans(logic.close_all()), logic.late]


@pytest.mark.parametrize("through_msgpack", [False, True], ids=["plain", "msgpack"])
@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_snapshot_restore_continues_identically(spec: sl.WindowSpec, through_msgpack: bool) -> None:
    """A logic restored from a mid-stream snapshot produces exactly what the original does."""
    original = logic_for(spec)
    drive(original, STEPS[:3])
    snapshot = original.snapshot()
    if through_msgpack:
        snapshot = msgpack.unpackb(msgpack.packb(snapshot), strict_map_key=False)
    restored = logic_for(spec)
    restored.restore(snapshot)
    expected = [*drive(original, STEPS[3:]), *finish(original)]
    assert [*drive(restored, STEPS[3:]), *finish(restored)] == expected


def test_snapshot_through_msgpack_keeps_tuple_keys() -> None:
    """A record with a tuple key in an open window still has a tuple key after a msgpack round trip."""
    logic = logic_for(sl.CountWindow(3))
    logic.add(0, [el(("user", 1), "v")], 0.0)
    restored = logic_for(sl.CountWindow(3))
    restored.restore(msgpack.unpackb(msgpack.packb(logic.snapshot()), strict_map_key=False))
    assert [record[0] for record in restored.close_all()[0].all_records()] == [("user", 1)]


def test_restore_keeps_the_idle_deadline() -> None:
    """A restored event-time window with idle_timeout keeps the deadline of the original."""
    spec = sl.TimeWindow(10, time="event", idle_timeout=5)
    logic = logic_for(spec)
    add(logic, at(3), now=100.0)
    restored = logic_for(spec)
    restored.restore(logic.snapshot())
    assert restored.next_deadline() == logic.next_deadline() == 105.0


def rejects(message: str) -> pytest.RaisesExc[sl.TopologyError]:
    """Expect a TopologyError whose message is exactly ``message``."""
    return pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$")


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (sl.CountWindow(0), "window size must be > 0, got 0"),
        (sl.CountWindow(3, slide=-1), "window slide must be > 0, got -1"),
        (sl.CountWindow(2.5), "window size must be a whole number of records, got 2.5"),  # type: ignore[arg-type]
        (sl.TimeWindow(0), "window size must be > 0, got 0"),
        (sl.TimeWindow(5, time="wall"), "window time must be 'processing' or 'event', got 'wall'"),  # type: ignore[arg-type]
        (sl.TimeWindow(5, allowed_lateness=-1), "allowed_lateness must be >= 0, got -1"),
        (sl.TimeWindow(5, idle_timeout=0), "window idle_timeout must be > 0, got 0"),
        (sl.TimeWindow(5, time="event", early_firing=0), "window early_firing must be > 0, got 0"),
        (sl.TimeWindow(5, allowed_lateness=1), "allowed_lateness applies to event time only (time='event')"),
        (sl.TimeWindow(10, offset=10), "window offset must be >= 0 and below the slide 10, got 10"),
        (sl.TimeWindow(10, slide=5, offset=-1), "window offset must be >= 0 and below the slide 5, got -1"),
        (sl.TimeWindow(10, offset=0.0005), "window offset 0.0005 is not a whole number of ticks of time_unit 0.001 s"),
        (
            sl.TimeWindow(10, slide=30),
            "window slide 30 is larger than its size 10: records between two windows would belong to none "
            "(sample or filter before a tumbling window instead)",
        ),
        (
            sl.CountWindow(2, slide=3),
            "window slide 3 is larger than its size 2: records between two windows would belong to none "
            "(sample or filter before a tumbling window instead)",
        ),
        (sl.CountOrTimeWindow(3.0, 1), "window count must be a whole number of records, got 3.0"),  # type: ignore[arg-type]
        (sl.CountOrTimeWindow(3, 0), "window seconds must be > 0, got 0"),
        ("tumbling", "window must be a CountWindow, TimeWindow, SessionWindow or CountOrTimeWindow, got 'tumbling'"),
    ],
)
def test_impossible_window_spec_is_rejected(window: Any, message: str) -> None:
    """add_task refuses an impossible window, naming the task."""
    with rejects(f"task 'w': {message}"):
        sl.Topology("t").add_task("w", lambda: Collect(), window=window)


@pytest.mark.parametrize("window", [sl.CountWindow(3, slide=0), sl.TimeWindow(5, slide=0)], ids=repr)
def test_zero_slide_is_rejected(window: sl.WindowSpec) -> None:
    """slide=0 is an impossible slide, not a tumbling window."""
    with rejects("task 'w': window slide must be > 0, got 0"):
        sl.Topology("t").add_task("w", lambda: Collect(), window=window)


class Collect(sl.Task):
    """Emits one record per window: key ``inputs.window``, value the window's values."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, values(inputs.get()))
