"""Window state split by key and merged (``core/windows/split.py``): parts continued on their own keys give
each key the results one instance gives, merge(split(s)) continues as s does, and merging instances that
saw different watermarks neither drops nor doubles a key's result."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamlet as sl
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.model.segments import SegmentTable
from streamlet.core.windows.build import logic_for
from streamlet.core.windows.fold import ClosedWindow, WindowLogic
from streamlet.core.windows.split import merge_window_snapshots, split_window_snapshot, unsplittable
from tests.spec.budget import capped
from tests.support.elements import el

KEYS: tuple[Any, ...] = ("a", "b", ("t", 1), 7, "e")

#: ("add", now, port, records) | ("advance", watermark) | ("tick", now): on_time(now)
Op = tuple[Any, ...]
#: One key's result from one firing: (key, start, end, firing, its records as (port, value, ts) or its value)
Emission = tuple[Any, float, float, str, Any]

EVENT_SPECS: list[sl.WindowSpec] = [
    sl.TimeWindow(4, time="event"),
    sl.TimeWindow(4, slide=2, time="event", allowed_lateness=3),
    sl.TimeWindow(5, slide=1.5, offset=1, time="event", allowed_lateness=2.5),  # size not a whole number of slides
    sl.TimeWindow(4, time="event", allowed_lateness=2, early_firing=1.5),
    sl.SessionWindow(3, time="event"),
    sl.SessionWindow(2.5, time="event", allowed_lateness=3),
]
SPLITTABLE: list[sl.WindowSpec] = [
    *EVENT_SPECS,
    sl.TimeWindow(4),
    sl.TimeWindow(4, slide=1.5, offset=0.5),
    sl.TimeWindow(3, early_firing=1),
    sl.SessionWindow(3),
    sl.CountWindow(3, per_key=True),
    sl.CountWindow(4, slide=2, per_key=True),
]
FOLDS = st.sampled_from([None, "sum", "max", lambda acc, value: acc * 3 + value])
CODECS: dict[str, Callable[[Any], Any]] = {
    "raw": lambda data: data,
    "exact": lambda data: unpackb(packb(data)),
    "plain": lambda data: msgpack.unpackb(msgpack.packb(data), strict_map_key=False),  # tuples come back as lists
}


def fresh(spec: sl.WindowSpec, how: Any, snapshot: Any = None) -> WindowLogic:
    """The logic of ``spec`` folding with ``how`` (as window_reduce sets it up), restored from ``snapshot``."""
    logic = logic_for(spec)
    logic.fold = how
    if snapshot is not None:
        logic.restore(snapshot)
    return logic


def emissions(windows: list[ClosedWindow]) -> list[Emission]:
    """Each key's result in each window, in order: its records (port, value, ts) or its folded value."""
    out: list[Emission] = []
    for window in windows:
        records: dict[Any, list[tuple[int, Any, Any]]] = {}
        for port in sorted(window.records):
            for record in window.records[port]:
                records.setdefault(record[0], []).append((port, record[1], record[2]))
        out.extend((key, window.start, window.end, window.firing, tuple(got)) for key, got in records.items())
        out.extend(
            (key, window.start, window.end, window.firing, value) for key, value in (window.folded or {}).items()
        )
    return out


class Run:
    """One logic fed ops, taking only the records of the keys it keeps; what it emits, noted as it comes
    (window objects kept for lateness change later)."""

    def __init__(self, logic: WindowLogic, keep: Callable[[Any], bool] = lambda key: True) -> None:
        self.logic, self.keep = logic, keep
        self.out: list[Emission] = []
        self.late: list[tuple[Any, Any, Any]] = []

    def step(self, op: Op) -> list[Emission]:
        """Apply ``op``; the emissions it gave."""
        if op[0] == "add":
            _, now, port, records = op
            closed, late = self.logic.add(port, [r for r in records if self.keep(r[0])], now)
            self.late.extend((r[0], r[1], r[2]) for r in late)
        elif op[0] == "advance":
            closed = self.logic.advance(op[1])
        else:
            closed = self.logic.on_time(op[1])
        new = emissions(closed)
        self.out.extend(new)
        return new

    def finish(self) -> None:
        """End of stream."""
        self.out.extend(emissions(self.logic.close_all()))


