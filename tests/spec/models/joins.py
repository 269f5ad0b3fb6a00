"""Brute-force reference models of the four joins, written from ``docs/joins.md`` (and the window and
watermark rules of ``docs/windows.md``) alone.

Every model is a plain function of a *script*: the complete list of events in the order they reach the
join (a record on ``LEFT`` or ``RIGHT``, a watermark advance of one side, a tick of the job clock), each
event processed to the end before the next one comes (what ``job.settle()`` after each event gives).
From the script it recomputes, with plain loops over every record, what the join must do, and returns it
per event: an :class:`Outcome` whose ``steps[i]`` holds what event ``i`` caused (its outputs, its late
records, its dead letters), and whose last step is the end of input (the watermark at +infinity).

The join's watermark before event ``i`` is the minimum over its two inputs of the largest watermark that
input has announced so far (``-inf`` before the first: "a task's watermark is the minimum over its
inputs"; "it never goes back"). Nothing here keeps incremental indexes: a record's fate is found by
scanning the whole script.

Output records are ``(key, value, ts, window)`` (``window`` is ``None`` except for the window join), late
records and dead letters ``(key, value, ts)`` as the record arrived.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LEFT = "L"
RIGHT = "R"
INF = math.inf
#: The window join stamps results with a window's last tick: its end minus one ``time_unit`` (1 ms).
TICK = 0.001

#: ``fn(key, left_value, right_value)``: builds an output value.
JoinFn = Callable[[Any, Any, Any], Any]
#: ``raises(key, left_value, right_value)``: whether ``fn`` raises for that call (``skip`` dead-letters).
Raises = Callable[[Any, Any, Any], bool]


@dataclass(frozen=True)
class Rec:
    """A record reaching the join on ``side`` (``"L"`` or ``"R"``)."""

    side: str
    key: Any
    value: Any
    ts: float

    def row(self) -> tuple[Any, Any, float]:
        return (self.key, self.value, self.ts)


@dataclass(frozen=True)
class Mark:
    """The watermark of one input (``side``) announced as ``t``: no record below ``t`` follows on it."""

    side: str
    t: float


@dataclass(frozen=True)
class Tick:
    """The job clock moves ``seconds`` on (processing time: only the table join's ``state_ttl`` reads it)."""

    seconds: float


Event = Rec | Mark | Tick


@dataclass
class Step:
    outputs: list[tuple[Any, Any, float, Any]] = field(default_factory=list)
    late: list[tuple[Any, Any, float]] = field(default_factory=list)
    dead: list[tuple[Any, Any, float]] = field(default_factory=list)
    #: Records held after the step (interval join only: ``statistics().nodes[name].held``).
    held: int | None = None


@dataclass
class Outcome:
    steps: list[Step]

    @property
    def outputs(self) -> list[tuple[Any, Any, float, Any]]:
        return [o for s in self.steps for o in s.outputs]

    @property
    def late(self) -> list[tuple[Any, Any, float]]:
        return [o for s in self.steps for o in s.late]

    @property
    def dead(self) -> list[tuple[Any, Any, float]]:
        return [o for s in self.steps for o in s.dead]


def default_fn(key: Any, left: Any, right: Any) -> Any:
    """Without ``fn`` the value is ``(left_value, right_value)``."""
    return (left, right)


def never(key: Any, left: Any, right: Any) -> bool:
    return False


def watermarks(events: list[Event]) -> tuple[list[float], list[float]]:
    """The join's watermark just before and just after each event."""
    before: list[float] = []
    after: list[float] = []
    for i in range(len(events)):
        before.append(_watermark_after(events, i - 1))
        after.append(_watermark_after(events, i))
    return before, after


def _watermark_after(events: list[Event], last: int) -> float:
    """min over the two inputs of the largest mark each announced in events[0..last] (-inf if none)."""
    highest = {LEFT: -INF, RIGHT: -INF}
    for e in events[: last + 1]:
        if isinstance(e, Mark) and e.t > highest[e.side]:
            highest[e.side] = e.t
    return min(highest.values())


def _first_step_past(after: list[float], start: int, threshold: float) -> int:
    """The first event index >= start after which the watermark is > threshold; the end of input
    (len(after)) if none."""
    for k in range(start, len(after)):
        if after[k] > threshold:
            return k
    return len(after)


def _call(fn: JoinFn | None, key: Any, left: Any, right: Any) -> Any:
    return (fn or default_fn)(key, left, right)


# --------------------------------------------------------------------------------------------- interval


def interval_join(
    events: list[Event],
    lower: float,
    upper: float,
    how: str = "inner",
    fn: JoinFn | None = None,
    raises: Raises | None = None,
) -> Outcome:
    """``a.ts + lower <= b.ts <= a.ts + upper``; a pair when its second record arrives, ``ts = max``.

    A record is late when ``ts < W`` on arrival. A record is held until the watermark is greater than
    ``a.ts + max(upper, 0)`` (left) or ``b.ts + max(-lower, 0)`` (right); an outer kind's record that never
    paired comes out then, ``None`` on the other side, its own ``ts``. Under ``skip`` (``raises`` given) a
    record whose arrival makes ``fn`` raise is dead-lettered and leaves nothing: none of its pairs, not held.
    """
    raises = raises or never
    n = len(events)
    before, after = watermarks(events)
    steps = [Step() for _ in range(n + 1)]

    def release(r: Rec) -> float:
        return r.ts + max(upper, 0.0) if r.side == LEFT else r.ts + max(-lower, 0.0)

    def in_interval(a: Rec, b: Rec) -> bool:
        return a.ts + lower <= b.ts <= a.ts + upper

    on_time: list[int] = []
    for i, e in enumerate(events):
        if isinstance(e, Rec):
            if e.ts < before[i]:
                steps[i].late.append(e.row())
            else:
                on_time.append(i)

    dead: set[int] = set()
    paired: set[int] = set()
    for i in on_time:
        x = events[i]
        assert isinstance(x, Rec)
        made = []
        failed = False
        for j in on_time:
            y = events[j]
            assert isinstance(y, Rec)
            if j >= i or j in dead or y.side == x.side or y.key != x.key:
                continue
            if not before[i] <= release(y):  # no longer held when x arrives
                continue
            a, b = (x, y) if x.side == LEFT else (y, x)
            if not in_interval(a, b):
                continue
            if raises(x.key, a.value, b.value):
                failed = True
                break
            made.append((j, (x.key, _call(fn, x.key, a.value, b.value), max(a.ts, b.ts), None)))
        if failed:
            dead.add(i)
            steps[i].dead.append(x.row())
            continue
        for j, out in made:
            paired.add(i)
            paired.add(j)
            steps[i].outputs.append(out)

    unpaired_sides = {"inner": (), "left": (LEFT,), "right": (RIGHT,), "outer": (LEFT, RIGHT)}[how]
    for i in on_time:
        x = events[i]
        assert isinstance(x, Rec)
        if i in dead or i in paired or x.side not in unpaired_sides:
            continue
        k = _first_step_past(after, i, release(x))
        left, right = (x.value, None) if x.side == LEFT else (None, x.value)
        if raises(x.key, left, right):
            steps[k].dead.append(x.row())
        else:
            steps[k].outputs.append((x.key, _call(fn, x.key, left, right), x.ts, None))

    for k in range(n + 1):
        w = after[k] if k < n else INF
        steps[k].held = sum(
            1
            for i in on_time
            if i <= k and i not in dead and w <= release(events[i])  # type: ignore[arg-type]
        )
    return Outcome(steps)


# ----------------------------------------------------------------------------------------------- window


def ticks(t: float) -> float:
    """A time in whole ticks of the window's ``time_unit`` (1 ms): "a timestamp becomes its nearest tick";
    the watermark's +-infinity stays as it is."""
    return t if math.isinf(t) else round(t / TICK)


@dataclass(frozen=True)
class Tumbling:
    """``sl.TimeWindow(size, slide, time="event", offset=offset)`` (``slide=None``: ``size``)."""

    size: float
    slide: float | None = None
    offset: float = 0.0

    def windows(self, t: float) -> list[tuple[int, int]]:
        """Every ``[start, end)`` in ticks holding ``t``: the starts are ``offset + k * slide``."""
        size, slide, offset, at = ticks(self.size), ticks(self.slide or self.size), ticks(self.offset), ticks(t)
        out = []
        k = (at - offset) // slide  # the last start at or before t, then back while the window still holds t
        while offset + k * slide + size > at:
            out.append((offset + k * slide, offset + k * slide + size))
            k -= 1
        return out


@dataclass(frozen=True)
class Sessions:
    """``sl.SessionWindow(gap, time="event")``, per key over both inputs."""

    gap: float


def _fire_window(
    key: Any,
    bounds: tuple[int, int],
    members: list[Rec],
    how: str,
    fn: JoinFn | None,
    raises: Raises,
    step: Step,
) -> None:
    """Every (left, right) pair, left-major and each side in arrival order, stamped with the window's last
    tick; an outer kind's side without partner with ``None``. Under ``skip`` a left record of a failing pair
    is dead-lettered and the window joined without it."""
    window = (bounds[0] * TICK, bounds[1] * TICK)
    ts = (bounds[1] - 1) * TICK
    lefts = [r for r in members if r.side == LEFT]
    rights = [r for r in members if r.side == RIGHT]
    kept = []
    for a in lefts:
        if any(raises(key, a.value, b.value) for b in rights):
            step.dead.append(a.row())
        else:
            kept.append(a)
    for a in kept:
        for b in rights:
            step.outputs.append((key, _call(fn, key, a.value, b.value), ts, window))
    if not rights and how in ("left", "outer"):
        for a in kept:
            if raises(key, a.value, None):
                step.dead.append(a.row())
            else:
                step.outputs.append((key, _call(fn, key, a.value, None), ts, window))
    if not kept and how in ("right", "outer"):
        for b in rights:
            if raises(key, None, b.value):
                step.dead.append(b.row())
            else:
                step.outputs.append((key, _call(fn, key, None, b.value), ts, window))


def window_join(
    events: list[Event],
    window: Tumbling | Sessions,
    how: str = "inner",
    fn: JoinFn | None = None,
    raises: Raises | None = None,
) -> Outcome:
    """Every window of a key fires when the watermark reaches its end (``W >= end``, in ticks); a record is
    late when every window it falls in has ended by its arrival; a record of a sliding window joins only its
    windows still open."""
    if isinstance(window, Sessions):
        return _session_join(events, window.gap, how, fn, raises or never)
    raises = raises or never
    n = len(events)
    before, after = watermarks(events)
    steps = [Step() for _ in range(n + 1)]
    # every (key, window) and the records it took, in arrival order
    contents: dict[tuple[Any, tuple[int, int]], list[tuple[int, Rec]]] = {}
    for i, e in enumerate(events):
        if not isinstance(e, Rec):
            continue
        still_open = [w for w in window.windows(e.ts) if w[1] > ticks(before[i])]
        if not still_open:  # every window it falls in ended at or before the watermark
            steps[i].late.append(e.row())
            continue
        for w in still_open:
            contents.setdefault((e.key, w), []).append((i, e))
    for (key, bounds), members in contents.items():
        first = members[0][0]
        k = n  # the end of input, unless the watermark reaches the window's end before
        for j in range(first, n):
            if ticks(after[j]) >= bounds[1]:
                k = j
                break
        assert all(i < k for i, _ in members)
        _fire_window(key, bounds, [r for _, r in members], how, fn, raises, steps[k])
    return Outcome(steps)


def _session_join(events: list[Event], gap: float, how: str, fn: JoinFn | None, raises: Raises) -> Outcome:
    """Sessions per key over both inputs: a record's own window is ``[t, t + gap)``; windows that overlap
    or touch merge; a session is ``[first ts, last ts + gap)`` and fires when the watermark reaches its end.
    A record that touches no open session of its key and whose own window ended (``t + gap <= W``) is late.
    All in ticks."""
    n = len(events)
    before, after = watermarks(events)
    steps = [Step() for _ in range(n + 1)]
    g = ticks(gap)
    open_sessions: list[tuple[Any, list[int]]] = []  # (key, indexes of its records in arrival order)

    def bounds(members: list[int]) -> tuple[int, int]:
        times = [ticks(events[j].ts) for j in members]  # type: ignore[union-attr]
        return (min(times), max(times) + g)

    def fire(key: Any, members: list[int], step: Step) -> None:
        _fire_window(key, bounds(members), [events[j] for j in members], how, fn, raises, step)  # type: ignore[misc]

    for i, e in enumerate(events):
        if isinstance(e, Rec):
            t = ticks(e.ts)
            touching = [s for s in open_sessions if s[0] == e.key and t <= bounds(s[1])[1] and bounds(s[1])[0] <= t + g]
            if not touching and t + g <= ticks(before[i]):
                steps[i].late.append(e.row())
            else:
                merged = [i]
                for s in touching:
                    merged.extend(s[1])
                    open_sessions.remove(s)
                open_sessions.append((e.key, sorted(merged)))  # each side in arrival order
        for s in list(open_sessions):
            if ticks(after[i]) >= bounds(s[1])[1]:  # the watermark reaches the session's end
                open_sessions.remove(s)
                fire(s[0], s[1], steps[i])
    for key, members in open_sessions:
        fire(key, members, steps[n])
    return Outcome(steps)


# ------------------------------------------------------------------------------------------------ as-of


def asof_join(
    events: list[Event],
    how: str = "inner",
    fn: JoinFn | None = None,
    raises: Raises | None = None,
    grace: float | None = None,
) -> Outcome:
    """Each left record meets the right record of its key with the greatest ``ts <=`` its own (equal ``ts``:
    the one that came last), once the watermark is greater than its ``ts``; a right value ``None`` is no
    row. A left record more than ``grace`` behind the watermark is late; right records never are."""
    raises = raises or never
    g = grace or 0.0
    n = len(events)
    before, after = watermarks(events)
    steps = [Step() for _ in range(n + 1)]
    for i, e in enumerate(events):
        if not isinstance(e, Rec) or e.side != LEFT:
            continue
        if e.ts < before[i] - g:
            steps[i].late.append(e.row())
            continue
        k = i if before[i] > e.ts else _first_step_past(after, i, e.ts)
        best: Rec | None = None
        for j in range(k):  # the right records that came before the emission
            r = events[j]
            is_candidate = isinstance(r, Rec) and r.side == RIGHT and r.key == e.key and r.ts <= e.ts
            if is_candidate and (best is None or r.ts >= best.ts):  # equal ts: the one that came last
                best = r  # type: ignore[assignment]
        row = best.value if best is not None else None
        if row is None and how == "inner":
            continue
        if raises(e.key, e.value, row):
            steps[k].dead.append(e.row())
        else:
            steps[k].outputs.append((e.key, _call(fn, e.key, e.value, row), e.ts, None))
    return Outcome(steps)


# ------------------------------------------------------------------------------------------------ table


def table_join(
    events: list[Event],
    how: str = "inner",
    fn: JoinFn | None = None,
    raises: Raises | None = None,
    state_ttl: float | None = None,
) -> Outcome:
    """Processing order: a right record sets its key's row (``None`` deletes it) and emits nothing; a left
    record meets the row its key holds then (expired ``state_ttl`` or more seconds of the job clock after
    its last write), ``ts`` its own. Watermarks play no part and nothing is late."""
    raises = raises or never
    n = len(events)
    steps = [Step() for _ in range(n + 1)]
    for i, e in enumerate(events):
        if not isinstance(e, Rec) or e.side != LEFT:
            continue
        now = sum(t.seconds for t in events[:i] if isinstance(t, Tick))
        row = None
        for j in range(i):  # the last write of the key before i
            r = events[j]
            if isinstance(r, Rec) and r.side == RIGHT and r.key == e.key:
                written = sum(t.seconds for t in events[:j] if isinstance(t, Tick))
                row = r.value
                if row is not None and state_ttl is not None and now - written >= state_ttl:
                    row = None
        if row is None and how == "inner":
            continue
        if raises(e.key, e.value, row):
            steps[i].dead.append(e.row())
        else:
            steps[i].outputs.append((e.key, _call(fn, e.key, e.value, row), e.ts, None))
    return Outcome(steps)
