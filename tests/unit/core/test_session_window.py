"""Session windows: per-key sessions merged by a gap, driven directly (event time through advance()) and in
processing-time jobs on a ManualClock."""

from __future__ import annotations

import asyncio
import itertools
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

import streamlet as sl
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.state.changelog import changelog
from streamlet.core.state.rocks_sessions import window_form
from streamlet.core.windows.build import logic_for
from streamlet.core.windows.fold import ClosedWindow, WindowLogic
from streamlet.core.windows.session import EventTimeSessionLogic, ProcessingTimeSessionLogic, SessionLogic
from tests.conftest import pairs, values
from tests.support.elements import el

EVENT = sl.SessionWindow(10, time="event")
LATE_5 = sl.SessionWindow(10, time="event", allowed_lateness=5)


def ev(key: Any, *times: float) -> list[Any]:
    """Records of ``key`` at event times ``times``; each value names its key and time (``"a3"``)."""
    return [el(key, f"{key}{ts:g}", ts) for ts in times]


def now_records(*keys: str) -> list[Any]:
    """Records without event time, one per key in ``keys``; the value is the key and its position."""
    return [el(key, f"{key}{index}") for index, key in enumerate(keys)]


def shown(windows: list[ClosedWindow]) -> list[tuple[float, float, list[Any], str]]:
    """``(start, end, values, firing)`` of every window."""
    return [(w.start, w.end, values(w.all_records()), w.firing) for w in windows]


def folds(windows: list[ClosedWindow]) -> list[tuple[float, float, dict[Any, Any] | None, str]]:
    """``(start, end, folded, firing)`` of every window."""
    return [(w.start, w.end, w.folded, w.firing) for w in windows]


def add(logic: WindowLogic, batch: list[Any], now: float = 0.0) -> tuple[list[Any], list[Any]]:
    """Windows fired by ``add`` as :func:`shown`, and the late records' values."""
    closed, late = logic.add(0, batch, now)
    return shown(closed), values(late)


#: Makes a RocksDB session store for a folding logic; ``None``: folding logics keep their sessions in memory.
new_store: Callable[[], Any] | None = None