def settled(out: list[Emission], spec: sl.WindowSpec) -> dict[tuple[Any, float, float], list[tuple[str, Any]]]:
    """Each key's results per window, in order, as they do not depend on which other keys an instance holds.

    Early firings are previews whose moments depend on the records an instance took: left out (their contents
    are checked against the whole as they come). A late firing of a time window re-sends every key it
    holds: a late result that repeats the key's previous one is such a ride-along, left out.
    """
    riders = isinstance(spec, sl.TimeWindow) and spec.allowed_lateness > 0
    results: dict[tuple[Any, float, float], list[tuple[str, Any]]] = {}
    for key, start, end, firing, content in out:
        sequence = results.setdefault((key, start, end), [])
        if firing == "early" or (riders and firing == "late" and sequence and sequence[-1][1] == content):
            continue
        sequence.append((firing, content))
    return results


def by_key(late: list[tuple[Any, Any, Any]]) -> dict[Any, list[tuple[Any, Any, Any]]]:
    """Late records per key, in order."""
    grouped: dict[Any, list[tuple[Any, Any, Any]]] = {}
    for record in late:
        grouped.setdefault(record[0], []).append(record)
    return grouped


def live(whole: WindowLogic, key: Any, start: float) -> Any:
    """What ``key`` holds now in the whole's open time window starting at ``start``."""
    window = whole.windows[whole.ticks.of(start)]  # type: ignore[attr-defined]
    return next(content for k, _, _, _, content in emissions([window]) if k == key)


def lockstep(whole: Run, runs: list[Run], ops: list[Op]) -> None:
    """Feed ``ops`` to the whole and to every part; each early result of a part is the whole's content now."""
    for op in ops:
        whole.step(op)
        for run in runs:
            for key, start, _, firing, content in run.step(op):
                if firing == "early":
                    assert content == live(whole.logic, key, start)


def keeps(owner: Callable[[Any], int], part: int) -> Callable[[Any], bool]:
    return lambda key: owner(key) == part


# -- generated streams ---------------------------------------------------------------------------------


def halves_after(base: float, halves: int) -> float:
    return base + halves / 2


@st.composite
def op_lists(draw: st.DrawFn) -> list[Op]:
    """Adds (records of several keys, event times around the watermark, some late), watermarks, clock ticks.

    Times are halves of seconds: exact in ticks, so bounds are exact too.
    """
    ops: list[Op] = []
    now, watermark = 100.0, 0.0
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(("add", "add", "advance", "tick")))
        now += draw(st.integers(0, 6)) / 2
        if kind == "add":
            record = st.builds(
                el,
                st.sampled_from(KEYS),
                st.integers(-5, 20),
                st.integers(-8, 12).map(partial(halves_after, watermark)),
            )
            ops.append(("add", now, draw(st.integers(0, 1)), draw(st.lists(record, min_size=1, max_size=5))))
        elif kind == "advance":
            watermark += draw(st.integers(0, 6)) / 2
            ops.append(("advance", watermark))
        else:
            ops.append(("tick", now))
    return ops


@st.composite
def owners(draw: st.DrawFn, parts: int) -> Callable[[Any], int]:
    """A key -> part mapping over :data:`KEYS`."""
    mapping = {key: draw(st.integers(0, parts - 1)) for key in KEYS}
    return mapping.__getitem__


# -- the properties -------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPLITTABLE, ids=repr)
@settings(max_examples=capped(40), deadline=None)
@given(data=st.data())
def test_parts_continued_on_their_keys_give_each_key_what_one_instance_gives(
    spec: sl.WindowSpec, data: st.DataObject
) -> None:
    """Split mid-stream, each part restored and fed its keys' records and every watermark and tick: the
    union of the parts' per-key results is the whole's, late records too, late counts summing up."""
    how, ops = data.draw(FOLDS), data.draw(op_lists())
    cut, parts = data.draw(st.integers(0, len(ops))), data.draw(st.integers(1, 3))
    home, owner = data.draw(st.integers(0, parts - 1)), data.draw(owners(parts))
    codec = CODECS[data.draw(st.sampled_from(sorted(CODECS)))]
    whole = Run(fresh(spec, how))
    for op in ops[:cut]:
        whole.step(op)
    shown, late = len(whole.out), len(whole.late)
    pieces = split_window_snapshot(spec, codec(whole.logic.snapshot()), owner, parts, home)
    runs = [Run(fresh(spec, how, codec(piece)), keeps(owner, i)) for i, piece in enumerate(pieces)]
    lockstep(whole, runs, ops[cut:])
    for run in [whole, *runs]:
        run.finish()
    # what came before the split goes first on both sides: a late result repeats the key's result before it
    assert settled(whole.out[:shown] + [e for run in runs for e in run.out], spec) == settled(whole.out, spec)
    assert by_key([r for run in runs for r in run.late]) == by_key(whole.late[late:])
    assert sum(run.logic.late for run in runs) == whole.logic.late


