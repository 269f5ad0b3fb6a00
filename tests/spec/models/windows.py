"""Brute-force models of streamlet's windows, written from docs/windows.md (and the window classes' docstrings)
alone, without reading the implementation.

Every model is a plain function over the whole trace the windowed task sees, in order: the records that reach
it, the watermark steps between them, the ticks of the early-firing clock and the end of the input. Nothing is
kept per window: whenever a window fires, its content is found again by scanning every record accepted so far,
and its value is folded from scratch.

The pieces of the page the models rest on (``docs/windows.md``):

* time counts in whole ticks of ``time_unit``; a timestamp (and a watermark) becomes its nearest tick, and
  bounds in seconds are ticks times ``time_unit`` computed exactly;
* ``TimeWindow``: windows ``[offset + k*slide, offset + k*slide + size)``; a record is *late* when every window it
  falls in ended at or before ``watermark - allowed_lateness``, and is added only to its windows that did not;
  a window fires ``on_time`` when the watermark reaches its end, ``late`` (once per record, at once) when a record
  within the lateness reaches a window the watermark has passed (only that record's key), ``early`` at a tick of
  the early clock when it took records since the previous tick and has not fired on time; windows closing on one
  watermark fire in the order of their ends, then starts (the order of keys within is not said);
* ``SessionWindow``: per key, a record's own window is ``[t, t + gap)``, windows that overlap or touch merge,
  sessions close (``on_time``) when the watermark reaches their end, in the order of end and start; a closed
  session is kept ``allowed_lateness`` longer and a record joining it fires it ``late`` (or, stretching it past
  the watermark, opens it again); a record joining no session whose own window ends ``allowed_lateness`` or more
  before the watermark is late;
* ``CountWindow``: windows ``[k*slide, k*slide + size)`` of record indexes (per instance, or per key), handed over
  as they fill; at the end each open window ends at the last record;
* results are ``(key, fold)`` per window and key, stamped with the window's last tick (a count window: the ts of
  the window's last record, for every key alike);
* a source's watermark after each batch: the largest ts read so far minus ``out_of_orderness``, or the largest
  ``fn(record)`` that is not ``None``; it never goes back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

EARLY, ON_TIME, LATE = "early", "on_time", "late"


# ----------------------------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class Rec:
    """A record reaching the windowed task; ``index`` is its place in the whole input."""

    index: int
    key: Any
    value: Any
    ts: float


@dataclass(frozen=True)
class Watermark:
    """The task's watermark is now ``at`` seconds (``-inf`` before any, never lower than before)."""

    at: float


@dataclass(frozen=True)
class Tick:
    """The clock reached the next multiple of ``early_firing``."""


@dataclass(frozen=True)
class End:
    """Every input has ended: the watermark is at +infinity."""


Event = Rec | Watermark | Tick | End


@dataclass(frozen=True)
class Result:
    """One ``window_reduce`` result: what the sink sees."""

    key: Any
    value: Any
    window: tuple[Any, Any]
    ts: float
    firing: str
    moment: int = 0  # the place in the trace of what fired it (results of one moment and window come together)


def source_watermarks(
    batches: Sequence[Sequence[Rec]], out_of_orderness: float = 0.0, fn: Callable[[Rec], float | None] | None = None
) -> list[float]:
    """The watermark a source instance sends after each of its ``batches`` (``-inf`` while it has none)."""
    marks = []
    for n in range(len(batches)):
        read = [record for batch in batches[: n + 1] for record in batch]
        if fn is None:
            times = [record.ts for record in read if record.ts is not None]
            mark = max(times) - out_of_orderness if times else -math.inf
        else:
            hints = [hint for hint in (fn(record) for record in read) if hint is not None]
            mark = max(hints) if hints else -math.inf  # the largest over every batch so far: it never goes back
        marks.append(mark)
    return marks


def source_trace(
    records: Sequence[Rec],
    batch_size: int,
    out_of_orderness: float = 0.0,
    fn: Callable[[Rec], float | None] | None = None,
) -> list[Event]:
    """What a task fed by one source instance sees: each batch of ``batch_size`` records, then the watermark."""
    batches = [list(records[i : i + batch_size]) for i in range(0, len(records), batch_size)]
    trace: list[Event] = []
    for batch, mark in zip(batches, source_watermarks(batches, out_of_orderness, fn), strict=True):
        trace.extend(batch)
        trace.append(Watermark(mark))
    trace.append(End())
    return trace


# ----------------------------------------------------------------------------------------------- ticks and folds


