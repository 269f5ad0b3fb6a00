"""Differential tests of the four joins against the brute-force models of ``tests/spec/models/joins.py``.

Two drivers, both through the public API only:

* **stepwise** (``sl.start``): each input is a ``QueueSource`` whose watermark is punctuated
  (``Watermarks(fn=...)`` reads marker records, which a filter then drops before the join), so the script
  decides every watermark of each input. After each event (a run of records on one side, a marker, a tick of
  the ``ManualClock``) the test settles the job and compares what the sinks hold so far, the late records,
  the dead-letter and late counters and (interval join) the records held, with the model's answer up to that
  event; at the end the outputs, late records and dead letters exactly.
* **ordered runs** (``sl.run``, in process and with ``processes=2``): list sources with
  ``Watermarks(out_of_orderness=d)`` whose records are never more than ``d`` behind their own source's
  newest, so no record can be late whatever the interleaving of the two sources, and every answer that does
  not depend on that interleaving (all but the table join's, which is in processing order) is compared.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import streamlet as sl
from tests.spec.budget import examples
from tests.spec.models import joins as model
from tests.spec.models.joins import LEFT, RIGHT, Mark, Rec, Tick

KEYS = ["a", "b", 7, ("u", 1)]
HOWS = ["inner", "left", "right", "outer"]
SOURCES = {LEFT: "left", RIGHT: "right"}
JOIN = "join"

# ----------------------------------------------------------------------------------------------- fn


_TRANSIENT_SEEN: set[tuple[Any, ...]] = set()
_TOKENS = itertools.count()


class Fn:
    """A join function: ``key|left|right``. ``raises`` picks the calls that fail (by a CRC of the values, so
    the same in every process); under ``"skip"`` they always raise, under ``"restart"`` only the first time
    each call is made (a transient failure)."""

    def __init__(
        self,
        policy: str,
        seed: int = 0,
        rate: int = 0,
        only_unpaired: bool = False,
        poisoned: frozenset[tuple[Any, Any]] = frozenset(),
    ) -> None:
        self.policy = policy
        self.seed = seed
        self.rate = rate if policy in ("skip", "restart") else 0
        self.only_unpaired = only_unpaired
        self.poisoned = poisoned if policy in ("skip", "restart") else frozenset()
        self.token = next(_TOKENS)

    @staticmethod
    def pure(key: Any, left: Any, right: Any) -> str:
        return f"{key}|{left}|{right}"

    def raises(self, key: Any, left: Any, right: Any) -> bool:
        if (left, right) in self.poisoned:
            return True
        if self.only_unpaired and left is not None and right is not None:
            return False
        return self.rate > 0 and zlib.crc32(f"{self.seed}|{left}|{right}".encode()) % 100 < self.rate

    def __call__(self, key: Any, left: Any, right: Any) -> str:
        if self.raises(key, left, right):
            if self.policy == "skip":
                raise ValueError(f"poisoned pair {left!r} {right!r}")
            mark = (self.token, key, left, right)
            if mark not in _TRANSIENT_SEEN:
                _TRANSIENT_SEEN.add(mark)
                raise ValueError(f"transient failure {left!r} {right!r}")
        return self.pure(key, left, right)


@dataclass
class Policy:
    """What the join gets (``fn``, ``on_error``) and what the model gets (``fn``, ``raises``)."""

    fn: Fn | None
    options: dict[str, Any]
    model_fn: model.JoinFn | None
    model_raises: model.Raises | None


def make_policy(
    kind: str, seed: int = 0, rate: int = 0, only_unpaired: bool = False, poisoned: frozenset[Any] = frozenset()
) -> Policy:
    if kind == "default":  # no fn: (left, right)
        return Policy(None, {}, None, None)
    fn = Fn(kind, seed, rate, only_unpaired, poisoned)
    if kind == "plain":
        return Policy(fn, {}, Fn.pure, None)
    if kind == "skip":
        return Policy(fn, {"on_error": "skip"}, Fn.pure, fn.raises)
    return Policy(fn, {"on_error": "restart", "max_failures": 1_000_000}, Fn.pure, None)  # changes nothing


# ------------------------------------------------------------------------------------------ the joins


@dataclass(frozen=True)
class JoinSpec:
    """One join as both sides see it: ``kind`` and ``param`` are ``"interval"`` with ``(lower, upper)``,
    ``"window"`` with a :class:`model.Tumbling`, ``"session"`` with the gap, ``"asof"`` with the grace and
    ``"table"`` with the ``state_ttl`` (``None``: the default)."""

    kind: str
    how: str = "inner"
    param: Any = None

    def expect(self, events: list[model.Event], policy: Policy) -> model.Outcome:
        fn, raises = policy.model_fn, policy.model_raises
        if self.kind == "interval":
            return model.interval_join(events, *self.param, self.how, fn, raises)
        if self.kind == "window":
            return model.window_join(events, self.param, self.how, fn, raises)
        if self.kind == "session":
            return model.window_join(events, model.Sessions(self.param), self.how, fn, raises)
        if self.kind == "asof":
            return model.asof_join(events, self.how, fn, raises, grace=self.param)
        return model.table_join(events, self.how, fn, raises, state_ttl=self.param)

    def add(self, topology: sl.Topology, policy: Policy, parallelism: int) -> sl.NodeHandle:
        options = dict(policy.options, parallelism=parallelism, how=self.how, fn=policy.fn)
        if self.kind == "interval":
            return topology.interval_join(JOIN, *self.param, **options)
        if self.kind == "window":
            w = self.param
            return topology.window_join(JOIN, sl.TimeWindow(w.size, w.slide, time="event", offset=w.offset), **options)
        if self.kind == "session":
            return topology.window_join(JOIN, sl.SessionWindow(self.param, time="event"), **options)
        if self.kind == "asof":
            return topology.asof_join(JOIN, grace=self.param, **options)
        if self.param is not None:
            options["state_ttl"] = self.param
        return topology.table_join(JOIN, **options)


# ------------------------------------------------------------------------------------------ scripts


@st.composite
def scripts(draw: st.DrawFn, max_events: int = 40, ticks: bool = False, tombstones: bool = False) -> list[model.Event]:
    """Records of several keys, on both sides, around the current watermark (so out of order, late and at
    equal times), and watermark marks of either side (mostly forward, sometimes back: ignored); with
    ``ticks``, moves of the job clock; with ``tombstones``, some right values ``None``."""
    n = draw(st.integers(1, max_events))
    kinds = ["rec", "rec", "rec", "mark"] + (["tick"] if ticks else [])
    tombstone_share = draw(st.sampled_from([0, 20])) if tombstones else 0
    events: list[model.Event] = []
    announced = {LEFT: 0, RIGHT: 0}
    counters = {LEFT: 0, RIGHT: 0}
    for _ in range(n):
        kind = draw(st.sampled_from(kinds))
        side = draw(st.sampled_from([LEFT, RIGHT]))
        if kind == "rec":
            key = draw(st.sampled_from(KEYS))
            ts = max(0, min(announced.values()) + draw(st.integers(-6, 10)))
            value: Any = f"{side}{counters[side]}"
            if side == RIGHT and tombstone_share and draw(st.integers(0, 99)) < tombstone_share:
                value = None
            events.append(Rec(side, key, value, float(ts)))
            counters[side] += 1
        elif kind == "mark":
            t = announced[side] + draw(st.integers(-2, 8))
            announced[side] = max(announced[side], t)
            events.append(Mark(side, float(t)))
        else:
            events.append(Tick(float(draw(st.integers(1, 6)))))
    return events


def groups(events: list[model.Event]) -> list[list[int]]:
    """The steps of the stepwise driver: a run of records of one side, or a single mark or tick."""
    out: list[list[int]] = []
    for i, e in enumerate(events):
        prev = events[i - 1] if i else None
        if out and isinstance(e, Rec) and isinstance(prev, Rec) and prev.side == e.side:
            out[-1].append(i)
        else:
            out.append([i])
    return out


@st.composite
def time_windows(draw: st.DrawFn) -> model.Tumbling:
    size = draw(st.integers(1, 8))
    slide = draw(st.one_of(st.none(), st.integers(1, size)))
    offset = draw(st.integers(0, (slide or size) - 1))  # below the slide
    return model.Tumbling(float(size), None if slide is None else float(slide), float(offset))


policies = st.builds(
    make_policy,
    st.sampled_from(["default", "plain", "skip", "skip", "restart"]),
    st.integers(0, 10_000),
    st.sampled_from([10, 30, 60]),
)

# ---------------------------------------------------------------------------------------- comparing


def _round(ts: Any) -> Any:
    return None if ts is None else round(ts, 6)


def out_row(record: sl.Record) -> tuple[Any, Any, Any, Any]:
    window = getattr(record, "window", None)
    window = None if window is None else (_round(window[0]), _round(window[1]))
    return (record.key, record.value, _round(record.ts), window)


def plain_row(record: sl.Record) -> tuple[Any, Any, Any]:
    return (record.key, record.value, _round(record.ts))


def model_out(rows: list[tuple[Any, Any, float, Any]]) -> Counter[Any]:
    return Counter((k, v, _round(ts), None if w is None else (_round(w[0]), _round(w[1]))) for k, v, ts, w in rows)


def model_plain(rows: list[tuple[Any, Any, float]]) -> Counter[Any]:
    return Counter((k, v, _round(ts)) for k, v, ts in rows)


def diff(expected: Counter[Any], actual: Counter[Any]) -> str:
    return f"missing {dict(expected - actual)}, unexpected {dict(actual - expected)}"


def wm_of(record: sl.Record) -> float | None:
    value = record.value
    return value[1] if isinstance(value, tuple) and len(value) == 2 and value[0] == "wm" else None


def is_data(record: sl.Record) -> bool:
    return wm_of(record) is None


# ------------------------------------------------------------------------------------------ stepwise


def stepwise(
    events: list[model.Event],
    join: JoinSpec,
    policy: Policy,
    *,
    parallelism: int,
    batch_size: int,
    out_of_orderness: int | None = None,
) -> None:
    """Drive ``events`` through ``join`` one step at a time, comparing with the model after each step (what
    the sinks hold, the late records, the late and dead-letter counters, the interval join's records held)
    and at the end (outputs, late records, dead letters).

    With ``out_of_orderness=d`` the script holds records only and the sources feed the join directly with
    ``Watermarks(out_of_orderness=d)``: each record is sent alone and settled, so its source's watermark
    after it is the newest ``ts`` that source read minus ``d``; the model gets that as a mark after it."""
    if out_of_orderness is not None:
        newest = {LEFT: -model.INF, RIGHT: -model.INF}
        expanded: list[model.Event] = []
        for e in events:
            assert isinstance(e, Rec)
            newest[e.side] = max(newest[e.side], e.ts)
            expanded += [e, Mark(e.side, newest[e.side] - out_of_orderness)]
        events = expanded
    expected = join.expect(events, policy)
    out: list[tuple[Any, ...]] = []
    late: list[tuple[Any, ...]] = []
    topology = sl.Topology("spec-joins")
    feeds = {}
    for side, name in SOURCES.items():
        if out_of_orderness is not None:
            feeds[side] = topology.add_source(
                name, sl.QueueSource(), watermarks=sl.Watermarks(out_of_orderness=out_of_orderness)
            )
        else:
            source = topology.add_source(name, sl.QueueSource(), watermarks=sl.Watermarks(fn=wm_of))
            feeds[side] = topology.filter(f"{name}-data", is_data).set_input(source)  # markers stop here
    node = join.add(topology, policy, parallelism)
    node.set_input(feeds[LEFT], in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    node.set_input(feeds[RIGHT], in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", lambda r: out.append(out_row(r))).set_input(node)
    topology.add_sink("late", lambda r: late.append(plain_row(r))).set_input(node, out_port=sl.LATE)
    clock = sl.ManualClock(start=1000.0)

    async def drive() -> sl.JobResult:
        async with sl.start(topology, batch_size=batch_size, clock=clock) as job:
            steps = groups(events) if out_of_orderness is None else [[i, i + 1] for i in range(0, len(events), 2)]
            for step in steps:
                for i in step:
                    e = events[i]
                    if isinstance(e, Rec):
                        await job.send(SOURCES[e.side], e.key, e.value, ts=e.ts)
                    elif out_of_orderness is not None:
                        pass  # the source's own watermark after the record
                    elif isinstance(e, Mark):
                        await job.send(SOURCES[e.side], "wm", ("wm", e.t), ts=e.t)
                    else:
                        clock.advance(e.seconds)
                await job.settle()
                last = step[-1]
                so_far = expected.steps[: last + 1]
                where = f"after event {last} ({events[last]})"
                want_out = model_out([o for s in so_far for o in s.outputs])
                assert Counter(out) == want_out, f"outputs {where}: {diff(want_out, Counter(out))}"
                want_late = model_plain([o for s in so_far for o in s.late])
                assert Counter(late) == want_late, f"late {where}: {diff(want_late, Counter(late))}"
                stats = job.statistics()
                assert stats.late == len(late), f"statistics.late {where}"
                dead = sum(len(s.dead) for s in so_far)
                assert stats.dead_lettered == dead, f"dead_lettered {where}: {stats.dead_lettered} != {dead}"
                if join.kind == "interval":
                    held = stats.nodes[JOIN].held
                    assert held == so_far[-1].held, f"held {where}: {held} != {so_far[-1].held}"
            await job.close_source("left")
            await job.close_source("right")
            return await job.wait()

    result = asyncio.run(drive())
    want_out = model_out(expected.outputs)
    assert Counter(out) == want_out, f"outputs at the end: {diff(want_out, Counter(out))}"
    want_late = model_plain(expected.late)
    assert Counter(late) == want_late, f"late at the end: {diff(want_late, Counter(late))}"
    assert result.statistics.late == len(expected.late)
    want_dead = model_plain(expected.dead)
    got_dead = Counter(plain_row(d.record) for d in result.dead_letters)
    assert got_dead == want_dead, f"dead letters: {diff(want_dead, got_dead)}"
    assert all(d.task == JOIN for d in result.dead_letters)
    if join.kind == "interval":
        assert result.statistics.nodes[JOIN].held == 0
        if parallelism == 1:  # one instance: its peak is the most held after any step
            peak = max(s.held or 0 for s in expected.steps)
            assert result.statistics.nodes[JOIN].held_peak == peak, "held_peak"
    if join.kind in ("window", "session"):
        # 'every (left, right) pair of that key in it is emitted, left-major and each side in arrival order'
        for bounds_key in {(k, w) for k, _, _, w in expected.outputs}:
            want_order = [model_out([o]) for o in expected.outputs if (o[0], o[3]) == bounds_key]
            got_order = [Counter([o]) for o in out if (o[0], o[3]) == model_out_key(bounds_key)]
            assert got_order == want_order, f"order of the window {bounds_key}"


def model_out_key(key_window: tuple[Any, Any]) -> tuple[Any, Any]:
    key, w = key_window
    return key, (_round(w[0]), _round(w[1]))


runs = dict(parallelism=st.sampled_from([1, 3]), batch_size=st.integers(1, 5), policy=policies)


@pytest.mark.timeout(240)
@examples()
@given(events=scripts(), bounds=st.tuples(st.integers(-8, 8), st.integers(0, 10)), how=st.sampled_from(HOWS), **runs)
def test_interval_join_stepwise(events, bounds, how, parallelism, batch_size, policy):
    join = JoinSpec("interval", how, (float(bounds[0]), float(bounds[0] + bounds[1])))
    stepwise(events, join, policy, parallelism=parallelism, batch_size=batch_size)


def tenths(events: list[model.Event]) -> list[model.Event]:
    """The script with every time divided by 10 (0.1 s steps, not exact in binary: the windows count in
    ticks of 1 ms, where they are)."""
    out: list[model.Event] = []
    for e in events:
        if isinstance(e, Rec):
            out.append(Rec(e.side, e.key, e.value, e.ts / 10))
        elif isinstance(e, Mark):
            out.append(Mark(e.side, e.t / 10))
        else:
            out.append(e)
    return out


@pytest.mark.timeout(240)
@examples()
@given(events=scripts(), window=time_windows(), how=st.sampled_from(HOWS), scaled=st.booleans(), **runs)
def test_window_join_time_windows_stepwise(events, window, how, scaled, parallelism, batch_size, policy):
    if scaled:
        events = tenths(events)
        window = model.Tumbling(window.size / 10, window.slide and window.slide / 10, window.offset / 10)
    stepwise(events, JoinSpec("window", how, window), policy, parallelism=parallelism, batch_size=batch_size)


@pytest.mark.timeout(240)
@examples()
@given(events=scripts(), gap=st.integers(1, 6), how=st.sampled_from(HOWS), scaled=st.booleans(), **runs)
def test_window_join_sessions_stepwise(events, gap, how, scaled, parallelism, batch_size, policy):
    if scaled:
        events = tenths(events)
    join = JoinSpec("session", how, gap / 10 if scaled else float(gap))
    stepwise(events, join, policy, parallelism=parallelism, batch_size=batch_size)


@pytest.mark.timeout(240)
@examples()
@given(events=scripts(), bounds=st.tuples(st.integers(-8, 8), st.integers(0, 10)), how=st.sampled_from(HOWS), **runs)
@example(  # the order at 0.9 s comes first: 0.9 + 0.3 <= 1.2 <= 0.9 + 0.3 holds (streamlet once paired nothing)
    events=[Rec(LEFT, "k", "L0", 9.0), Rec(RIGHT, "k", "R0", 12.0)],
    bounds=(3, 0),
    how="inner",
    parallelism=1,
    batch_size=1,
    policy=make_policy("default"),
)
def test_interval_join_tenths_of_seconds_stepwise(events, bounds, how, parallelism, batch_size, policy):
    """The same as ``test_interval_join_stepwise`` with every time, and the bounds, divided by 10."""
    join = JoinSpec("interval", how, (bounds[0] / 10, (bounds[0] + bounds[1]) / 10))
    stepwise(tenths(events), join, policy, parallelism=parallelism, batch_size=batch_size)


@pytest.mark.timeout(240)
@examples()
@given(
    events=scripts(tombstones=True),
    how=st.sampled_from(["inner", "left"]),
    grace=st.one_of(st.none(), st.integers(0, 6).map(float)),
    **runs,
)
def test_asof_join_stepwise(events, how, grace, parallelism, batch_size, policy):
    stepwise(events, JoinSpec("asof", how, grace), policy, parallelism=parallelism, batch_size=batch_size)


@pytest.mark.timeout(240)
@examples()
@given(
    events=scripts(ticks=True, tombstones=True),
    how=st.sampled_from(["inner", "left"]),
    state_ttl=st.one_of(st.none(), st.integers(1, 10).map(float)),
    **runs,
)
def test_table_join_stepwise(events, how, state_ttl, parallelism, batch_size, policy):
    stepwise(events, JoinSpec("table", how, state_ttl), policy, parallelism=parallelism, batch_size=batch_size)


@st.composite
def record_scripts(draw: st.DrawFn, max_records: int = 30) -> list[model.Event]:
    """Records only, around the newest ``ts`` so far (out of order, at equal times, late by the sources'
    own watermarks), on both sides."""
    events: list[model.Event] = []
    newest = 0
    counters = {LEFT: 0, RIGHT: 0}
    for _ in range(draw(st.integers(1, max_records))):
        side = draw(st.sampled_from([LEFT, RIGHT]))
        ts = max(0, newest + draw(st.integers(-8, 5)))
        newest = max(newest, ts)
        value = f"{side}{counters[side]}"
        counters[side] += 1
        events.append(Rec(side, draw(st.sampled_from(KEYS)), value, float(ts)))
    return events


@st.composite
def any_join(draw: st.DrawFn) -> JoinSpec:
    kind = draw(st.sampled_from(["interval", "window", "session", "asof"]))
    if kind == "interval":
        lower = draw(st.integers(-8, 8))
        return JoinSpec(kind, draw(st.sampled_from(HOWS)), (float(lower), float(lower + draw(st.integers(0, 10)))))
    if kind == "window":
        return JoinSpec(kind, draw(st.sampled_from(HOWS)), draw(time_windows()))
    if kind == "session":
        return JoinSpec(kind, draw(st.sampled_from(HOWS)), float(draw(st.integers(1, 6))))
    grace = draw(st.one_of(st.none(), st.integers(0, 6).map(float)))
    return JoinSpec(kind, draw(st.sampled_from(["inner", "left"])), grace)


@pytest.mark.timeout(240)
@examples(0.5)
@given(events=record_scripts(), join=any_join(), out_of_orderness=st.integers(0, 3), **runs)
def test_joins_with_the_sources_own_watermarks_stepwise(
    events, join, out_of_orderness, parallelism, batch_size, policy
):
    """The sources wired straight into the join, their watermarks the newest ``ts`` read minus ``d``."""
    stepwise(events, join, policy, parallelism=parallelism, batch_size=batch_size, out_of_orderness=out_of_orderness)


# ------------------------------------------------------------------------------------ the page's corners


def L(key: Any, value: Any, ts: float) -> Rec:
    return Rec(LEFT, key, value, ts)


def R(key: Any, value: Any, ts: float) -> Rec:
    return Rec(RIGHT, key, value, ts)


def W(t: float) -> list[Mark]:
    return [Mark(LEFT, t), Mark(RIGHT, t)]


#: Hand-made scripts for what the page says (and the decisions written into it), each with the outputs
#: worked out by hand: (name, join, poisoned pairs under skip, script, outputs (key, value, ts), late, dead).
CORNERS = [
    (
        "interval: the page's 5..10 s example, a held order pairs a payment at W",
        JoinSpec("interval", "inner", (5.0, 10.0)),
        None,
        [L("o", "order", 92.0), *W(97.0), R("o", "pay", 100.0)],
        [("o", ("order", "pay"), 100.0)],
        [],
        [],
    ),
    (
        "interval: a record at the watermark is on time, one below it late",
        JoinSpec("interval", "outer", (0.0, 0.0)),
        None,
        [*W(5.0), L("k", "L0", 5.0), R("k", "R0", 4.0), R("k", "R1", 5.0)],
        [("k", ("L0", "R1"), 5.0)],
        [("k", "R0", 4.0)],
        [],
    ),
    (
        "interval: upper < 0, held until W > a.ts / b.ts + max(-lower, 0)",
        JoinSpec("interval", "outer", (-5.0, -2.0)),
        None,
        [R("k", "R0", 6.0), *W(9.0), L("k", "L0", 10.0), *W(11.0), L("k", "L1", 11.0), *W(12.0), L("k", "L2", 12.0)],
        [("k", ("L0", "R0"), 10.0), ("k", ("L1", "R0"), 11.0), ("k", ("L2", None), 12.0)],
        [],
        [],
    ),
    (
        "interval skip: the partner of a dead-lettered record still comes out unpaired",
        JoinSpec("interval", "outer", (0.0, 5.0)),
        {("L0", "R0")},
        [L("k", "L0", 1.0), R("k", "R0", 2.0), R("k", "R1", 3.0)],
        [("k", "k|L0|R1", 3.0)],
        [],
        [("k", "R0", 2.0)],
    ),
    (
        "interval skip: a pair met before the failing one does not come out either",
        JoinSpec("interval", "left", (0.0, 5.0)),
        {("L1", "R0")},
        [L("k", "L0", 1.0), L("k", "L1", 1.0), R("k", "R0", 2.0)],
        [("k", "k|L0|None", 1.0), ("k", "k|L1|None", 1.0)],
        [],
        [("k", "R0", 2.0)],
    ),
    (
        "window: a window fires when W reaches its end",
        JoinSpec("window", "inner", model.Tumbling(5.0)),
        None,
        [L("k", "L0", 1.0), R("k", "R0", 4.0), *W(5.0), L("k", "L1", 4.0)],
        [("k", ("L0", "R0"), 4.999)],
        [("k", "L1", 4.0)],
        [],
    ),
    (
        "window: a sliding record after some of its windows fired joins the others only",
        JoinSpec("window", "outer", model.Tumbling(4.0, 2.0)),
        None,
        [R("k", "R0", 5.0), *W(6.0), L("k", "L0", 5.0)],
        [("k", (None, "R0"), 5.999), ("k", ("L0", "R0"), 7.999)],
        [],
        [],
    ),
    (
        "window skip: a left record failing its only partner leaves the right one unpaired",
        JoinSpec("window", "outer", model.Tumbling(10.0)),
        {("L0", "R0")},
        [L("k", "L0", 1.0), R("k", "R0", 2.0), L("k", "L1", 3.0), R("k", "R1", 12.0), L("k", "L2", 13.0)],
        [("k", "k|L1|R0", 9.999), ("k", "k|L2|R1", 19.999)],
        [],
        [("k", "L0", 1.0)],
    ),
    (
        "window skip: every left record failing, the right ones come out unpaired",
        JoinSpec("window", "outer", model.Tumbling(10.0)),
        {("L0", "R0")},
        [L("k", "L0", 1.0), R("k", "R0", 2.0)],
        [("k", "k|None|R0", 9.999)],
        [],
        [("k", "L0", 1.0)],
    ),
    (
        "session: a record whose own window ended joins the open session it touches",
        JoinSpec("session", "inner", 3.0),
        None,
        [L("k", "L0", 10.0), *W(12.0), R("k", "R0", 7.0), R("k", "R1", 3.0)],
        [("k", ("L0", "R0"), 12.999)],
        [("k", "R1", 3.0)],
        [],
    ),
    (
        "session: records exactly gap apart share a session, and a record bridges two",
        JoinSpec("session", "inner", 5.0),
        None,
        [L("k", "L0", 0.0), R("k", "R0", 10.0), *W(4.0), L("k", "L1", 5.0)],
        [("k", ("L0", "R0"), 14.999), ("k", ("L1", "R0"), 14.999)],
        [],
        [],
    ),
    (
        "as-of: a right record behind W - grace still counts, and is never late",
        JoinSpec("asof", "left"),
        None,
        [R("k", "R0", 1.0), *W(10.0), R("k", "R1", 5.0), L("k", "L0", 12.0)],
        [("k", ("L0", "R1"), 12.0)],
        [],
        [],
    ),
    (
        "as-of: an older right record behind W changes nothing; an equal ts one wins",
        JoinSpec("asof", "left"),
        None,
        [
            R("k", "R0", 7.0),
            R("j", "S0", 7.0),
            *W(10.0),
            R("k", "R1", 5.0),
            R("j", "S1", 7.0),
            L("k", "L0", 12.0),
            L("j", "M0", 12.0),
        ],
        [("k", ("L0", "R0"), 12.0), ("j", ("M0", "S1"), 12.0)],
        [],
        [],
    ),
    (
        "as-of: with grace a left record behind W is joined at once, further behind it is late",
        JoinSpec("asof", "left", 5.0),
        None,
        [R("k", "R0", 3.0), *W(10.0), L("k", "L0", 7.0), R("k", "R1", 6.0), L("k", "L1", 4.0), L("k", "L2", 8.0)],
        [("k", ("L0", "R0"), 7.0), ("k", ("L2", "R1"), 8.0)],
        [("k", "L1", 4.0)],
        [],
    ),
    (
        "as-of: a tombstone ends the row from its ts on",
        JoinSpec("asof", "left"),
        None,
        [R("k", "R0", 1.0), R("k", None, 5.0), L("k", "L0", 4.0), L("k", "L1", 6.0)],
        [("k", ("L0", "R0"), 4.0), ("k", ("L1", None), 6.0)],
        [],
        [],
    ),
    (
        "table: state_ttl expires a row that long after its last write",
        JoinSpec("table", "left", 5.0),
        None,
        [R("k", "R0", 0.0), Tick(4.0), L("k", "L0", 0.0), Tick(1.0), L("k", "L1", 0.0)],
        [("k", ("L0", "R0"), 0.0), ("k", ("L1", None), 0.0)],
        [],
        [],
    ),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("parallelism", [1, 3])
@pytest.mark.parametrize(
    ("name", "join", "poisoned", "events", "outputs", "late", "dead"), CORNERS, ids=[c[0] for c in CORNERS]
)
def test_corners(name, join, poisoned, events, outputs, late, dead, parallelism):
    """The model gives the outputs worked out by hand from the page, and streamlet gives the model's."""
    policy = make_policy("skip", poisoned=frozenset(poisoned)) if poisoned else make_policy("default")
    expected = join.expect(events, policy)
    assert Counter((k, v, _round(ts)) for k, v, ts, _ in expected.outputs) == model_plain(outputs)
    assert Counter(expected.late) == Counter(late)
    assert Counter(expected.dead) == Counter(dead)
    stepwise(events, join, policy, parallelism=parallelism, batch_size=2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("lower", "upper", "a_ts", "b_ts", "right_second"),
    [
        pytest.param(0.3, 0.3, 0.9, 1.2, True, id="0.9+0.3==1.2, payment second"),
        pytest.param(0.3, 0.3, 0.9, 1.2, False, id="0.9+0.3==1.2, order second"),
        pytest.param(-0.6, -0.6, 4.6, 4.0, True, id="4.6-0.6!=4.0, payment second"),
        pytest.param(-0.6, -0.6, 4.6, 4.0, False, id="4.6-0.6!=4.0, order second"),
        pytest.param(0.1, 0.4, 1.2, 1.6, True, id="1.2+0.4==1.6, payment second"),
    ],
)
def test_interval_join_pairs_by_the_pages_formula_whichever_comes_second(lower, upper, a_ts, b_ts, right_second):
    """The pair is ``a.ts + lower <= b.ts <= a.ts + upper``, evaluated as written, in either arrival order."""
    a, b = Rec(LEFT, "k", "order", a_ts), Rec(RIGHT, "k", "pay", b_ts)
    events: list[model.Event] = [a, b] if right_second else [b, a]
    pairs = a_ts + lower <= b_ts <= a_ts + upper
    expected = model.interval_join(events, lower, upper)
    assert [o[:3] for o in expected.outputs] == ([("k", ("order", "pay"), max(a_ts, b_ts))] if pairs else [])
    stepwise(events, JoinSpec("interval", "inner", (lower, upper)), make_policy("default"), parallelism=1, batch_size=1)


# ------------------------------------------------------------------------------------------ ordered runs


@st.composite
def ordered_sides(draw: st.DrawFn) -> tuple[int, list[Rec], list[Rec]]:
    """Per side, records never more than ``d`` behind the newest before them in that source: none can be
    late, whatever the interleaving of the two sources and however they are batched."""
    d = draw(st.integers(0, 4))
    sides = []
    for side in (LEFT, RIGHT):
        newest = 0
        records = []
        for i in range(draw(st.integers(0, 14))):
            ts = max(0, newest + draw(st.integers(-d, 6)))
            newest = max(newest, ts)
            records.append(Rec(side, draw(st.sampled_from(KEYS)), f"{side}{i}", float(ts)))
        sides.append(records)
    return d, sides[0], sides[1]


@st.composite
def ordered_joins(draw: st.DrawFn) -> JoinSpec:
    kind = draw(st.sampled_from(["interval", "window", "session", "asof"]))
    if kind == "interval":
        lower = draw(st.integers(-8, 8))
        return JoinSpec(kind, draw(st.sampled_from(HOWS)), (float(lower), float(lower + draw(st.integers(0, 10)))))
    if kind == "window":
        return JoinSpec(kind, draw(st.sampled_from(HOWS)), draw(time_windows()))
    if kind == "session":  # a gap of n + 0.5 s: no session ends at a watermark, which is a whole second
        return JoinSpec(kind, draw(st.sampled_from(HOWS)), draw(st.integers(0, 5)) + 0.5)
    grace = draw(st.one_of(st.none(), st.integers(0, 6).map(float)))
    return JoinSpec(kind, draw(st.sampled_from(["inner", "left"])), grace)


@st.composite
def ordered_policies(draw: st.DrawFn, join: JoinSpec, processes: int) -> Policy:
    kind = draw(st.sampled_from(["default", "plain", "skip", "skip"] + (["restart"] if processes == 1 else [])))
    # the interval join dead-letters the second record of a failing pair, which depends on the
    # interleaving of the sources: there only unpaired emissions fail
    return make_policy(
        kind, draw(st.integers(0, 10_000)), draw(st.sampled_from([10, 30, 60])), only_unpaired=join.kind == "interval"
    )


def run_ordered(
    d: int,
    left: list[Rec],
    right: list[Rec],
    join: JoinSpec,
    policy: Policy,
    parallelism: int,
    batch_size: int,
    processes: int,
    state_backend: sl.RocksDBState | None = None,
) -> None:
    # no record can be late and nothing depends on the interleaving: the model may take the left
    # records, then the right ones, with no watermark before the end
    expected = join.expect([*left, *right], policy)
    topology = sl.Topology("spec-joins-ordered")
    node = join.add(topology, policy, parallelism)
    for port, name, records in ((sl.LEFT, "left", left), (sl.RIGHT, "right", right)):
        items = [sl.Record(r.key, r.value, r.ts) for r in records]
        source = topology.add_source(name, items, watermarks=sl.Watermarks(out_of_orderness=d))
        node.set_input(source, in_port=port, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    topology.add_sink("late", sl.CollectSink()).set_input(node, out_port=sl.LATE)
    result = sl.run(topology, batch_size=batch_size, processes=processes, state_backend=state_backend)

    got = Counter(out_row(r) for r in result.sink("out"))
    want = model_out(expected.outputs)
    assert got == want, f"outputs: {diff(want, got)}"
    assert result.sink("late") == []
    assert result.statistics.late == 0
    want_dead = model_plain(expected.dead)
    got_dead = Counter(plain_row(x.record) for x in result.dead_letters)
    assert got_dead == want_dead, f"dead letters: {diff(want_dead, got_dead)}"


@st.composite
def ordered_cases(draw: st.DrawFn, processes: int) -> tuple[Any, ...]:
    join = draw(ordered_joins())
    return draw(ordered_sides()), join, draw(ordered_policies(join, processes))


@pytest.mark.timeout(240)
@examples(0.5)
@given(
    case=ordered_cases(processes=1), parallelism=st.sampled_from([1, 3]), batch_size=st.integers(1, 6),
    rocks=st.booleans(),
)  # fmt: skip
def test_joins_ordered_run_in_process(case, parallelism, batch_size, rocks):
    """In process, the held records (and a failed call's undo) in the in-memory state or in RocksDB."""
    (d, left, right), join, policy = case
    with tempfile.TemporaryDirectory() as directory:
        backend = sl.RocksDBState(directory, cache_entries=4) if rocks else None
        run_ordered(d, left, right, join, policy, parallelism, batch_size, processes=1, state_backend=backend)


@pytest.mark.timeout(240)
@examples(0.1)
@given(case=ordered_cases(processes=2), parallelism=st.sampled_from([1, 3]), batch_size=st.integers(1, 6))
def test_joins_ordered_run_processes(case, parallelism, batch_size):
    (d, left, right), join, policy = case
    run_ordered(d, left, right, join, policy, parallelism, batch_size, processes=2)


# ------------------------------------------------------------------------------- a resume and a rescale mid-stream


class Crash(Exception):
    """The job's program dies after its checkpoint, leaving the ``async with`` like a crash."""


def _fed_join(join: JoinSpec, d: int, parallelism: int, sink: sl.Sink) -> sl.Topology:
    """The join fed by two QueueSources, ``left`` and ``right``."""
    topology = sl.Topology("spec-joins-fed")
    node = join.add(topology, make_policy("default"), parallelism)
    for port, name in ((sl.LEFT, "left"), (sl.RIGHT, "right")):
        source = topology.add_source(name, sl.QueueSource(), watermarks=sl.Watermarks(out_of_orderness=d))
        node.set_input(source, in_port=port, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sink).set_input(node)
    return topology


async def _feed_sides(job: sl.Job, records: list[Rec]) -> None:
    for record in records:
        await job.send(SOURCES[record.side], record.key, record.value, record.ts)
        await job.settle()


async def _close_sides(job: sl.Job) -> None:
    for name in SOURCES.values():
        await job.close_source(name)


def _as_json(rows: Any) -> Counter[Any]:
    """Rows as an exactly-once FileSink gives them back (JSON: tuples as lists), each part as its repr."""
    return Counter(tuple(repr(json.loads(json.dumps(part))) for part in row[:3]) for row in rows)


@pytest.mark.timeout(240)
@examples(0.25)
@given(case=ordered_cases(processes=1), parallelism=st.sampled_from([1, 3]), data=st.data())
def test_joins_resume_from_a_checkpoint_taken_at_a_random_point(case, parallelism, data):
    """Left records, then right ones (none can be late), two checkpoints after random records, a crash a few
    records later, a run resumed from the checkpoint fed what came after it: the exactly-once FileSink holds
    the model's pairs. The held records are in the in-memory state or in RocksDB (there the second checkpoint
    is incremental: the restore reads a chain), in either run."""
    (d, left, right), join, _ = case
    records = [*left, *right]
    expected = join.expect(records, make_policy("default"))
    taken = data.draw(st.integers(0, len(records)), label="checkpoint after")
    first = data.draw(st.integers(0, taken), label="first checkpoint after")
    crash = data.draw(st.integers(taken, len(records)), label="crash after")
    backends = data.draw(st.tuples(*[st.sampled_from(["memory", "rocksdb"])] * 2), label="backends")
    with tempfile.TemporaryDirectory() as directory:
        store, out = Path(directory) / "checkpoints", Path(directory) / "out"

        def backend(run: int) -> sl.RocksDBState | None:
            return sl.RocksDBState(Path(directory) / f"rocks{run}") if backends[run] == "rocksdb" else None

        async def first_run() -> None:
            topology = _fed_join(join, d, parallelism, sl.FileSink(out))
            async with sl.start(topology, checkpoint_dir=store, state_backend=backend(0)) as job:
                await _feed_sides(job, records[:first])
                await job.checkpoint()
                await _feed_sides(job, records[first:taken])
                await job.checkpoint()
                await _feed_sides(job, records[taken:crash])
                raise Crash

        async def resumed() -> None:
            topology = _fed_join(join, d, parallelism, sl.FileSink(out))
            async with sl.start(topology, checkpoint_dir=store, state_backend=backend(1)) as job:
                await _feed_sides(job, records[taken:])
                await _close_sides(job)
                await job.wait()

        with pytest.raises(Crash):
            asyncio.run(first_run())
        asyncio.run(resumed())
        got = _as_json(plain_row(r) for r in sl.read_file_sink(out))
    assert got == _as_json(model_out(expected.outputs).elements())


@pytest.mark.timeout(240)
@examples(0.25)
@given(case=ordered_cases(processes=1), parallelism=st.sampled_from([1, 3]), data=st.data())
def test_joins_through_a_live_rescale_at_a_random_point(case, parallelism, data):
    """The join rescaled (1 <-> 3 instances) after a random record: the model's pairs, as without it; its
    held records in the in-memory state or in RocksDB."""
    (d, left, right), join, _ = case
    records = [*left, *right]
    expected = join.expect(records, make_policy("default"))
    at = data.draw(st.integers(0, len(records)), label="rescale after")
    rocks = data.draw(st.booleans(), label="on RocksDB")

    async def run() -> sl.JobResult:
        with tempfile.TemporaryDirectory() as directory:
            backend = sl.RocksDBState(directory) if rocks else None
            async with sl.start(_fed_join(join, d, parallelism, sl.CollectSink()), state_backend=backend) as job:
                return await fed_and_rescaled(job)

    async def fed_and_rescaled(job: sl.Job) -> sl.JobResult:
        await _feed_sides(job, records[:at])
        await job.rescale(JOIN, 1 if parallelism == 3 else 3)
        await _feed_sides(job, records[at:])
        await _close_sides(job)
        return await job.wait()

    result = asyncio.run(run())
    got = Counter(out_row(r) for r in result.sink("out"))
    want = model_out(expected.outputs)
    assert got == want, f"outputs: {diff(want, got)}"


# ------------------------------------------------------------------------------- the model vs the page


def test_the_models_give_the_pages_examples():
    """Each example of docs/joins.md, replayed through the models, prints what the page shows."""
    minute = 60.0
    # orders and payments: list sources; with no record late the answer does not depend on the order
    events = [
        L("o1", 30.0, 0.0),
        L("o2", 12.5, 60.0),
        L("o3", 99.0, 120.0),
        R("o1", "card", 5 * minute),
        R("o2", "cash", 15 * minute),
        R("o3", "card", 125.0),
    ]
    got = sorted((k, v, ts) for k, v, ts, _ in model.interval_join(events, 0.0, 10 * minute, "left").outputs)
    assert got == [("o1", (30.0, "card"), 300.0), ("o2", (12.5, None), 60.0), ("o3", (99.0, "card"), 125.0)]
    # price at trade time
    events = [
        L("ACME", 100, 10.0),
        L("ACME", 50, 20.5),
        L("INIT", 7, 3.0),
        R("ACME", 9.5, 0.0),
        R("ACME", 9.75, 20.0),
        R("ACME", 10.0, 21.0),
    ]
    got = sorted((k, v, ts) for k, v, ts, _ in model.asof_join(events, "left", lambda s, q, p: (q, p)).outputs)
    assert got == [("ACME", (50, 9.75), 20.5), ("ACME", (100, 9.5), 10.0), ("INIT", (7, None), 3.0)]
    # views and buys in the same minute
    events = [L("u1", "/a", 1.0), L("u1", "/b", 42.0), L("u2", "/c", 5.0), R("u1", "book", 30.0), R("u2", "pen", 70.0)]
    got = Counter((k, v, w) for k, v, _, w in model.window_join(events, model.Tumbling(60.0), "outer").outputs)
    assert got == Counter(
        [
            ("u1", ("/a", "book"), (0.0, 60.0)),
            ("u1", ("/b", "book"), (0.0, 60.0)),
            ("u2", ("/c", None), (0.0, 60.0)),
            ("u2", (None, "pen"), (60.0, 120.0)),
        ]
    )
    # enrich clicks
    events = [
        L("u1", "/home", 0.0),
        R("u1", "Ada", 0.0),
        L("u1", "/cart", 0.0),
        R("u1", None, 0.0),
        L("u1", "/pay", 0.0),
    ]
    fn = lambda user, page, name: f"{name or '?'} saw {page}"  # noqa: E731
    assert [v for _, v, _, _ in model.table_join(events, "left", fn).outputs] == [
        "? saw /home",
        "Ada saw /cart",
        "? saw /pay",
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["interval", "window", "asof"])
def test_a_record_without_ts_fails_an_event_time_join(kind):
    """'A record without ts reaching an event-time join fails the job with a TaskError naming the node and
    the key.'"""
    join = {
        "interval": JoinSpec("interval", "inner", (0.0, 1.0)),
        "window": JoinSpec("window", "inner", model.Tumbling(5.0)),
        "asof": JoinSpec("asof"),
    }[kind]
    topology = sl.Topology("no-ts")
    node = join.add(topology, make_policy("default"), 1)
    node.set_input(topology.add_source("left", [sl.Record("k9", "x")]), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    node.set_input(
        topology.add_source("right", [sl.Record("k9", "y", 1.0)]), in_port=sl.RIGHT, partitioning=sl.SAME_KEY
    )
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    with pytest.raises(sl.TaskError) as raised:
        sl.run(topology)
    assert JOIN in str(raised.value)
    assert "k9" in str(raised.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kind",
    [
        "interval",
        "window",
        "asof",
        "table",
    ],
)
def test_fail_stops_the_job_naming_the_join_and_the_key(kind):
    """'fail stops the job naming it' (the default ``on_error``)."""
    join = {
        "interval": JoinSpec("interval", "inner", (-1.0, 1.0)),
        "window": JoinSpec("window", "inner", model.Tumbling(5.0)),
        "asof": JoinSpec("asof"),
        "table": JoinSpec("table", "left"),
    }[kind]  # left: fn is called, row or not
    policy = make_policy("default")
    policy.fn = lambda key, left, right: 1 / 0
    topology = sl.Topology("fail")
    node = join.add(topology, policy, 1)
    right = topology.add_source("right", [sl.Record("k9", "y", 1.0)])
    left = topology.add_source("left", [sl.Record("k9", "x", 1.0)])
    node.set_input(left, in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    node.set_input(right, in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    with pytest.raises(sl.TaskError) as raised:
        sl.run(topology)
    assert JOIN in str(raised.value)
    assert "k9" in str(raised.value)
    assert isinstance(raised.value.__cause__, ZeroDivisionError)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["interval", "window", "asof", "table"])
def test_validation_wants_same_key_on_both_ports(kind):
    """'both wired with partitioning=sl.SAME_KEY (validation refuses anything else, naming the node and port,
    and refuses a join with nothing on one of its ports)'."""
    join = {
        "interval": JoinSpec("interval", "inner", (0.0, 1.0)),
        "window": JoinSpec("window", "inner", model.Tumbling(5.0)),
        "asof": JoinSpec("asof"),
        "table": JoinSpec("table"),
    }[kind]
    for wiring in ("round-robin right", "no right"):
        topology = sl.Topology("wiring")
        node = join.add(topology, make_policy("default"), 2)
        node.set_input(topology.add_source("left", [sl.Record("k", 1, 1.0)]), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
        if wiring == "round-robin right":
            node.set_input(topology.add_source("right", [sl.Record("k", 2, 1.0)]), in_port=sl.RIGHT)
        topology.add_sink("out", sl.CollectSink()).set_input(node)
        with pytest.raises(sl.TopologyError) as raised:
            topology.validate()
        assert f"'{JOIN}'" in str(raised.value), (wiring, str(raised.value))
        assert "port 1" in str(raised.value), (wiring, str(raised.value))