@pytest.mark.parametrize("spec", SPLITTABLE, ids=repr)
@settings(max_examples=capped(30), deadline=None)
@given(data=st.data())
def test_merging_the_parts_of_a_split_continues_as_the_snapshot_does(spec: sl.WindowSpec, data: st.DataObject) -> None:
    """merge(split(s)) restored gives every key exactly the results (early ones too) s restored gives."""
    how, ops = data.draw(FOLDS), data.draw(op_lists())
    cut, parts = data.draw(st.integers(0, len(ops))), data.draw(st.integers(1, 3))
    home, owner = data.draw(st.integers(0, parts - 1)), data.draw(owners(parts))
    codec = CODECS[data.draw(st.sampled_from(sorted(CODECS)))]
    original = Run(fresh(spec, how))
    for op in ops[:cut]:
        original.step(op)
    snapshot = codec(original.logic.snapshot())
    pieces = [codec(piece) for piece in split_window_snapshot(spec, snapshot, owner, parts, home)]
    again, merged = Run(fresh(spec, how, snapshot)), Run(fresh(spec, how, codec(merge_window_snapshots(spec, pieces))))
    for op in ops[cut:]:
        again.step(op)
        merged.step(op)
    again.finish()
    merged.finish()
    assert exact(merged.out) == exact(again.out)
    assert (merged.late, merged.logic.late) == (again.late, again.logic.late)


def exact(out: list[Emission]) -> dict[tuple[Any, float, float], list[tuple[str, Any]]]:
    """Every result of each key per window, in order (early and repeated ones included)."""
    results: dict[tuple[Any, float, float], list[tuple[str, Any]]] = {}
    for key, start, end, firing, content in out:
        results.setdefault((key, start, end), []).append((firing, content))
    return results


@pytest.mark.parametrize("spec", EVENT_SPECS, ids=repr)
@settings(max_examples=capped(40), deadline=None)
@given(data=st.data())
def test_merging_parts_that_saw_different_watermarks_neither_drops_nor_doubles(
    spec: sl.WindowSpec, data: st.DataObject
) -> None:
    """Split; the parts go on, one of them takes one more watermark than the others; merged, the logic
    takes the rest. Every key's results are the whole's: a window one part fired and another still held
    open fires the open part's keys once, and late firings hold what they should."""
    how, ops = data.draw(FOLDS), data.draw(op_lists())
    cut = data.draw(st.integers(0, len(ops)))
    joined = data.draw(st.integers(cut, len(ops)))
    parts = data.draw(st.integers(2, 3))
    owner, ahead = data.draw(owners(parts)), data.draw(st.integers(0, parts - 1))
    codec = CODECS[data.draw(st.sampled_from(sorted(CODECS)))]
    seen = [op[1] for op in ops[:joined] if op[0] == "advance"]
    further = ("advance", max(seen, default=0.0) + data.draw(st.integers(0, 8)) / 2)
    whole = Run(fresh(spec, how))
    for op in ops[:cut]:
        whole.step(op)
    shown, late = len(whole.out), len(whole.late)
    pieces = split_window_snapshot(spec, codec(whole.logic.snapshot()), owner, parts, ahead)
    runs = [Run(fresh(spec, how, codec(piece)), keeps(owner, i)) for i, piece in enumerate(pieces)]
    lockstep(whole, runs, ops[cut:joined])
    lockstep(whole, [runs[ahead]], [further])  # only one part saw it before the merge
    snapshots = [codec(run.logic.snapshot()) for run in runs]
    merged = Run(fresh(spec, how, codec(merge_window_snapshots(spec, snapshots))))
    lockstep(whole, [merged], ops[joined:])
    whole.finish()
    merged.finish()
    together = whole.out[:shown] + [e for run in [*runs, merged] for e in run.out]
    assert settled(together, spec) == settled(whole.out, spec)
    assert by_key([r for run in [*runs, merged] for r in run.late]) == by_key(whole.late[late:])
    assert merged.logic.late == whole.logic.late