class Ticks:
    """Whole ticks of ``time_unit`` seconds, and back to seconds exactly."""

    def __init__(self, time_unit: float) -> None:
        self.unit = Fraction(repr(float(time_unit)))  # 0.1 is one tenth, not the float nearest it

    def nearest(self, seconds: float) -> int:
        exact = Fraction(seconds) / self.unit
        below = math.floor(exact)
        return below if exact - below < Fraction(1, 2) else below + 1

    def watermark(self, seconds: float) -> float:
        """A watermark in ticks: its nearest tick, or an infinity as it is."""
        return seconds if math.isinf(seconds) else self.nearest(seconds)

    def whole(self, seconds: float) -> int:
        ticks = self.nearest(seconds)
        assert abs(float(ticks * self.unit) - seconds) < 1e-9, seconds
        return ticks

    def seconds(self, ticks: int) -> float:
        return float(ticks * self.unit)


def fold(how: str | Callable[[Any, Any], Any], values: Sequence[Any]) -> Any:
    """``window_reduce``'s fold of ``values`` in the order they came (the first value is the start)."""
    assert values
    if how == "count":
        return len(values)
    if how == "min":
        return min(values)
    if how == "max":
        return max(values)
    acc = values[0]
    for value in values[1:]:
        acc = acc + value if how == "sum" else how(acc, value)  # type: ignore[operator]
    return acc


def _key_order(records: Iterable[Rec]) -> dict[Any, int]:
    order: dict[Any, int] = {}
    for record in records:
        order.setdefault(record.key, len(order))
    return order


# ----------------------------------------------------------------------------------------------- TimeWindow


