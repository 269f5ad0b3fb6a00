"""Differential tests of windowing on event time against the brute-force models of ``models/windows.py``.

Random keyed records (out of order, equal timestamps, late ones) go through ``window_reduce`` in streamlet and
through the model; the results (key, value, window, firing, ts) of each key, in order, and the late records must
be the same (with one instance, the whole order too, up to the order of the keys of one window firing at one
moment, which the page does not say). Watermarks are deterministic:
one source instance whose watermark moves after each batch of ``batch_size`` records (the newest ts minus
``out_of_orderness``, or a punctuation ``fn``), or a ``QueueSource`` fed one record at a time with
``job.settle()`` between (the early-firing test, whose ticks are ``ManualClock`` steps).

Each disagreement the differential runs found, reduced to a minimal example, is a test of its own (the end of
this file): late firings per record and per key, early firings per key (streamlet was fixed); a count window's
result ts and the offset's range (the page was made to say what streamlet does)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import streamlet as sl
from tests.spec.budget import examples
from tests.spec.models import windows as model

KEYS: list[Any] = ["a", "b", 7, ("t", 1)]
GRIDS = {"ms": (1, None), "tenth": (10, 0.1), "quarter": (4, 0.25)}  # grid units per second, time_unit


def _t(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def concat(acc: Any, value: Any) -> Any:
    """A fold that is not commutative: the values in the order they were folded."""
    return (*_t(acc), value)


def bag(acc: Any, value: Any) -> Any:
    """An associative, commutative fold for sessions (merged sessions fold their folds): every value, sorted."""
    return tuple(sorted(_t(acc) + _t(value)))


HOWS = ["sum", "count", "min", "max", "fn"]


# ----------------------------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    grid: str
    records: list[tuple[Any, int, float]]  # (key, value, ts)
    batch_size: int
    out_of_orderness: float
    hints: dict[int, float] | None  # value -> watermark hint, for Watermarks(fn=...)
    parallelism: int
    how: str
    late_port: bool
    window: dict[str, Any] = field(default_factory=dict)

    def time_unit(self) -> dict[str, float]:
        unit = GRIDS[self.grid][1]
        return {} if unit is None else {"time_unit": unit}

    def model_records(self) -> list[model.Rec]:
        return [model.Rec(i, key, value, ts) for i, (key, value, ts) in enumerate(self.records)]

    def trace(self) -> list[model.Event]:
        hints = self.hints
        fn = None if hints is None else (lambda rec: hints.get(rec.value))
        return model.source_trace(self.model_records(), self.batch_size, self.out_of_orderness, fn)

    def watermarks(self) -> sl.Watermarks:
        if self.hints is None:
            return sl.Watermarks(out_of_orderness=self.out_of_orderness)
        hints = self.hints
        return sl.Watermarks(fn=lambda record: hints.get(record.value))


@st.composite
def timed_records(draw: st.DrawFn, max_records: int = 30) -> list[tuple[Any, int, int]]:
    """(key, value, ts in grid units): a front moving forward, most records near it, some far behind."""
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    n = draw(st.integers(0, max_records))
    front, records = draw(st.integers(0, 5)), []
    for i in range(n):
        front += draw(st.sampled_from([0, 0, 1, 1, 2, 3, 5]))
        lag = draw(st.one_of(st.just(0), st.integers(0, 4), st.integers(0, 30)))
        value = draw(st.integers(-20, 20)) * 100 + i  # distinct, so a watermark fn can look a record up
        records.append((draw(st.sampled_from(keys)), value, max(0, front - lag)))
    return records


@st.composite
def scenarios(draw: st.DrawFn, parallelism: Sequence[int] = (1, 3), max_records: int = 30) -> Scenario:
    grid = draw(st.sampled_from(sorted(GRIDS)))
    per = GRIDS[grid][0]
    raw = draw(timed_records(max_records))
    records = [(key, value, ts / per) for key, value, ts in raw]
    hints = None
    if draw(st.booleans()):  # punctuated: some records say where event time has reached
        top = max([ts for _, _, ts in raw], default=0) + 10
        hints = {value: draw(st.integers(0, top)) / per for _, value, _ in raw if draw(st.integers(0, 3)) == 0}
    return Scenario(
        grid=grid,
        records=records,
        batch_size=draw(st.sampled_from([1, 1, 2, 3, 5, 1000])),
        out_of_orderness=draw(st.integers(0, 8)) / per,
        hints=hints,
        parallelism=draw(st.sampled_from(list(parallelism))),
        how=draw(st.sampled_from(HOWS)),
        late_port=draw(st.booleans()) or draw(st.booleans()),
    )


def _lateness(draw: st.DrawFn, per: int) -> float:
    return draw(st.sampled_from([0, 0, 1, 3, 7, 15])) * (per if draw(st.booleans()) else 1) / per


@st.composite
def time_scenarios(draw: st.DrawFn, parallelism: Sequence[int] = (1, 3)) -> Scenario:
    scenario = draw(scenarios(parallelism))
    per = GRIDS[scenario.grid][0]
    size = draw(st.integers(1, 12))
    slide = draw(st.one_of(st.none(), st.integers(1, size)))
    offset = draw(st.integers(0, (slide or size) - 1))  # 0 <= offset < slide (others are refused)
    scenario.window = {
        "size": size / per,
        "slide": None if slide is None else slide / per,
        "offset": offset / per,
        "allowed_lateness": _lateness(draw, per),
    }
    return scenario


@st.composite
def session_scenarios(draw: st.DrawFn, parallelism: Sequence[int] = (1, 3)) -> Scenario:
    scenario = draw(scenarios(parallelism))
    per = GRIDS[scenario.grid][0]
    scenario.window = {"gap": draw(st.integers(1, 10)) / per, "allowed_lateness": _lateness(draw, per)}
    return scenario


# ----------------------------------------------------------------------------------------------- running


def _fold_of(how: str, session: bool) -> Any:
    return (bag if session else concat) if how == "fn" else how


def _window_of(scenario: Scenario, kind: str, on_late: Callable[[sl.Record], Any] | None) -> Any:
    options: dict[str, Any] = {"time": "event", **scenario.time_unit()}
    if on_late is not None:
        options["on_late"] = on_late
    w = scenario.window
    if kind == "session":
        return sl.SessionWindow(w["gap"], allowed_lateness=w["allowed_lateness"], **options)
    return sl.TimeWindow(w["size"], w["slide"], allowed_lateness=w["allowed_lateness"], offset=w["offset"], **options)


def own_instance(record: sl.Record, n: int) -> int:
    """A partitioning that gives each of the first ``n`` keys of ``KEYS`` an instance of its own."""
    return KEYS.index(record.key) % n


def run_streamlet(
    scenario: Scenario, kind: str, processes: int = 1, partitioning: Any = sl.SAME_KEY, rocks: bool = False
) -> tuple[list[Any], list[Any], Any, list[Any]]:
    """(results, late records, statistics, what on_late got) of the scenario in streamlet (its open windows in
    RocksDB with ``rocks``, a cache of two values so most are read back from the database)."""
    called: list[Any] = []
    on_late = (lambda record: called.append((record.key, record.value, record.ts))) if processes == 1 else None
    topology = sl.Topology("spec-windows")
    records = [sl.Record(key, value, ts) for key, value, ts in scenario.records]
    source = topology.add_source("src", records, watermarks=scenario.watermarks())
    node = topology.window_reduce(
        "win",
        _fold_of(scenario.how, kind == "session"),
        window=_window_of(scenario, kind, on_late),
        parallelism=scenario.parallelism,
    ).set_input(source, partitioning=partitioning)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    if scenario.late_port:
        topology.add_sink("late", sl.CollectSink()).set_input(node, out_port=sl.LATE)
    with tempfile.TemporaryDirectory() as folder:
        backend = sl.RocksDBState(folder, cache_entries=2) if rocks else None
        result = sl.run(topology, batch_size=scenario.batch_size, processes=processes, state_backend=backend)
    out = [(r.key, r.value, r.window, r.firing, r.ts) for r in result.sink("out")]
    late = [(r.key, r.value, r.ts) for r in result.sink("late")] if scenario.late_port else []
    return out, late, result.statistics, called


def run_model(scenario: Scenario, kind: str) -> tuple[list[Any], list[Any], list[Any]]:
    """(results, late records, the moment and window of each result) by the model."""
    how = _fold_of(scenario.how, kind == "session")
    if kind == "session":
        results, late = model.session_windows(scenario.trace(), how=how, **scenario.window, **scenario.time_unit())
    else:
        results, late = model.time_windows(scenario.trace(), how=how, **scenario.window, **scenario.time_unit())
    return (
        [(r.key, r.value, r.window, r.firing, r.ts) for r in results],
        [(r.key, r.value, r.ts) for r in late],
        [(r.moment, r.window) for r in results],
    )


def by_key(items: Sequence[tuple[Any, ...]]) -> dict[Any, list[tuple[Any, ...]]]:
    """Each key's items in order: a key's records all reach one instance, so its results keep their order."""
    grouped: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for item in items:
        grouped[item[0]].append(item)
    return dict(grouped)


def compare(got: list[Any], want: list[Any], parallelism: int, moments: list[Any] | None = None) -> None:
    """Each key's items in order (the instances' outputs interleave). With one instance and the ``moments`` of the
    model's results, the whole order too, up to the order of the keys of one window fired at one moment (which the
    page does not say): each run of results with the same moment and window must come together, in the model's
    order of the runs."""
    assert by_key(got) == by_key(want)
    if parallelism == 1 and moments is not None:
        runs: list[list[Any]] = []
        for n, item in enumerate(want):
            if n and moments[n] == moments[n - 1]:
                runs[-1].append(item)
            else:
                runs.append([item])
        at = 0
        for run in runs:
            assert sorted(map(repr, got[at : at + len(run)])) == sorted(map(repr, run)), (at, run)
            at += len(run)


def check(
    scenario: Scenario, kind: str, processes: int = 1, partitioning: Any = sl.SAME_KEY, rocks: bool = False
) -> None:
    note(f"{kind} {scenario} {'on RocksDB' if rocks else 'in memory'}")
    want, want_late, moments = run_model(scenario, kind)
    got, got_late, statistics, called = run_streamlet(scenario, kind, processes, partitioning, rocks)
    note(f"model:     {want}\nstreamlet: {got}\nmodel late: {want_late}\nstreamlet late: {got_late}")
    event(f"records: {len(scenario.records) // 10 * 10}+")
    event(f"late records: {bool(want_late)}")
    event(f"late firings: {any(item[3] == model.LATE for item in want)}")
    event(f"parallelism {scenario.parallelism}, batch size {scenario.batch_size}")
    compare(got, want, scenario.parallelism, moments)
    assert statistics.late == len(want_late)
    in_order = list(range(len(want_late)))  # late records leave in the order they came
    if scenario.late_port:
        compare(got_late, want_late, scenario.parallelism, in_order)
    else:
        assert statistics.discarded == len(want_late)
    if processes == 1:
        compare(called, want_late, scenario.parallelism, in_order)


def one_key_per_instance(scenario: Scenario) -> Scenario:
    """The same scenario with at most one key per instance of ``own_instance`` (one key with parallelism 1, the
    first three of ``KEYS`` with 3) and one record per batch: where streamlet's known disagreements cannot show."""
    keys = KEYS[: scenario.parallelism]
    scenario.records = [(keys[KEYS.index(key) % len(keys)], value, ts) for key, value, ts in scenario.records]
    scenario.batch_size = 1
    return scenario