# -- exact examples ---------------------------------------------------------------------------------------

LATE_5 = sl.TimeWindow(10, time="event", allowed_lateness=5)
BY_LETTER = {"a": 0, "b": 1}.__getitem__


def spans(windows: list[ClosedWindow]) -> list[tuple[float, float, str, list[tuple[Any, Any]]]]:
    """``(start, end, firing, [(key, value)...])`` of every window (folded values or records)."""
    shown = []
    for window in windows:
        got = list((window.folded or {}).items()) or [(r[0], r[1]) for r in window.all_records()]
        shown.append((window.start, window.end, window.firing, got))
    return shown


def test_a_split_event_time_window_goes_to_the_parts_of_its_keys_with_the_late_count_at_home() -> None:
    """Open and fired-but-kept windows are cut per key; the watermark goes to both parts, the late count to
    home; a late record then fires its part's keys only."""
    logic = fresh(LATE_5, None)
    logic.add(0, [el("a", 1, 1.0), el("b", 2, 2.0), el("a", 3, 12.0), el("b", 4, 14.0)], 100)
    assert spans(logic.advance(10)) == [(0.0, 10.0, "on_time", [("a", 1), ("b", 2)])]
    assert logic.add(0, [el("b", 9, -10.0)], 101)[1] == [el("b", 9, -10.0)]  # past lateness
    mine, yours = split_window_snapshot(LATE_5, logic.snapshot(), BY_LETTER, 2, home=1)
    assert (mine["late"], yours["late"], mine["watermark"], yours["watermark"]) == (0, 1, 10000, 10000)
    a, b = fresh(LATE_5, None, mine), fresh(LATE_5, None, yours)
    closed, late = a.add(0, [el("a", 5, 3.0)], 102)
    assert (spans(closed), late) == ([(0.0, 10.0, "late", [("a", 1), ("a", 5)])], [])
    assert spans(b.advance(20)) == [(10.0, 20.0, "on_time", [("b", 4)])]
    assert spans(a.close_all()) == [(10.0, 20.0, "on_time", [("a", 3)])]


@pytest.mark.parametrize("codec", ["raw", "exact"])
def test_tuple_keys_and_values_stay_tuples(codec: str) -> None:
    """Records keep their types through a split and a merge."""
    spec = sl.TimeWindow(10, time="event", allowed_lateness=5)
    logic = fresh(spec, None)
    logic.add(0, [el(("u", 1), ("x", 1), 1.0), el(("u", 2), ("y", 2), 12.0)], 100)
    logic.advance(10)
    owner = {("u", 1): 0, ("u", 2): 1}.__getitem__
    pieces = [
        CODECS[codec](piece) for piece in split_window_snapshot(spec, CODECS[codec](logic.snapshot()), owner, 2, 0)
    ]
    restored = fresh(spec, None, CODECS[codec](merge_window_snapshots(spec, pieces)))
    closed, _ = restored.add(0, [el(("u", 1), ("z", 3), 2.0)], 101)
    assert spans(closed) == [(0.0, 10.0, "late", [(("u", 1), ("x", 1)), (("u", 1), ("z", 3))])]
    assert spans(restored.close_all()) == [(10.0, 20.0, "on_time", [(("u", 2), ("y", 2))])]


def test_split_by_a_segment_table_gives_each_instance_the_keys_it_owns() -> None:
    """Owners from ``SegmentTable.owner_function()``: per-key count windows go to their keys' instances."""
    spec = sl.CountWindow(2, per_key=True)
    logic = fresh(spec, "sum")
    logic.add(0, [el(key, 1) for key in KEYS], 0.0)
    table = SegmentTable.contiguous(8, 2).rescaled(3)
    pieces = split_window_snapshot(spec, logic.snapshot(), table.owner_function(), 3, 0)
    held = [fresh(spec, "sum", piece).close_all() for piece in pieces]
    assert [sorted(repr(key) for window in part for key in window.folded or {}) for part in held] == [
        sorted(repr(key) for key in KEYS if table.owner(key) == part) for part in range(3)
    ]