@pytest.fixture(autouse=True, params=["memory", "rocksdb"])
def sessions_kept(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test twice: folding logics keep their sessions in memory, then in RocksDB (a cache of two chains,
    so most sessions are read back from the database)."""
    if request.param == "memory":
        yield "memory"
        return
    backend, numbers = sl.RocksDBState(tmp_path, cache_entries=2), itertools.count()
    monkeypatch.setattr(
        sys.modules[__name__], "new_store", lambda: backend.open_sessions("job", "task", next(numbers), 4096)
    )
    yield "rocksdb"
    backend.close()


def folding(spec: sl.SessionWindow, how: Any) -> WindowLogic:
    """The logic of ``spec`` folding with ``how``, as window_reduce sets it up (its sessions in RocksDB under
    the rocksdb variant)."""
    logic = logic_for(spec)
    logic.fold = how
    if how is not None and new_store is not None:
        assert isinstance(logic, SessionLogic)
        logic.keep_in(new_store())
    return logic


# -- processing time --------------------------------------------------------------------------------


def test_spec_builds_processing_or_event_time_session_logic() -> None:
    """logic_for picks the logic by the spec's time kind."""
    assert type(logic_for(sl.SessionWindow(10))) is ProcessingTimeSessionLogic
    assert type(logic_for(EVENT)) is EventTimeSessionLogic


def test_processing_session_closes_a_gap_after_its_last_record() -> None:
    """SessionWindow(10): records at now 0 and 5 share [0, 15); the clock closes it at 15, not before."""
    logic = logic_for(sl.SessionWindow(10))
    assert add(logic, now_records("a"), now=0.0) == ([], [])
    assert logic.next_deadline() == 10.0
    assert add(logic, now_records("a"), now=5.0) == ([], [])
    assert logic.next_deadline() == 15.0
    assert shown(logic.on_time(14.999)) == []
    assert shown(logic.on_time(15.0)) == [(0.0, 15.0, ["a0", "a0"], "on_time")]
    assert logic.next_deadline() is None


def test_processing_add_fires_what_the_clock_closed_before_placing_its_records() -> None:
    """A record at exactly a session's end does not join it: the session closed first, a new one opens."""
    logic = logic_for(sl.SessionWindow(10))
    add(logic, now_records("a"), now=0.0)
    assert add(logic, now_records("a", "b"), now=10.0) == ([(0.0, 10.0, ["a0"], "on_time")], [])
    assert shown(logic.close_all()) == [(10.0, 20.0, ["a0"], "on_time"), (10.0, 20.0, ["b1"], "on_time")]


def test_processing_sessions_fire_by_end_then_start_then_key_arrival() -> None:
    """b and a arrive together (b first), c later; a is extended: b [0,10), c [3,13), a [0,14) in that order."""
    logic = logic_for(sl.SessionWindow(10))
    add(logic, now_records("b", "a", "b"), now=0.0)
    add(logic, now_records("c"), now=3.0)
    add(logic, now_records("a"), now=4.0)
    assert logic.next_deadline() == 10.0
    assert shown(logic.on_time(20.0)) == [
        (0.0, 10.0, ["b0", "b2"], "on_time"),
        (3.0, 13.0, ["c0"], "on_time"),
        (0.0, 14.0, ["a1", "a0"], "on_time"),
    ]


def test_processing_sessions_with_equal_bounds_go_in_key_arrival_order() -> None:
    """Three keys in one batch share bounds: they fire in the order the keys came, at close_all too."""
    logic = logic_for(sl.SessionWindow(10))
    add(logic, now_records("z", "x", "y", "x"), now=1.0)
    assert [values(w.all_records()) for w in logic.close_all()] == [["z0"], ["x1", "x3"], ["y2"]]
    assert logic.close_all() == []


@pytest.mark.parametrize("keys", ["zxywvu", "uvwxyz", "wyuzxv"])
def test_folded_sessions_due_together_go_by_start_then_key_arrival(keys: str) -> None:
    """Six keys' sessions end at one tick: the one that starts first goes first, the other five in the order
    their keys came, whatever order their keys sort in (RocksDB lays them out by key, and keeps most of them
    out of its cache of two)."""
    first, *others = keys
    logic = folding(sl.SessionWindow(10, time="event"), "sum")
    for value, key in enumerate(others):
        logic.add(0, [el(key, value, 5.0)], 0.0)
    logic.add(0, [el(first, 10, 1.0), el(first, 20, 5.0)], 0.0)
    assert folds(logic.advance(100.0)) == [
        (1.0, 15.0, {first: 30}, "on_time"),
        *((5.0, 15.0, {key: value}, "on_time") for value, key in enumerate(others)),
    ]


def test_a_kept_session_due_when_an_open_one_of_its_key_ends_is_not_taken_for_it() -> None:
    """a's session [0, 1) fires and is kept for 3 s of lateness, due to expire at 4, when a's next session
    [3, 4) closes: the end of the stream fires the open one (found by the windows differential test)."""
    logic = folding(sl.SessionWindow(1, time="event", allowed_lateness=3), "sum")
    logic.add(0, [el("a", 5, 0.0)], 0.0)
    assert folds(logic.advance(1.0)) == [(0.0, 1.0, {"a": 5}, "on_time")]
    logic.add(0, [el("a", 7, 3.0)], 0.0)
    assert folds(logic.advance(2.0)) == []
    assert folds(logic.close_all()) == [(3.0, 4.0, {"a": 7}, "on_time")]


@pytest.mark.parametrize("spec", [sl.SessionWindow(10), LATE_5])
def test_a_call_leaves_no_more_chains_in_memory_than_the_cache_holds(spec: sl.SessionWindow) -> None:
    """Six keys' sessions opened by one batch: once the call returns, the chains it held go back to the
    database (a cache of two), and its agenda entries with them; an idle instance holds no more than that."""
    logic = folding(spec, "sum")
    assert add(logic, [el(key, 1, 1.0) for key in "abcdef"]) == ([], [])
    store = getattr(logic, "store", None)
    if store is not None:  # on RocksDB
        assert len(store.chains.cache) <= 2
        assert store.closing.pending == {}
    assert [result[0] for result in pairs_of(logic.close_all())] == list("abcdef")


def pairs_of(windows: list[ClosedWindow]) -> list[tuple[Any, Any]]:
    """``(key, value)`` of every folded session in ``windows``."""
    return [pair for window in windows for pair in (window.folded or {}).items()]


def test_processing_session_folds_one_value_per_session() -> None:
    """With window_reduce's fold, a session holds {key: value}; each key's sum is its own session's."""
    logic = folding(sl.SessionWindow(10), "sum")
    logic.add(0, [el("a", 1), el("b", 10), el("a", 2)], 0.0)
    logic.add(0, [el("a", 3)], 6.0)
    assert folds(logic.on_time(16.0)) == [(0.0, 10.0, {"b": 10}, "on_time"), (0.0, 16.0, {"a": 6}, "on_time")]


def test_session_results_carry_the_last_tick_of_the_session() -> None:
    """result_ts is the session's end minus one tick, as for time windows."""
    logic = logic_for(sl.SessionWindow(0.5, time_unit=0.1))
    add(logic, now_records("a"), now=2.0)
    [window] = logic.close_all()
    assert (window.start, window.end, logic.result_ts(window)) == (2.0, 2.5, 2.4)


# -- event time ------------------------------------------------------------------------------------


def test_event_session_fires_when_the_watermark_reaches_its_end() -> None:
    """Records at 1 and 5 share [1, 15): the watermark at 14.999 keeps it open, at 15 fires it on time."""
    logic = logic_for(EVENT)
    assert add(logic, ev("a", 1, 5)) == ([], [])
    assert shown(logic.advance(14.999)) == []
    assert shown(logic.advance(15.0)) == [(1.0, 15.0, ["a1", "a5"], "on_time")]
    assert logic.next_deadline() is None
    assert shown(logic.on_time(1000.0)) == []


def test_event_watermark_never_goes_back() -> None:
    """After advance(20), advance(5) changes nothing: a record at 6 (session [6, 16)) is still late."""
    logic = logic_for(EVENT)
    logic.advance(20.0)
    assert shown(logic.advance(5.0)) == []
    assert add(logic, ev("a", 6)) == ([], ["a6"])
    assert logic.late == 1


def test_out_of_order_record_extends_its_session_backwards() -> None:
    """A record at 4 after one at 10 joins [10, 20): the session becomes [4, 20)."""
    logic = logic_for(EVENT)
    add(logic, ev("a", 10, 4))
    assert shown(logic.advance(19.0)) == []
    assert shown(logic.advance(20.0)) == [(4.0, 20.0, ["a10", "a4"], "on_time")]


def test_a_record_bridges_two_sessions_into_one() -> None:
    """Sessions [1, 11) and [20, 30); a record at 10 ([10, 20)) touches both: one session [1, 30)."""
    logic = logic_for(EVENT)
    add(logic, ev("a", 1, 20))
    assert add(logic, ev("a", 10)) == ([], [])
    assert shown(logic.advance(29.0)) == []
    assert shown(logic.advance(30.0)) == [(1.0, 30.0, ["a1", "a20", "a10"], "on_time")]


def test_sessions_that_only_touch_are_merged() -> None:
    """[0, 10) and a record at 10 (its [10, 20) touches at 10) make one session [0, 20)."""
    logic = logic_for(EVENT)
    add(logic, ev("a", 0, 10))
    assert shown(logic.close_all()) == [(0.0, 20.0, ["a0", "a10"], "on_time")]


def test_a_record_a_gap_away_opens_a_second_session() -> None:
    """Records at 0 and 10.001 are more than the gap apart: two sessions of one key."""
    logic = logic_for(EVENT)
    add(logic, ev("a", 0, 10.001))
    assert shown(logic.advance(100.0)) == [(0.0, 10.0, ["a0"], "on_time"), (10.001, 20.001, ["a10.001"], "on_time")]


@pytest.mark.parametrize(
    ("how", "expected"),
    [("sum", 31), ("count", 3), ("min", 1), ("max", 20), (lambda acc, value: acc * value, 200)],
    ids=["sum", "count", "min", "max", "function"],
)
def test_bridged_sessions_fold_into_one_value(how: Any, expected: int) -> None:
    """Folded sessions {a: 1} and {a: 20} bridged by a record of value 10 fold to one value of all three."""
    logic = folding(EVENT, how)
    logic.add(0, [el("a", 1, 1.0), el("a", 20, 20.0)], 0.0)
    logic.add(0, [el("a", 10, 10.0)], 0.0)
    assert folds(logic.advance(30.0)) == [(1.0, 30.0, {"a": expected}, "on_time")]


def test_interleaved_keys_keep_sessions_of_their_own() -> None:
    """a, b and c interleaved: each key merges only its own records; firing by end, start, key arrival."""
    logic = logic_for(EVENT)
    batch = [*ev("b", 2), *ev("a", 0), *ev("c", 2), *ev("a", 5), *ev("b", 30), *ev("a", 12)]
    assert add(logic, batch) == ([], [])
    assert shown(logic.advance(22.0)) == [
        (2.0, 12.0, ["b2"], "on_time"),
        (2.0, 12.0, ["c2"], "on_time"),
        (0.0, 22.0, ["a0", "a5", "a12"], "on_time"),
    ]
    assert shown(logic.close_all()) == [(30.0, 40.0, ["b30"], "on_time")]


def test_record_behind_the_watermark_joining_no_session_is_late() -> None:
    """Watermark 30: a record at 8 ([8, 18)) joins nothing and is late; one at 25 joins [21, 31)."""
    logic = logic_for(EVENT)
    add(logic, ev("a", 21))
    logic.advance(30.0)
    assert add(logic, ev("a", 8, 25), now=99.0) == ([], ["a8"])
    assert logic.late == 1
    assert shown(logic.advance(35.0)) == [(21.0, 35.0, ["a21", "a25"], "on_time")]


def test_allowed_lateness_fires_a_session_again_for_each_record_that_rejoins_it() -> None:
    """Lateness 5: [1, 13) fires on time at watermark 15 and is kept until 18; records at 2 and 0 fire it
    again, marked late, with everything it holds; at 18 it is gone and a record at 2.5 is late."""
    logic = logic_for(LATE_5)
    add(logic, ev("a", 1, 3))
    assert shown(logic.advance(15.0)) == [(1.0, 13.0, ["a1", "a3"], "on_time")]
    assert add(logic, ev("a", 2, 0)) == (
        [(1.0, 13.0, ["a1", "a3", "a2"], "late"), (0.0, 13.0, ["a1", "a3", "a2", "a0"], "late")],
        [],
    )
    assert shown(logic.advance(18.0)) == []
    assert add(logic, ev("a", 2.5)) == ([], ["a2.5"])
    assert logic.late == 1
    assert shown(logic.close_all()) == []


def test_allowed_lateness_late_session_of_its_own_fires_at_once() -> None:
    """Watermark 15, lateness 5: a record at 4 ([4, 14), kept until 19) joins nothing; it fires at once, late,
    and again with one at 4.5 (now [4, 14.5), kept until 19.5), and at 4.25; after 19.5 a record at 4 is late."""
    logic = logic_for(LATE_5)
    logic.advance(15.0)
    assert add(logic, ev("b", 4)) == ([(4.0, 14.0, ["b4"], "late")], [])
    assert add(logic, ev("b", 4.5)) == ([(4.0, 14.5, ["b4", "b4.5"], "late")], [])
    assert logic.advance(19.0) == []
    assert add(logic, ev("b", 4.25)) == ([(4.0, 14.5, ["b4", "b4.5", "b4.25"], "late")], [])
    assert logic.advance(19.5) == []
    assert add(logic, ev("b", 4)) == ([], ["b4"])


def test_record_extending_a_fired_session_past_the_watermark_reopens_it() -> None:
    """[1, 13) fired at 15; a record at 8 makes it [1, 18), past the watermark: it fires again on time at 18."""
    logic = logic_for(LATE_5)
    add(logic, ev("a", 1, 3))
    logic.advance(15.0)
    assert add(logic, ev("a", 8)) == ([], [])
    assert shown(logic.advance(17.0)) == []
    assert shown(logic.advance(18.0)) == [(1.0, 18.0, ["a1", "a3", "a8"], "on_time")]


def test_late_firings_of_a_folded_session_accumulate() -> None:
    """Folding with lateness: each firing has the whole sum so far; the values handed over stay as they were."""
    logic = folding(LATE_5, "sum")
    logic.add(0, [el("a", 1, 1.0), el("a", 2, 3.0)], 0.0)
    on_time = logic.advance(15.0)
    first, _ = logic.add(0, [el("a", 10, 2.0)], 0.0)
    second, _ = logic.add(0, [el("a", 100, 0.0)], 0.0)
    assert folds([*on_time, *first, *second]) == [
        (1.0, 13.0, {"a": 3}, "on_time"),
        (1.0, 13.0, {"a": 13}, "late"),
        (0.0, 13.0, {"a": 113}, "late"),
    ]


def test_close_all_gives_open_sessions_only() -> None:
    """At end of stream a session fired and kept for lateness is not handed over again."""
    logic = logic_for(LATE_5)
    add(logic, [*ev("a", 1), *ev("b", 20)])
    logic.advance(12.0)
    assert shown(logic.close_all()) == [(20.0, 30.0, ["b20"], "on_time")]


def test_record_without_event_time_is_placed_at_now() -> None:
    """missing_ts="clock": a ts-less record joins the session of ``now``."""
    logic = logic_for(EVENT)
    add(logic, ev("a", 95))
    logic.add(0, [el("a", "no ts")], 100.0)
    assert shown(logic.advance(110.0)) == [(95.0, 110.0, ["a95", "no ts"], "on_time")]


def test_missing_ts_fail_refuses_a_record_without_event_time() -> None:
    """missing_ts="fail": add raises (the task instance names the record)."""
    logic = logic_for(sl.SessionWindow(10, time="event", missing_ts="fail"))
    with pytest.raises(ValueError, match=r"^a record has no ts$"):
        logic.add(0, [el("a", 1)], 0.0)


def test_many_updates_keep_the_deadline_heap_small() -> None:
    """A key extended by 1000 records in order still fires once, with every record, and stale entries go."""
    logic = logic_for(EVENT)
    for ts in range(1000):
        logic.add(0, ev("a", ts), 0.0)
    assert isinstance(logic, EventTimeSessionLogic)
    assert len(logic.closing.heap) < 200
    [window] = logic.advance(1009.0)
    assert (window.start, window.end, len(window.all_records())) == (0.0, 1009.0, 1000)


# -- snapshots ---------------------------------------------------------------------------------------

# (now, watermark or None, batch); the snapshot is taken after the first three steps
STEPS: list[tuple[float, float | None, list[Any]]] = [
    (0.0, None, [el(("u", 1), ("v", 1), 1.0), el("b", ("w", [2]), 3.0)]),
    (2.0, 5.0, [el(("u", 1), ("v", 2), 20.0), el("b", ("w", [3]), 4.0)]),
    (3.0, 16.0, [el(("u", 1), ("v", 3), 2.0), el("c", ("x",), 17.0)]),
    (14.0, 25.0, [el(("u", 1), ("v", 4), 10.0), el("b", ("w", [4]), 9.0)]),
    (15.0, 31.0, [el("c", ("x", 2), 26.0), el("b", ("w", [5]), 1.0)]),
    (26.0, 33.0, [el(("u", 1), ("v", 5), 40.0)]),
]
SPECS = [sl.SessionWindow(10), EVENT, LATE_5, sl.SessionWindow(10, time="event", allowed_lateness=20)]


def drive(logic: WindowLogic, steps: list[tuple[float, float | None, list[Any]]]) -> list[Any]:
    """Feed ``steps``: add at ``now``, then advance to the watermark, then on_time half a second later."""
    out: list[Any] = []
    for now, watermark, batch in steps:
        closed, late = logic.add(0, batch, now)
        out.append([shown(closed), folds(closed), late])
        if watermark is not None:
            closed = logic.advance(watermark)
            out.append([shown(closed), folds(closed)])
        closed = logic.on_time(now + 0.5)
        out.append([shown(closed), folds(closed), logic.next_deadline()])
    return out


def finish(logic: WindowLogic) -> list[Any]:
    """What close_all gives (records and folds) and the late count."""
    closed = logic.close_all()
    return [shown(closed), folds(closed), logic.late]


@pytest.mark.parametrize("how", [None, lambda acc, value: acc + value], ids=["records", "folded"])
@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_restored_logic_continues_exactly_like_the_original(spec: sl.SessionWindow, how: Any) -> None:
    """A logic restored from an exactly encoded mid-stream snapshot gives what the original gives: tuple keys
    and tuple values (folded too), watermark, lateness and the late count included."""
    original = folding(spec, how)
    drive(original, STEPS[:3])
    snapshot = unpackb(packb(original.snapshot()))
    restored = folding(spec, how)
    restored.restore(snapshot)
    expected = [*drive(original, STEPS[3:]), *finish(original)]
    assert [*drive(restored, STEPS[3:]), *finish(restored)] == expected


@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_incremental_snapshots_of_sessions_restore_like_whole_ones(spec: sl.SessionWindow) -> None:
    """Two incremental snapshots of a folding logic (on RocksDB: its chains' changelog, the second holding only
    the keys touched since the first), their chunks restored into a logic in memory: it continues exactly
    like the original; in memory an incremental snapshot is the whole one."""
    original = folding(spec, lambda acc, value: acc + value)
    drive(original, STEPS[:2])
    first = original.snapshot_increment()
    drive(original, STEPS[2:3])
    second = original.snapshot_increment()
    if original.store is None:
        assert second == original.snapshot()
        whole = second
    else:
        assert (len(first["chains"].chain), second["chains"].chain[:-1]) == (1, first["chains"].chain)
        whole = {**second, "chains": changelog([first["chains"].chunk, second["chains"].chunk], 4096)}
    restored = folding(spec, None)
    restored.fold = original.fold
    restored.restore(window_form(restored, unpackb(packb(whole))))
    expected = [*drive(original, STEPS[3:]), *finish(original)]
    assert [*drive(restored, STEPS[3:]), *finish(restored)] == expected


def test_snapshot_through_plain_msgpack_keeps_tuple_keys_and_the_watermark() -> None:
    """Plain msgpack turns tuple keys into lists; restore makes them tuples again, so the fired session kept for
    lateness still takes its key's records; the watermark (12) came back: a session ending at 10 fires late."""
    logic = logic_for(LATE_5)
    logic.add(0, [el(("user", 1), 1, 1.0)], 0.0)
    logic.advance(12.0)
    restored = logic_for(LATE_5)
    restored.restore(msgpack.unpackb(msgpack.packb(logic.snapshot()), strict_map_key=False))
    assert add(restored, [el("b", "b0", 0.0)]) == ([(0.0, 10.0, ["b0"], "late")], [])
    assert restored.add(0, [el(("user", 1), 2, 5.0)], 0.0) == ([], [])
    [window] = restored.advance(15.0)
    assert (window.start, window.end, pairs(window.all_records())) == (1.0, 15.0, [(("user", 1), 1), (("user", 1), 2)])


# -- the spec ---------------------------------------------------------------------------------------


class Collect(sl.Task):
    """Emits one record per window: key ``inputs.window``, value the window's values."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, values(inputs.get()))


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (sl.SessionWindow(0), "window gap must be > 0, got 0"),
        (sl.SessionWindow(-1.5), "window gap must be > 0, got -1.5"),
        (sl.SessionWindow(0.0015), "window gap 0.0015 is not a whole number of ticks of time_unit 0.001 s"),
        (sl.SessionWindow(1e-9), "window gap 1e-09 is not a whole number of ticks of time_unit 0.001 s"),
        (sl.SessionWindow(5, time="wall"), "window time must be 'processing' or 'event', got 'wall'"),  # type: ignore[arg-type]
        (sl.SessionWindow(5, time="event", allowed_lateness=-1), "allowed_lateness must be >= 0, got -1"),
        (
            sl.SessionWindow(5, time="event", allowed_lateness=0.25, time_unit=0.1),
            "window allowed_lateness 0.25 is not a whole number of ticks of time_unit 0.1 s",
        ),
        (sl.SessionWindow(5, allowed_lateness=1), "allowed_lateness applies to event time only (time='event')"),
        (sl.SessionWindow(5, missing_ts="skip"), "missing_ts must be 'clock' or 'fail', got 'skip'"),  # type: ignore[arg-type]
        (sl.SessionWindow(5, time_unit=0), "window time_unit must be > 0, got 0"),
    ],
)
def test_impossible_session_window_is_rejected(window: sl.SessionWindow, message: str) -> None:
    """add_task refuses an impossible session window, naming the task."""
    with pytest.raises(sl.TopologyError, match="^" + re.escape(f"task 'w': {message}") + "$"):
        sl.Topology("t").add_task("w", Collect, window=window)


# -- jobs on a ManualClock (processing time) ----------------------------------------------------------


def test_job_sessions_by_a_still_clock_close_at_end_of_stream() -> None:
    """The clock stands at 1000: every key's records share [1000, 1010), handed over in key arrival order."""
    topology = sl.Topology("sessions")
    source = topology.add_source("in", [("b", 1), ("a", 2), ("b", 3)])
    node = topology.add_task("w", Collect, window=sl.SessionWindow(10)).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, clock=sl.ManualClock(start=1000.0))
    assert pairs(result.sink("out")) == [((1000.0, 1010.0), [1, 3]), ((1000.0, 1010.0), [2])]