# ----------------------------------------------------------------------------------------------- the page's examples


def test_the_model_gives_the_page_examples() -> None:
    """The models reproduce the examples of docs/windows.md (so the model reads the page as it is meant)."""
    clicks = [("home", 1, 10.0), ("cart", 1, 30.0), ("home", 1, 62.0), ("home", 1, 58.0), ("cart", 1, 70.0)]
    clicks.append(("home", 1, 40.0))
    recs = [model.Rec(i, *c) for i, c in enumerate(clicks)]
    results, late = model.time_windows(model.source_trace(recs, 1, 5.0), size=60, how="sum")
    assert [(r.key, r.value, r.window) for r in results] == [
        ("home", 2, (0.0, 60.0)),
        ("cart", 1, (0.0, 60.0)),
        ("home", 1, (60.0, 120.0)),
        ("cart", 1, (60.0, 120.0)),
    ]
    assert [(r.key, r.ts) for r in late] == [("home", 40.0)]

    readings = [("t1", 20, 3.0), ("t1", 22, 12.0), ("t1", 21, 9.0), ("t1", 25, 31.0), ("t1", 19, 4.0)]
    recs = [model.Rec(i, *r) for i, r in enumerate(readings)]
    results, late = model.time_windows(model.source_trace(recs, 1), size=10, allowed_lateness=15, offset=2, how="max")
    assert [(r.value, r.window, r.firing) for r in results] == [
        (20, (2.0, 12.0), "on_time"),
        (21, (2.0, 12.0), "late"),
        (22, (12.0, 22.0), "on_time"),
        (25, (22.0, 32.0), "on_time"),
    ]
    assert [r.ts for r in late] == [4.0]

    sessions = sorted(
        [("ann", 1, t) for t in (0.0, 2.0, 3.5, 20.0)] + [("bob", 1, t) for t in (1.0, 9.0)], key=lambda c: c[2]
    )
    recs = [model.Rec(i, *c) for i, c in enumerate(sessions)]
    results, late = model.session_windows(model.source_trace(recs, 1000), gap=5, how="count")
    assert [(r.key, r.value, r.window) for r in results] == [
        ("bob", 1, (1.0, 6.0)),
        ("ann", 3, (0.0, 8.5)),
        ("bob", 1, (9.0, 14.0)),
        ("ann", 1, (20.0, 25.0)),
    ]
    assert [(r.key, r.value, r.window) for r in model.count_windows(recs, size=2, per_key=True, how="count")] == [
        ("ann", 2, (0, 2)),
        ("bob", 2, (0, 2)),
        ("ann", 2, (2, 4)),
    ]
    touching = [model.Rec(i, "k", 1, t) for i, t in enumerate([0.0, 5.0, 10.0])]
    assert [r.window for r in model.session_windows(model.source_trace(touching, 1), gap=5)[0]] == [(0.0, 15.0)]
    apart = [model.Rec(0, "k", 1, 0.0), model.Rec(1, "k", 1, 5.001)]
    assert len(model.session_windows(model.source_trace(apart, 1), gap=5)[0]) == 2
    tenths = [model.Rec(i, "k", 1, t) for i, t in enumerate([0.3, 0.35, 0.5])]
    assert [r.window for r in model.time_windows(model.source_trace(tenths, 1), size=0.1, time_unit=0.1)[0]] == [
        (0.3, 0.4),
        (0.5, 0.6),
    ]