def test_split_keeps_the_early_firing_schedule_and_dirty_windows() -> None:
    """An early firing due at the split comes from each part, with its keys: together the whole's."""
    spec = sl.TimeWindow(10, time="event", early_firing=2)
    logic = fresh(spec, "sum")
    logic.add(0, [el("a", 1, 1.0), el("b", 2, 2.0)], 100.0)
    mine, yours = (fresh(spec, "sum", p) for p in split_window_snapshot(spec, logic.snapshot(), BY_LETTER, 2, 0))
    assert mine.next_deadline() == yours.next_deadline() == logic.next_deadline() == 102.0
    assert spans(mine.on_time(102.0)) == [(0.0, 10.0, "early", [("a", 1)])]
    assert spans(yours.on_time(102.0)) == [(0.0, 10.0, "early", [("b", 2)])]
    assert spans(logic.on_time(102.0)) == [(0.0, 10.0, "early", [("a", 1), ("b", 2)])]


def test_a_restored_logic_keeps_its_early_firing_schedule() -> None:
    """The next early firing is part of the snapshot: a restored logic fires it when the original would."""
    spec = sl.TimeWindow(10, early_firing=2)
    logic = fresh(spec, None)
    logic.add(0, [el("a", 1)], 100.5)
    restored = fresh(spec, None, CODECS["plain"](logic.snapshot()))
    assert restored.next_deadline() == 102.5
    assert spans(restored.on_time(102.5)) == spans(logic.on_time(102.5)) == [(100.0, 110.0, "early", [("a", 1)])]


def test_windows_with_the_same_bounds_merge_into_one() -> None:
    """Two instances' open windows of one span become one window holding both key sets: it fires once."""
    spec = sl.TimeWindow(10)
    first, second = fresh(spec, None), fresh(spec, None)
    first.add(0, [el("a", 1)], 100.0)
    second.add(0, [el("b", 2)], 101.0)
    second.add(1, [el("b", 3)], 101.0)
    merged = fresh(spec, None, merge_window_snapshots(spec, [first.snapshot(), second.snapshot()]))
    [window] = merged.on_time(110.0)
    assert (window.start, window.end, window.records) == (100.0, 110.0, {
        0: [el("a", 1), el("b", 2)], 1: [el("b", 3)]
    })  # fmt: skip


# -- merging instances that saw different watermarks -------------------------------------------------------


def behind_and_ahead(spec: sl.WindowSpec, how: Any = None) -> tuple[WindowLogic, WindowLogic]:
    """Keys a and b in [0, 10): the part of b took watermark 10 (it fired b), the part of a did not."""
    logic = fresh(spec, how)
    logic.add(0, [el("a", 1, 1.0), el("b", 2, 2.0)], 100.0)
    behind, ahead = (fresh(spec, how, p) for p in split_window_snapshot(spec, logic.snapshot(), BY_LETTER, 2, 0))
    assert spans(ahead.advance(10)) == [(0.0, 10.0, "on_time", [("b", 2)])]
    return behind, ahead


def test_a_window_one_part_fired_and_the_other_held_open_fires_the_open_keys_once() -> None:
    """Merged, the watermark is the larger: a's window is overdue, due at once, and fires on time before
    the first record is placed; the late record for b then fires the window with both keys' records."""
    behind, ahead = behind_and_ahead(LATE_5)
    merged = fresh(LATE_5, None, merge_window_snapshots(LATE_5, [behind.snapshot(), ahead.snapshot()]))
    assert merged.next_deadline() == -math.inf
    closed, late = merged.add(0, [el("b", 7, 3.0)], 102.0)
    assert spans(closed) == [
        (0.0, 10.0, "on_time", [("a", 1)]),
        (0.0, 10.0, "late", [("b", 2), ("a", 1), ("b", 7)]),
    ]
    assert (late, merged.next_deadline(), spans(merged.advance(10)), spans(merged.on_time(103.0))) == ([], None, [], [])
    assert spans(merged.advance(15)) == []  # the kept window expires
    assert merged.add(0, [el("a", 8, 4.0)], 104.0) == ([], [el("a", 8, 4.0)])
    assert merged.close_all() == []


