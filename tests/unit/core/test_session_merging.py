"""Event-time sessions at scale: many out-of-order records against a simple reference, the bulk firing of
``window_reduce`` results (``emits_results``) against one window at a time, and jobs that checkpoint or
rescale in the middle of open sessions."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamlet as sl
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.windows.build import logic_for
from streamlet.core.windows.fold import ClosedWindow, WindowLogic
from tests.spec.budget import capped
from tests.support.elements import el

pytestmark = pytest.mark.usefixtures("each_state_backend")  # open windows in memory, then on RocksDB

GAP = 3
KEYS = st.sampled_from(["a", "b", ("t", 1), 7])
#: (key, value, ts) in whole seconds: sessions of int timestamps have int bounds, as the reference's
WHOLE_RECORDS = st.lists(st.tuples(KEYS, st.integers(-5, 20), st.integers(0, 60)), max_size=60)
CUTS = st.lists(st.integers(0, 60), max_size=6)  # where a stream is cut into batches
SPECS = [
    sl.SessionWindow(3, time="event"),
    sl.SessionWindow(2.5, time="event", allowed_lateness=3),
    sl.SessionWindow(2, time="event", allowed_lateness=1.5, time_unit=0.5),
]
FOLDS = ["sum", "count", "min", "max", lambda acc, value: acc * 3 + value]
#: (key, value, ts): ts missing (the clock's now), in whole seconds, or in halves
RECORD = st.tuples(
    KEYS, st.integers(-5, 20), st.one_of(st.none(), st.integers(0, 40), st.integers(0, 80).map(lambda n: n / 2))
)
#: ("add", now, records) | ("advance", watermark) | ("tick", now): on_time(now)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 40).map(float), st.lists(RECORD, max_size=8)),
        st.tuples(st.just("advance"), st.integers(-4, 100).map(lambda n: n / 2)),
        st.tuples(st.just("tick"), st.integers(0, 60).map(float)),
    ),
    max_size=14,
)


def folding(spec: sl.SessionWindow, how: Any, emits_results: bool = False) -> WindowLogic:
    """The logic of ``spec`` folding with ``how``, as a window_reduce task instance sets it up."""
    logic = logic_for(spec)
    logic.fold, logic.emits_results = how, emits_results
    return logic


def batches(records: list[Any], cuts: list[int]) -> list[list[Any]]:
    """``records`` as elements, cut into batches at ``cuts``."""
    bounds = [0, *sorted({cut for cut in cuts if 0 < cut < len(records)}), len(records)]
    return [[el(*record) for record in records[a:b]] for a, b in itertools.pairwise(bounds)]


def reference(records: list[tuple[Any, int, int]], gap: int) -> list[tuple[Any, int, int, int]]:
    """(key, start, end, sum) of every session, by end, start and the order keys first came: per key, records
    sorted by time, each joining the session before it when it is within the gap of that session's end."""
    by_key: dict[Any, list[tuple[int, int]]] = {}
    for key, value, ts in records:
        by_key.setdefault(key, []).append((ts, value))
    found = []
    for rank, (key, held) in enumerate(by_key.items()):
        sessions: list[list[int]] = []
        for ts, value in sorted(held):
            if sessions and ts <= sessions[-1][1]:
                sessions[-1][1] = max(sessions[-1][1], ts + gap)
                sessions[-1][2] += value
            else:
                sessions.append([ts, ts + gap, value])
        found += [(end, start, rank, key, total) for start, end, total in sessions]
    return [(key, start, end, total) for end, start, _, key, total in sorted(found, key=lambda s: s[:3])]


def summed(windows: list[ClosedWindow]) -> list[tuple[Any, Any, Any, Any]]:
    """(key, start, end, value) of every folded window."""
    return [(key, w.start, w.end, value) for w in windows for key, value in (w.folded or {}).items()]