# ------------------------------------------------------------------------------------------ time and session windows


@pytest.mark.timeout(240)
@examples()
@given(time_scenarios(), st.booleans())
def test_time_windows_match_the_model(scenario: Scenario, rocks: bool) -> None:
    """Time windows' results, late records and late firings are the model's, their open windows in memory or
    in RocksDB (``rocks``)."""
    check(scenario, "time", rocks=rocks)


@pytest.mark.timeout(240)
@examples()
@given(time_scenarios())
def test_time_windows_without_lateness_match_the_model(scenario: Scenario) -> None:
    """``allowed_lateness=0``: no late firings (late records still go to the late port)."""
    scenario.window["allowed_lateness"] = 0.0
    check(scenario, "time")


@pytest.mark.timeout(240)
@examples()
@given(time_scenarios())
def test_time_windows_with_one_key_per_instance_match_the_model(scenario: Scenario) -> None:
    """Late firings, with one key per instance and one record per batch."""
    check(one_key_per_instance(scenario), "time", partitioning=own_instance)


@pytest.mark.timeout(240)
@examples()
@given(session_scenarios(), st.booleans())
def test_session_windows_match_the_model(scenario: Scenario, rocks: bool) -> None:
    """Sessions' results, late records and late firings are the model's, their open sessions in memory or in
    RocksDB (``rocks``)."""
    check(scenario, "session", rocks=rocks)