@pytest.mark.parametrize(
    "catch_up",
    [
        lambda logic: logic.advance(10),  # a watermark already passed
        lambda logic: logic.advance(12),
        lambda logic: logic.on_time(0.0),
        lambda logic: logic.add(0, [], 0.0)[0],
        lambda logic: logic.close_all(),
    ],
    ids=["same-watermark", "later-watermark", "on_time", "add", "close_all"],
)
@pytest.mark.parametrize("spec", [LATE_5, sl.TimeWindow(10, time="event")], ids=["lateness", "no-lateness"])
def test_whatever_the_merged_logic_does_first_fires_the_overdue_window(
    spec: sl.WindowSpec, catch_up: Callable[[WindowLogic], list[ClosedWindow]]
) -> None:
    """The overdue window fires on time, once, whichever call comes first."""
    behind, ahead = behind_and_ahead(spec, "sum")
    merged = fresh(spec, "sum", merge_window_snapshots(spec, [ahead.snapshot(), behind.snapshot()]))
    assert spans(catch_up(merged)) == [(0.0, 10.0, "on_time", [("a", 1)])]
    assert spans(merged.advance(20)) == spans(merged.close_all()) == []


def test_sessions_of_parts_that_saw_different_watermarks() -> None:
    """Sessions: a's, open behind the merged watermark 7, fires on time first and is kept; b's, fired and kept,
    takes a late record; c's and d's expired at 7, so records that would have joined them are late."""
    spec = sl.SessionWindow(4, time="event", allowed_lateness=3)
    logic = fresh(spec, None)
    logic.add(0, [el(key, value, ts) for key, value, ts in [("a", 1, 1), ("b", 2, 2), ("c", 3, 0), ("d", 9, -1)]], 100)
    owner = {"a": 0, "b": 1, "c": 1, "d": 0}.__getitem__
    behind, ahead = (fresh(spec, None, p) for p in split_window_snapshot(spec, logic.snapshot(), owner, 2, 0))
    # c's session ends 4: fired at 7 and, its lateness over, not kept; b's is kept until 9
    assert spans(ahead.advance(7)) == [(0.0, 4.0, "on_time", [("c", 3)]), (2.0, 6.0, "on_time", [("b", 2)])]
    # the part of a and d saw only watermark 4: d's session is kept until 6, a's is open
    assert spans(behind.advance(4)) == [(-1.0, 3.0, "on_time", [("d", 9)])]
    merged = fresh(spec, None, merge_window_snapshots(spec, [behind.snapshot(), ahead.snapshot()]))
    closed, late = merged.add(
        0, [el(k, v, ts) for k, v, ts in [("b", 4, 3), ("a", 5, 2), ("c", 6, 0), ("d", 10, 0)]], 101
    )
    assert spans(closed) == [
        (1.0, 5.0, "on_time", [("a", 1)]),
        (2.0, 7.0, "late", [("b", 2), ("b", 4)]),  # stretched to 7: still behind the watermark
        (1.0, 6.0, "late", [("a", 1), ("a", 5)]),
    ]
    assert late == [el("c", 6, 0), el("d", 10, 0)]  # d's session expired at the catch-up


def test_session_ranks_are_renumbered_in_their_order() -> None:
    """Two parts both gave rank 0 to a new key: merged, ranks are distinct and keep the parts' order."""
    spec = sl.SessionWindow(5)
    first, second = fresh(spec, None), fresh(spec, None)
    first.add(0, [el("x", 1), el("y", 2)], 100.0)
    second.add(0, [el("z", 3)], 100.0)
    merged = merge_window_snapshots(spec, [first.snapshot(), second.snapshot()])
    assert [(key, rank) for key, rank, _ in merged["sessions"]] == [("x", 0), ("z", 1), ("y", 2)]
    assert merged["next_rank"] == 3
    assert [w.all_records()[0][0] for w in fresh(spec, None, merged).on_time(105.0)] == ["x", "z", "y"]


# -- what cannot be split, and misuse ----------------------------------------------------------------------