def results(logic: WindowLogic, windows: list[ClosedWindow]) -> list[Any]:
    """The elements a window_reduce task emits for ``windows``: those the logic made, or those the task instance
    makes of each window (``TaskInstance._folded_results``)."""
    out: list[Any] = []
    for window in windows:
        if window.results is not None:
            out += window.results
        else:
            stamp = logic.result_ts(window)
            bounds = (window.start, window.end)
            out += [(key, value, stamp, 0, bounds, window.firing) for key, value in (window.folded or {}).items()]
    return out


def drive(logic: WindowLogic, ops: list[Any]) -> list[str]:
    """Every op's results and late records, and at the end close_all's and the late count, as reprs (so an int
    bound and a float one differ)."""
    out = []
    for op in ops:
        if op[0] == "add":
            closed, late = logic.add(0, [el(*record) for record in op[2]], op[1])
            out.append(repr((results(logic, closed), late)))
        elif op[0] == "advance":
            out.append(repr(results(logic, logic.advance(op[1]))))
        else:
            out.append(repr((results(logic, logic.on_time(op[1])), logic.next_deadline())))
    return out


def finish(logic: WindowLogic) -> list[str]:
    """close_all's results and the late count."""
    return [repr(results(logic, logic.close_all())), repr(logic.late)]


# -- against the reference ------------------------------------------------------------------------


@settings(max_examples=capped(200), deadline=None)
@given(records=WHOLE_RECORDS, cuts=CUTS)
def test_out_of_order_records_merge_into_the_reference_sessions(records: list[Any], cuts: list[int]) -> None:
    """Records in any order, in any batches, closed at end of stream: the reference's sessions, sums and order."""
    logic = folding(sl.SessionWindow(GAP, time="event"), "sum")
    for batch in batches(records, cuts):
        assert logic.add(0, batch, 0.0) == ([], [])
    assert summed(logic.close_all()) == reference(records, GAP)


@settings(max_examples=capped(200), deadline=None)
@given(records=WHOLE_RECORDS, cuts=CUTS)
def test_kept_records_of_merged_sessions_are_the_reference_sessions_records(
    records: list[Any], cuts: list[int]
) -> None:
    """Without a fold each session holds its records: those the reference puts in it, each once."""
    logic = logic_for(sl.SessionWindow(GAP, time="event"))
    for batch in batches(records, cuts):
        logic.add(0, batch, 0.0)
    got = [
        (w.all_records()[0][0], w.start, w.end, sorted(r[1] for r in w.all_records()), len(w.all_records()))
        for w in logic.close_all()
    ]
    by_session = [
        (key, start, end, sorted(v for k, v, ts in records if k == key and start <= ts < end))
        for key, start, end, _ in reference(records, GAP)
    ]
    assert got == [(*session, len(session[3])) for session in by_session]


@settings(max_examples=capped(200), deadline=None)
@given(records=WHOLE_RECORDS, cuts=CUTS)
def test_watermarks_behind_every_later_record_fire_the_reference_sessions(records: list[Any], cuts: list[int]) -> None:
    """A watermark after each batch just below every record still to come: nothing is late, each session fires
    once, complete, and each watermark's firings go by end then start."""
    logic = folding(sl.SessionWindow(GAP, time="event"), "sum", emits_results=True)
    fired: list[tuple[Any, Any, Any, Any]] = []
    parts = batches(records, cuts)
    for index, batch in enumerate(parts[:-1]):  # after the last, end of stream closes what is open
        assert logic.add(0, batch, 0.0) == ([], [])
        later = [record[2] for part in parts[index + 1 :] for record in part]
        elements = results(logic, logic.advance(min(later) - 0.001))
        assert [e[4] for e in elements] == sorted((e[4] for e in elements), key=lambda b: (b[1], b[0]))
        fired += [(e[0], e[4][0], e[4][1], e[1]) for e in elements]
    assert logic.add(0, parts[-1], 0.0) == ([], [])
    fired += [(e[0], e[4][0], e[4][1], e[1]) for e in results(logic, logic.close_all())]
    assert sorted(fired, key=repr) == sorted(reference(records, GAP), key=repr)