@pytest.mark.timeout(240)
@examples(0.25)
@given(
    st.one_of(
        session_scenarios().map(lambda s: (s, "session")),
        time_scenarios().map(lambda s: (s, "time")),
        time_scenarios().map(lambda s: (one_key_per_instance(s), "time-own")),
    )
)
def test_windows_in_two_processes_match_the_model(case: tuple[Scenario, str]) -> None:
    """``processes=2``: sessions; time windows without lateness, or with one key per instance."""
    scenario, kind = case
    if kind == "time-own":
        check(scenario, "time", processes=2, partitioning=own_instance)
    else:
        if kind == "time":
            scenario.window["allowed_lateness"] = 0.0
        check(scenario, kind, processes=2)


# ----------------------------------------------------------------------------------------------- count windows


def run_count_windows(
    raw: list[tuple[Any, int, int]],
    size: int,
    slide: int | None,
    per_key: bool,
    parallelism: int,
    how: str,
    batch_size: int,
) -> None:
    fn = concat if how == "fn" else how
    topology = sl.Topology("spec-count")
    source = topology.add_source("src", [sl.Record(key, value, float(ts)) for key, value, ts in raw])
    node = topology.window_reduce(
        "win", fn, window=sl.CountWindow(size, slide, per_key=per_key), parallelism=parallelism
    ).set_input(source, partitioning=sl.SAME_KEY if per_key else own_instance)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, batch_size=batch_size)
    got = [(r.key, r.value, r.window, r.ts) for r in result.sink("out")]

    recs = [model.Rec(i, key, value, float(ts)) for i, (key, value, ts) in enumerate(raw)]
    if per_key:
        groups = [recs]
    else:  # a plain count window counts what its instance receives
        groups = [[r for r in recs if KEYS.index(r.key) % parallelism == i] for i in range(parallelism)]
    results = [
        r for group in groups for r in model.count_windows(group, size=size, slide=slide, per_key=per_key, how=fn)
    ]
    want = [(r.key, r.value, r.window, r.ts) for r in results]
    note(f"model:     {want}\nstreamlet: {got}")
    compare(got, want, parallelism, [(r.moment, r.window) for r in results])