def sums(seen: list[Any]) -> sl.Topology:
    """QueueSource 'in' -> window_reduce sum per processing-time session (gap 10) -> sink appending to ``seen``."""
    topology = sl.Topology("session-sums")
    source = topology.add_source("in", sl.QueueSource())
    summed = topology.window_reduce("s", "sum", window=sl.SessionWindow(10)).set_input(source)
    topology.add_sink("out", seen.append).set_input(summed)
    return topology


async def test_job_session_sums_close_by_the_manual_clock(manual_clock: sl.ManualClock) -> None:
    """a at 0 and 5, b at 0: b's session [0, 10) closes at 10; a's [0, 15) at 15, with the sum of both."""
    seen: list[Any] = []
    async with sl.start(sums(seen), clock=manual_clock) as job:
        await job.send("in", "a", 1)
        await job.send("in", "b", 10)
        await job.settle()
        manual_clock.advance(5)
        await job.send("in", "a", 2)
        await job.settle()
        manual_clock.advance(5)
        await job.settle()
        assert [(r.key, r.value, r.window, r.ts) for r in seen] == [("b", 10, (0.0, 10.0), 9.999)]
        manual_clock.advance(5)
        await job.settle()
        assert [(r.key, r.value, r.window) for r in seen[1:]] == [("a", 3, (0.0, 15.0))]
        await job.send("in", "a", 4)
        await job.close_source("in")
        result = await asyncio.wait_for(job.wait(), timeout=10)
    assert [(r.key, r.value, r.window) for r in seen[2:]] == [("a", 4, (15.0, 25.0))]
    assert result.statistics.late == 0


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([0.0, 5.0, 10.0], [(3, (0.0, 15.0))]),  # exactly gap apart: the windows touch, one session
        ([0.0, 5.001, 10.002], [(1, (0.0, 5.0)), (1, (5.001, 10.001)), (1, (10.002, 15.002))]),
        ([0.0, 4.999, 9.998], [(3, (0.0, 14.998))]),
    ],
)
def test_records_exactly_gap_apart_share_a_session_as_the_page_says(
    times: list[float], expected: list[tuple[int, tuple[float, float]]]
) -> None:
    """docs/windows.md: a record's own window is [t, t + gap), touching windows merge (Flink's boundary)."""
    topology = sl.Topology("boundary")
    source = topology.add_source("in", [sl.Record("k", 1, ts) for ts in times])
    window = sl.SessionWindow(5, time="event", time_unit=0.001)
    sessions = topology.window_reduce("s", "count", window=window).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(sessions)
    assert [(r.value, r.window) for r in sl.run(topology).sink("out")] == expected