# -- the bulk path against one window at a time ------------------------------------------------------


@settings(max_examples=capped(300), deadline=None)
@given(ops=OPS, spec=st.sampled_from(SPECS), how=st.sampled_from(FOLDS))
def test_bulk_results_are_what_window_reduce_makes_of_each_window(ops: list[Any], spec: Any, how: Any) -> None:
    """With emits_results, every call hands over exactly the elements (types of bounds included) the task
    instance makes of the windows the logic gives one at a time: late records, lateness and late firings too."""
    single, bulk = folding(spec, how), folding(spec, how, emits_results=True)
    assert [*drive(bulk, ops), *finish(bulk)] == [*drive(single, ops), *finish(single)]


def test_one_watermark_hands_every_session_it_passed_over_as_one_window() -> None:
    """Three keys' sessions passed by one watermark: one window, their results in firing order."""
    logic = folding(sl.SessionWindow(10, time="event"), "sum", emits_results=True)
    logic.add(0, [el("b", 1, 2.0), el("a", 2, 0.0), el("c", 3, 2.0), el("a", 4, 5.0)], 0.0)
    [window] = logic.advance(30.0)
    assert (window.start, window.end, window.folded, window.records) == (2.0, 15.0, None, {})
    assert window.results == [
        ("b", 1, 11.999, 0, (2.0, 12.0), "on_time"),
        ("c", 3, 11.999, 0, (2.0, 12.0), "on_time"),
        ("a", 6, 14.999, 0, (0.0, 15.0), "on_time"),
    ]


# -- checkpoints -------------------------------------------------------------------------------------


@settings(max_examples=capped(200), deadline=None)
@given(ops=OPS, cut=st.integers(0, 14), spec=st.sampled_from(SPECS), how=st.sampled_from(FOLDS))
def test_a_logic_restored_mid_session_continues_exactly(ops: list[Any], cut: int, spec: Any, how: Any) -> None:
    """Snapshot (exactly encoded) at any point, restored into a new logic: the rest is what the original gives."""
    original = folding(spec, how, emits_results=True)
    drive(original, ops[:cut])
    restored = folding(spec, how, emits_results=True)
    restored.restore(unpackb(packb(original.snapshot())))
    assert [*drive(restored, ops[cut:]), *finish(restored)] == [*drive(original, ops[cut:]), *finish(original)]


def test_a_snapshot_in_the_layout_of_earlier_versions_restores() -> None:
    """The snapshot layout is the one earlier versions wrote: its open session, int bounds and fold go on."""
    window = [1, 11, [], [["a", 5]], 1]  # start, end, records per port, folded (key, value) pairs, last ts
    snapshot = {"sessions": [["a", 0, [[1000, 11000, False, window]]]], "next_rank": 1, "late": 0, "watermark": 2000}
    logic = folding(sl.SessionWindow(10, time="event"), "sum", emits_results=True)
    logic.restore(snapshot)
    assert logic.snapshot() == snapshot
    assert logic.add(0, [el("a", 2, 3)], 0.0) == ([], [])
    [fired] = logic.advance(20)
    assert repr(fired.results) == repr([("a", 7, 12.999, 0, (1, 13), "on_time")])


# -- jobs ----------------------------------------------------------------------------------------------