count_cases = {
    "raw": timed_records(),
    "size": st.integers(1, 6),
    "slide": st.one_of(st.none(), st.integers(1, 6)),
    "parallelism": st.sampled_from([1, 3]),
    "how": st.sampled_from(HOWS),
    "batch_size": st.sampled_from([1, 2, 5, 1000]),
}


@pytest.mark.timeout(240)
@examples()
@given(**count_cases)
def test_count_windows_per_key_match_the_model(
    raw: list[Any], size: int, slide: int | None, parallelism: int, how: str, batch_size: int
) -> None:
    run_count_windows(raw, size, None if slide is None else min(slide, size), True, parallelism, how, batch_size)


@pytest.mark.timeout(240)
@examples()
@given(**count_cases)
def test_count_windows_match_the_model(
    raw: list[Any], size: int, slide: int | None, parallelism: int, how: str, batch_size: int
) -> None:
    run_count_windows(raw, size, None if slide is None else min(slide, size), False, parallelism, how, batch_size)


@pytest.mark.timeout(240)
@examples()
@given(**count_cases)
def test_count_windows_with_one_key_per_instance_match_the_model(
    raw: list[Any], size: int, slide: int | None, parallelism: int, how: str, batch_size: int
) -> None:
    keys = KEYS[:parallelism]
    raw = [(keys[KEYS.index(key) % len(keys)], value, ts) for key, value, ts in raw]
    run_count_windows(raw, size, None if slide is None else min(slide, size), False, parallelism, how, batch_size)


# ----------------------------------------------------------------------------------------------- early firings


@dataclass
class EarlyScenario:
    steps: list[Any]  # (key, value, ts) sent then settled, or "tick": the clock moves on by early_firing
    early_firing: float
    out_of_orderness: float
    hints: dict[int, float] | None
    parallelism: int
    how: str
    window: dict[str, Any]


@st.composite
def early_scenarios(draw: st.DrawFn) -> EarlyScenario:
    raw = draw(timed_records(max_records=20))
    steps: list[Any] = []
    for record in raw:
        steps.extend(["tick"] * draw(st.sampled_from([0, 0, 0, 1, 2])))
        steps.append((record[0], record[1], float(record[2])))
    steps.extend(["tick"] * draw(st.integers(0, 2)))
    hints = None
    if draw(st.booleans()):
        top = max([ts for _, _, ts in raw], default=0) + 10
        hints = {value: float(draw(st.integers(0, top))) for _, value, _ in raw if draw(st.integers(0, 3)) == 0}
    size = draw(st.integers(1, 12))
    slide = draw(st.one_of(st.none(), st.integers(1, size)))
    return EarlyScenario(
        steps=steps,
        early_firing=draw(st.sampled_from([1.0, 5.0])),
        out_of_orderness=float(draw(st.integers(0, 8))),
        hints=hints,
        parallelism=draw(st.sampled_from([1, 3])),
        how=draw(st.sampled_from(HOWS)),
        window={
            "size": size,
            "slide": slide,
            "offset": draw(st.integers(0, (slide or size) - 1)),
            "allowed_lateness": float(draw(st.sampled_from([0, 0, 2, 10]))),
        },
    )