def time_windows(
    trace: Sequence[Event],
    *,
    size: float,
    slide: float | None = None,
    offset: float = 0.0,
    allowed_lateness: float = 0.0,
    time_unit: float = 0.001,
    how: str | Callable[[Any, Any], Any] = "sum",
) -> tuple[list[Result], list[Rec]]:
    """``window_reduce(how, window=TimeWindow(size, slide, time="event", allowed_lateness, offset, time_unit,
    early_firing=...))`` over ``trace`` (one task instance, or several: the results of one key are the same).
    Returns the results in the order they are emitted and the late records."""
    ticks = Ticks(time_unit)
    S, L = ticks.whole(size), ticks.whole(size if slide is None else slide)
    OFF, AL = ticks.whole(offset), ticks.whole(allowed_lateness)
    assert 0 < L <= S

    def windows_of(t: int) -> list[tuple[int, int]]:
        first, last = -((S - 1 - t + OFF) // L), (t - OFF) // L  # every k with start <= t < start + S
        found = [(OFF + k * L, OFF + k * L + S) for k in range(first - 1, last + 2)]
        return [(start, end) for start, end in found if start <= t < end]

    watermark: float = -math.inf
    accepted: list[tuple[Rec, list[tuple[int, int]], int]] = []  # every record taken, its windows, its place
    last_tick = -1  # the place in the trace of the previous tick of the early clock
    results: list[Result] = []
    late: list[Rec] = []

    def fire(key: Any, window: tuple[int, int], firing: str, moment: int) -> None:
        values = [record.value for record, joined, _ in accepted if record.key == key and window in joined]
        assert values
        start, end = window
        bounds = (ticks.seconds(start), ticks.seconds(end))
        results.append(Result(key, fold(how, values), bounds, ticks.seconds(end - 1), firing, moment))

    def held(after: float, upto: float, since: int = -1) -> list[tuple[Any, tuple[int, int]]]:
        """Every (key, window) ending in ``(after, upto]`` that took records after place ``since``, in the order
        they fire."""
        order = _key_order(record for record, _, _ in accepted)
        pairs = {
            (record.key, window)
            for record, joined, taken in accepted
            for window in joined
            if after < window[1] <= upto and taken > since
        }
        return sorted(pairs, key=lambda pair: (pair[1][1], pair[1][0], order[pair[0]]))

    for place, event in enumerate(trace):
        if isinstance(event, Rec):
            t = ticks.nearest(event.ts)
            joined = [window for window in windows_of(t) if not window[1] <= watermark - AL]
            if not joined:
                late.append(event)
                continue
            accepted.append((event, joined, place))
            for window in sorted(joined, key=lambda w: w[1]):
                if window[1] <= watermark:  # the watermark has passed it: this record fires it again, at once
                    fire(event.key, window, LATE, place)
        elif isinstance(event, Tick):  # open windows that took records since the previous tick fire early
            for key, window in held(watermark, math.inf, since=last_tick):
                fire(key, window, EARLY, place)
            last_tick = place
        else:
            new = math.inf if isinstance(event, End) else max(watermark, ticks.watermark(event.at))
            for key, window in held(watermark, new):
                fire(key, window, ON_TIME, place)
            watermark = new
    return results, late


# ----------------------------------------------------------------------------------------------- SessionWindow


@dataclass
class _Session:
    start: int
    end: int
    records: list[Rec]
    fired: bool  # fired on time (or late) and not opened again since


def session_windows(
    trace: Sequence[Event],
    *,
    gap: float,
    allowed_lateness: float = 0.0,
    time_unit: float = 0.001,
    how: str | Callable[[Any, Any], Any] = "sum",
) -> tuple[list[Result], list[Rec]]:
    """``window_reduce(how, window=SessionWindow(gap, time="event", allowed_lateness, time_unit=...))`` over
    ``trace``. ``how`` as a function must be associative and commutative (merged sessions fold their folds)."""
    ticks = Ticks(time_unit)
    G, AL = ticks.whole(gap), ticks.whole(allowed_lateness)
    watermark: float = -math.inf
    sessions: list[tuple[Any, _Session]] = []  # every session kept, of every key
    results: list[Result] = []
    late: list[Rec] = []

    def fire(key: Any, session: _Session, firing: str, moment: int) -> None:
        values = [record.value for record in session.records]
        window = (ticks.seconds(session.start), ticks.seconds(session.end))
        results.append(Result(key, fold(how, values), window, ticks.seconds(session.end - 1), firing, moment))
        session.fired = True

    for place, event in enumerate(trace):
        if isinstance(event, Rec):
            t = ticks.nearest(event.ts)
            own = _Session(t, t + G, [event], False)
            touching = [(k, s) for k, s in sessions if k == event.key and s.start <= own.end and own.start <= s.end]
            if not touching and own.end <= watermark - AL:
                late.append(event)
                continue
            merged = own
            for pair in touching:
                sessions.remove(pair)
                _, s = pair
                merged = _Session(min(merged.start, s.start), max(merged.end, s.end), s.records + merged.records, False)
            merged.records.sort(key=lambda record: record.index)
            sessions.append((event.key, merged))
            if merged.end <= watermark:  # the watermark has passed it: it fires at once, late
                fire(event.key, merged, LATE, place)
        elif isinstance(event, Tick):
            raise AssertionError("session windows have no early firings")
        else:
            new = math.inf if isinstance(event, End) else max(watermark, ticks.watermark(event.at))
            due = [(key, s) for key, s in sessions if not s.fired and s.end <= new]
            for key, session in sorted(due, key=lambda pair: (pair[1].end, pair[1].start)):  # by end, then start
                fire(key, session, ON_TIME, place)
            watermark = new
            sessions = [(k, s) for k, s in sessions if not s.end <= watermark - AL]  # past the lateness: forgotten
    return results, late


# ----------------------------------------------------------------------------------------------- CountWindow


def count_windows(
    records: Sequence[Rec], *, size: int, slide: int | None = None, per_key: bool = False, how: Any = "sum"
) -> list[Result]:
    """``window_reduce(how, window=CountWindow(size, slide, per_key))`` on one instance receiving ``records`` in
    this order. Windows start at index 0 and every ``slide`` after it; each emits one result per key it holds."""
    L = size if slide is None else slide
    assert 0 < L <= size
    results: list[Result] = []

    def emit(window_records: list[Rec], bounds: tuple[int, int], moment: int) -> None:
        for key in _key_order(window_records):  # the order of the keys of one window is not said
            mine = [record for record in window_records if record.key == key]
            last = window_records[-1].ts  # every result of a count window: the ts of the window's last record
            results.append(Result(key, fold(how, [r.value for r in mine]), bounds, last, ON_TIME, moment))

    def stream_of(key: Any) -> list[Rec]:
        return [record for record in records if not per_key or record.key == key]

    # as records arrive: the window [start, start + size) of a stream fills with its record number start + size
    for n, record in enumerate(records):
        stream = stream_of(record.key)
        position = stream.index(record)  # its index in its stream (records are distinct)
        start = position + 1 - size
        if start >= 0 and start % L == 0:
            emit(stream[start : start + size], (start, start + size), n)
    # the end of the input: every window that started and did not fill ends at the stream's last record, the
    # streams of the keys in the order they first came
    moment = len(records)
    for key in list(_key_order(records)) if per_key else [None]:
        stream = stream_of(key)
        for start in range(0, len(stream), L):
            if start + size > len(stream):
                emit(stream[start:], (start, len(stream)), moment)
                moment += 1
    return results