def stamped(index: int) -> float:
    """Event time of the index-th record: 50 a second, with a pause of 3 s (more than the gap) every 500."""
    return index / 50 + (index // 500) * 3


def session_sums(parallelism: int = 2) -> sl.Topology:
    """QueueSource (watermarks, no disorder) -> window_reduce sum per event-time session of 1 s -> sink."""
    topology = sl.Topology("session-sums")
    source = topology.add_source("in", sl.QueueSource(), watermarks=sl.Watermarks(out_of_orderness=0))
    window = sl.SessionWindow(1, time="event")
    sums = topology.window_reduce("sums", "sum", window, parallelism=parallelism)
    sums.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    return topology


def found(records: list[sl.Record]) -> list[tuple[Any, Any, Any, Any]]:
    """(key, window, value, ts) of every result, sorted."""
    return sorted((r.key, r.window, r.value, r.ts) for r in records)


async def run_sessions(rescales: dict[int, int]) -> list[tuple[Any, Any, Any, Any]]:
    """3000 records of 13 keys through :func:`session_sums`, rescaled to ``rescales[i]`` before record i."""
    async with sl.start(session_sums()) as job:
        for index in range(3000):
            if index in rescales:
                await job.rescale("sums", rescales[index])
            await job.send("in", f"k{index % 13}", index, ts=stamped(index))
    return found((await job.wait()).sink("out"))


async def test_sessions_open_across_rescales_give_the_results_of_a_run_without() -> None:
    """Sessions open while the task rescales 2 -> 4 -> 1 -> 3 move with their keys: every sum as without."""
    expected = await run_sessions({})
    assert len(expected) == 13 * 6
    assert sum(value for _, _, value, _ in expected) == sum(range(3000))
    assert await run_sessions({700: 4, 1600: 1, 2200: 3}) == expected


class Crash(sl.Task):
    """Passes records on; a record keyed ``"crash"`` makes it raise."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        batch = inputs.get()
        if any(record.key == "crash" for record in batch):
            raise RuntimeError("injected crash")
        outputs.emit_batch(batch)


def crashing_session_sums(seen: list[sl.Record]) -> sl.Topology:
    """QueueSource -> crash -> window_reduce sum per event-time session of 1 s -> a sink appending to ``seen``."""
    topology = sl.Topology("crashing-sessions")
    source = topology.add_source("in", sl.QueueSource(), watermarks=sl.Watermarks(out_of_orderness=0))
    passed = topology.add_task("crash", Crash).set_input(source)
    sums = topology.window_reduce("sums", "sum", sl.SessionWindow(1, time="event")).set_input(passed)
    topology.add_sink("out", seen.append).set_input(sums)
    return topology


async def send_stamped(job: sl.Job, indexes: range) -> None:
    for index in indexes:
        await job.send("in", f"k{index % 13}", index, ts=stamped(index))


async def crash_after_a_checkpoint(checkpoints: Path, sent: int, seen: list[sl.Record]) -> None:
    """Send the first ``sent`` records, checkpoint in the middle of open sessions, then crash."""
    async with sl.start(crashing_session_sums(seen), checkpoint_dir=checkpoints) as job:
        await send_stamped(job, range(sent))
        await job.settle()
        await job.checkpoint()
        await job.send("in", "crash", 0, ts=stamped(sent))
        await job.wait()


async def test_sessions_open_at_a_checkpoint_resume_with_exact_sums(tmp_path: Path) -> None:
    """Checkpoint with sessions open, crash, resume: the sums fired before and after are those of one run."""
    expected: list[sl.Record] = []
    async with sl.start(crashing_session_sums(expected)) as job:
        await send_stamped(job, range(2000))
    await job.wait()
    checkpoints = tmp_path / "checkpoints"
    before: list[sl.Record] = []
    after: list[sl.Record] = []
    with pytest.raises(sl.TaskError, match=r"^task 'crash' instance 0 failed on record with key 'crash'"):
        await crash_after_a_checkpoint(checkpoints, 1250, before)
    async with sl.start(crashing_session_sums(after), checkpoint_dir=checkpoints) as job:
        await send_stamped(job, range(1250, 2000))
    await job.wait()
    assert (len(before), len(after)) == (13 * 2, 13 * 2)  # the sessions of records 0-999 fired before the crash
    assert found(before + after) == found(expected)