def check_early(scenario: EarlyScenario, partitioning: Any = sl.SAME_KEY) -> None:
    """A ``QueueSource`` fed one record at a time (each its own batch, then the source's watermark), settled after
    each; a tick moves the ``ManualClock`` on by ``early_firing`` (the clock starts at 0)."""
    note(repr(scenario))
    how = concat if scenario.how == "fn" else scenario.how
    hints = scenario.hints
    fn = None if hints is None else (lambda rec: hints.get(rec.value))

    trace: list[model.Event] = []
    sent: list[model.Rec] = []
    for step in scenario.steps:
        if step == "tick":
            trace.append(model.Tick())
            continue
        sent.append(model.Rec(len(sent), *step))
        trace.append(sent[-1])
        trace.append(model.Watermark(model.source_watermarks([[r] for r in sent], scenario.out_of_orderness, fn)[-1]))
    trace.append(model.End())
    results, late = model.time_windows(trace, how=how, **scenario.window)
    want = [(r.key, r.value, r.window, r.firing, r.ts) for r in results]
    want_late = [(r.key, r.value, r.ts) for r in late]

    watermarks = (
        sl.Watermarks(out_of_orderness=scenario.out_of_orderness)
        if hints is None
        else sl.Watermarks(fn=lambda record: hints.get(record.value))
    )
    topology = sl.Topology("spec-early")
    source = topology.add_source("src", sl.QueueSource(), watermarks=watermarks)
    window = sl.TimeWindow(
        scenario.window["size"],
        scenario.window["slide"],
        time="event",
        allowed_lateness=scenario.window["allowed_lateness"],
        offset=scenario.window["offset"],
        early_firing=scenario.early_firing,
    )
    node = topology.window_reduce("win", how, window=window, parallelism=scenario.parallelism)
    node.set_input(source, partitioning=partitioning)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    topology.add_sink("late", sl.CollectSink()).set_input(node, out_port=sl.LATE)

    async def drive() -> sl.JobResult:
        clock = sl.ManualClock()
        async with sl.start(topology, clock=clock) as job:
            for step in scenario.steps:
                if step == "tick":
                    clock.advance(scenario.early_firing)
                else:
                    key, value, ts = step
                    await job.send("src", key, value, ts=ts)
                await job.settle()
            await job.close_source("src")
            return await job.wait()

    result = asyncio.run(drive())
    got = [(r.key, r.value, r.window, r.firing, r.ts) for r in result.sink("out")]
    got_late = [(r.key, r.value, r.ts) for r in result.sink("late")]
    note(f"model:     {want}\nstreamlet: {got}\nmodel late: {want_late}\nstreamlet late: {got_late}")
    event(f"early firings: {sum(item[3] == model.EARLY for item in want) // 3 * 3}+")
    event(f"late firings: {any(item[3] == model.LATE for item in want)}")
    compare(got, want, scenario.parallelism, [(r.moment, r.window) for r in results])
    compare(got_late, want_late, scenario.parallelism, list(range(len(want_late))))
    assert result.statistics.late == len(want_late)


@pytest.mark.timeout(240)
@examples(0.5)
@given(early_scenarios())
def test_early_firings_match_the_model(scenario: EarlyScenario) -> None:
    check_early(scenario)


@pytest.mark.timeout(240)
@examples(0.5)
@given(early_scenarios())
def test_early_firings_with_one_key_per_instance_match_the_model(scenario: EarlyScenario) -> None:
    keys = KEYS[: scenario.parallelism]
    scenario.steps = [s if s == "tick" else (keys[KEYS.index(s[0]) % len(keys)], *s[1:]) for s in scenario.steps]
    check_early(scenario, partitioning=own_instance)


# ----------------------------------------------------------------------------------------- the disagreements, reduced


def _reduce(
    records: list[sl.Record], window: Any, parallelism: int = 1, batch_size: int = 1, how: Any = "sum"
) -> list[Any]:
    topology = sl.Topology("spec-minimal")
    source = topology.add_source("src", records)
    node = topology.window_reduce("win", how, window=window, parallelism=parallelism)
    node.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    return [(r.key, r.value, r.window, r.firing) for r in sl.run(topology, batch_size=batch_size).sink("out")]


def test_a_late_record_fires_only_its_own_key() -> None:
    """("a", 10) at 0, ("a", 1) at 1 (watermark 1: [0, 1) fires on time), then ("c", 2) at 0, within the lateness:
    only c's result fires, late, whatever the parallelism (found by the differential run: streamlet fired a's
    again too when a and c shared an instance)."""
    records = [sl.Record("a", 10, 0.0), sl.Record("a", 1, 1.0), sl.Record("c", 2, 0.0)]
    window = sl.TimeWindow(1, time="event", allowed_lateness=1)
    want = [("a", 10, (0.0, 1.0), "on_time"), ("c", 2, (0.0, 1.0), "late"), ("a", 1, (1.0, 2.0), "on_time")]
    assert by_key(_reduce(records, window, parallelism=3)) == by_key(want)
    assert _reduce(records, window, parallelism=1) == want