def test_unsplittable_names_the_whole_instance_counts() -> None:
    """Count windows over an instance's records and count-or-time windows cannot follow keys."""
    assert unsplittable(sl.CountWindow(3)) == (
        "a CountWindow(per_key=False) counts all of an instance's records, not a key's; "
        "use CountWindow(..., per_key=True) to rescale it"
    )
    assert "CountOrTimeWindow counts all of an instance's records" in str(unsplittable(sl.CountOrTimeWindow(3, 5)))
    assert [unsplittable(spec) for spec in SPLITTABLE] == [None] * len(SPLITTABLE)


def test_an_instance_count_window_splits_only_while_empty() -> None:
    """CountWindow(3): refused with an open window; empty, it splits into empty copies, its count at home."""
    spec = sl.CountWindow(3)
    logic = fresh(spec, None)
    logic.add(0, [el("a", 1), el("b", 2)], 0.0)
    with pytest.raises(ValueError, match=r"^a CountWindow\(per_key=False\) counts all"):
        split_window_snapshot(spec, logic.snapshot(), BY_LETTER, 2, 0)
    logic.add(0, [el("a", 3)], 0.0)  # the window closed: nothing open
    assert split_window_snapshot(spec, logic.snapshot(), BY_LETTER, 2, 1) == [
        {"seen": 0, "open": []},
        {"seen": 3, "open": []},
    ]


def test_merged_count_windows_number_records_after_the_empty_instances() -> None:
    """One instance holds an open window, the other counted 3 records: merged, the window's indexes follow
    those 3; two instances holding open windows cannot be merged."""
    spec = sl.CountWindow(3)
    empty, holding = fresh(spec, None), fresh(spec, None)
    empty.add(0, [el("a", n) for n in range(3)], 0.0)
    holding.add(0, [el("b", 10), el("b", 11)], 0.0)
    merged = fresh(spec, None, merge_window_snapshots(spec, [empty.snapshot(), holding.snapshot()]))
    closed, _ = merged.add(0, [el("b", 12)], 0.0)
    assert spans(closed) == [(3, 6, "on_time", [("b", 10), ("b", 11), ("b", 12)])]
    with pytest.raises(ValueError, match="2 of the snapshots hold open windows"):
        merge_window_snapshots(spec, [holding.snapshot(), holding.snapshot()])


def test_a_count_or_time_window_splits_only_without_a_current_window() -> None:
    """CountOrTimeWindow: refused while a window is open, empty copies once it closed."""
    spec = sl.CountOrTimeWindow(2, 5.0)
    logic = fresh(spec, None)
    logic.add(0, [el("a", 1)], 0.0)
    with pytest.raises(ValueError, match="CountOrTimeWindow counts all"):
        split_window_snapshot(spec, logic.snapshot(), BY_LETTER, 2, 0)
    logic.on_time(5.0)
    pieces = split_window_snapshot(spec, logic.snapshot(), BY_LETTER, 2, 0)
    assert [piece["current"] for piece in pieces] == [None, None]
    merged = fresh(spec, None, merge_window_snapshots(spec, pieces))
    assert spans(merged.add(0, [el("b", 1), el("b", 2)], 6.0)[0]) == [(6.0, 6.0, "on_time", [("b", 1), ("b", 2)])]


def test_misuse_is_refused() -> None:
    """A home outside the parts, an owner outside them, a key in two snapshots, nothing to merge."""
    spec = sl.SessionWindow(5)
    logic = fresh(spec, None)
    logic.add(0, [el("a", 1)], 100.0)
    with pytest.raises(ValueError, match="home part 2 is not one of the 2 parts"):
        split_window_snapshot(spec, logic.snapshot(), BY_LETTER, 2, 2)
    with pytest.raises(ValueError, match=r"owner\('a'\) gave 5, not one of the 2 parts"):
        split_window_snapshot(spec, logic.snapshot(), lambda key: 5, 2, 0)
    with pytest.raises(ValueError, match="key 'a' is in more than one window snapshot"):
        merge_window_snapshots(spec, [logic.snapshot(), logic.snapshot()])
    timed = fresh(LATE_5, "sum")
    timed.add(0, [el("a", 1, 1.0)], 100.0)
    with pytest.raises(ValueError, match="key 'a' is in more than one window snapshot"):
        merge_window_snapshots(LATE_5, [timed.snapshot(), timed.snapshot()])
    with pytest.raises(ValueError, match="no window snapshot to merge"):
        merge_window_snapshots(spec, [])