def test_late_firings_are_per_record() -> None:
    """Batches of two: [a=0 at 0, a=1 at 1] (watermark 1: [0, 1) fires on time), [a=2 at 0, a=3 at 0]: each late
    record fires [0, 1) again (2, then 5), as with batches of one (found by the differential run: streamlet fired
    it once per batch, with 5)."""
    records = [sl.Record("a", v, ts) for v, ts in [(0, 0.0), (1, 1.0), (2, 0.0), (3, 0.0)]]
    want = [
        ("a", 0, (0.0, 1.0), "on_time"),
        ("a", 2, (0.0, 1.0), "late"),
        ("a", 5, (0.0, 1.0), "late"),
        ("a", 1, (1.0, 2.0), "on_time"),
    ]
    window = sl.TimeWindow(1, time="event", allowed_lateness=1)
    assert _reduce(records, window, batch_size=1) == want
    assert _reduce(records, window, batch_size=2) == want


def test_an_early_firing_skips_keys_with_nothing_new() -> None:
    """a=1 at 0, tick (a fires early), c=2 at 0, tick: only c took records since, so only c fires early (found by
    the differential run: streamlet fired a again too when a and c shared an instance)."""
    topology = sl.Topology("spec-early-minimal")
    source = topology.add_source("src", sl.QueueSource())
    node = topology.window_reduce("win", "sum", window=sl.TimeWindow(10, time="event", early_firing=1.0))
    node.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(node)

    async def drive() -> sl.JobResult:
        clock = sl.ManualClock()
        async with sl.start(topology, clock=clock) as job:
            for step in [("a", 1), "tick", ("c", 2), "tick"]:
                if isinstance(step, tuple):
                    await job.send("src", step[0], step[1], ts=0.0)
                else:
                    clock.advance(1.0)
                await job.settle()
            await job.close_source("src")
            return await job.wait()

    got = [(r.key, r.value, r.window, r.firing) for r in asyncio.run(drive()).sink("out")]
    assert got == [
        ("a", 1, (0.0, 10.0), "early"),
        ("c", 2, (0.0, 10.0), "early"),
        ("a", 1, (0.0, 10.0), "on_time"),
        ("c", 2, (0.0, 10.0), "on_time"),
    ]


def test_a_count_result_has_its_windows_last_ts() -> None:
    """CountWindow(2) over a=1 at 0.0, b=2 at 1.0: both results have the ts of the window's last record (1.0)."""
    topology = sl.Topology("spec-count-minimal")
    source = topology.add_source("src", [sl.Record("a", 1, 0.0), sl.Record("b", 2, 1.0)])
    node = topology.window_reduce("win", "sum", window=sl.CountWindow(2)).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    got = [(r.key, r.value, r.window, r.ts) for r in sl.run(topology).sink("out")]
    assert got == [("a", 1, (0, 2), 1.0), ("b", 2, (0, 2), 1.0)]


@pytest.mark.parametrize("offset", [2, 3, -1, -2])
def test_an_offset_outside_the_slide_is_refused(offset: int) -> None:
    topology = sl.Topology("spec-offset")
    source = topology.add_source("src", [sl.Record("a", 1, 0.0)])

    def build() -> None:
        topology.window_reduce("win", "sum", window=sl.TimeWindow(4, 2, time="event", offset=offset)).set_input(source)
        topology.validate()

    with pytest.raises(sl.TopologyError):
        build()


def test_the_watermark_counts_in_ticks() -> None:
    """0.7 - 0.2 is 0.49999999999999994 in floats, whose nearest tick of 0.1 s is 0.5: [0, 0.5) closes, so 0.3,
    which comes next, is late."""
    records = [("a", 1, 0.1), ("a", 2, 0.7), ("a", 3, 0.3)]
    scenario = Scenario("tenth", records, 1, 0.2, None, 1, "sum", True, {"size": 0.5, "slide": None, "offset": 0.0})
    scenario.window["allowed_lateness"] = 0.0
    want, want_late, _ = run_model(scenario, "time")
    assert want == [("a", 1, (0.0, 0.5), "on_time", 0.4), ("a", 2, (0.5, 1.0), "on_time", 0.9)]
    assert want_late == [("a", 3, 0.3)]
    got, got_late, _, _ = run_streamlet(scenario, "time")
    assert (got, got_late) == (want, want_late)


def test_a_window_first_fired_after_the_watermark_passed_it_fires_late() -> None:
    """5 (watermark 5), then 1 within the lateness: [0, 2) held nothing when the watermark passed its end, so its
    first firing is late."""
    records = [("a", 5, 5.0), ("a", 1, 1.0)]
    scenario = Scenario("ms", records, 1, 0.0, None, 1, "sum", True, {"size": 2.0, "slide": None, "offset": 0.0})
    scenario.window["allowed_lateness"] = 10.0
    want, want_late, _ = run_model(scenario, "time")
    assert want == [("a", 1, (0.0, 2.0), "late", 1.999), ("a", 5, (4.0, 6.0), "on_time", 5.999)]
    assert want_late == []
    got, got_late, _, _ = run_streamlet(scenario, "time")
    assert (got, got_late) == (want, want_late)


# ------------------------------------------------------------------------------- a resume and a rescale mid-stream


def _queue_topology(scenario: Scenario, sink: sl.Sink) -> sl.Topology:
    """The scenario's window_reduce fed by a QueueSource (one record per batch: each is sent and settled alone)."""
    topology = sl.Topology("spec-windows-fed")
    source = topology.add_source("src", sl.QueueSource(), watermarks=scenario.watermarks())
    node = topology.window_reduce(
        "win",
        _fold_of(scenario.how, False),
        window=_window_of(scenario, "time", None),
        parallelism=scenario.parallelism,
    ).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sink).set_input(node)
    return topology


async def _feed(job: sl.Job, records: list[tuple[Any, int, float]]) -> None:
    for key, value, ts in records:
        await job.send("src", key, value, ts)
        await job.settle()


def _plain(items: list[Any]) -> list[Any]:
    """As JSON gives them back (a FileSink's records: tuples as lists), then each as a tuple of reprs."""
    return [tuple(map(repr, json.loads(json.dumps(item)))) for item in items]


class Crash(Exception):
    """The job's program dies (after its checkpoint), leaving the ``async with`` like a crash."""


@pytest.mark.timeout(240)
@examples(0.25)
@given(time_scenarios(), st.data())
def test_time_windows_resume_from_a_checkpoint_taken_at_a_random_point(scenario: Scenario, data: Any) -> None:
    """A checkpoint after a random record, the program crashing a few records later, a new run from that
    checkpoint fed the records after it: what the exactly-once FileSink holds is the model's answer."""
    scenario.batch_size = 1
    want = [(key, value, ts) for key, value, _window, _firing, ts in run_model(scenario, "time")[0]]
    records = scenario.records
    taken = data.draw(st.integers(0, len(records)), label="checkpoint after")
    crash = data.draw(st.integers(taken, len(records)), label="crash after")
    with tempfile.TemporaryDirectory() as directory:
        store, out = Path(directory) / "checkpoints", Path(directory) / "out"

        async def first_run() -> None:
            async with sl.start(_queue_topology(scenario, sl.FileSink(out)), checkpoint_dir=store) as job:
                await _feed(job, records[:taken])
                await job.checkpoint()
                await _feed(job, records[taken:crash])
                raise Crash

        async def resumed() -> None:
            async with sl.start(_queue_topology(scenario, sl.FileSink(out)), checkpoint_dir=store) as job:
                await _feed(job, records[taken:])
                await job.close_source("src")
                await job.wait()

        with pytest.raises(Crash):
            asyncio.run(first_run())
        asyncio.run(resumed())
        got = [(r.key, r.value, r.ts) for r in sl.read_file_sink(out)]
    assert by_key(_plain(got)) == by_key(_plain(want))


@pytest.mark.timeout(240)
@examples(0.25)
@given(time_scenarios(), st.data())
def test_time_windows_through_a_live_rescale_at_a_random_point(scenario: Scenario, data: Any) -> None:
    """The window task rescaled (1 <-> 3 instances) after a random record while the records flow: the results of
    each key and the late records are the model's, as without the rescale."""
    scenario.batch_size = 1
    want = run_model(scenario, "time")[0]
    at = data.draw(st.integers(0, len(scenario.records)), label="rescale after")
    to = 1 if scenario.parallelism == 3 else 3

    async def run() -> sl.JobResult:
        async with sl.start(_queue_topology(scenario, sl.CollectSink())) as job:
            await _feed(job, scenario.records[:at])
            await job.rescale("win", to)
            await _feed(job, scenario.records[at:])
            await job.close_source("src")
            return await job.wait()

    result = asyncio.run(run())
    got = [(r.key, r.value, r.window, r.firing, r.ts) for r in result.sink("out")]
    assert by_key(got) == by_key(want)
