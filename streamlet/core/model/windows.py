"""Windows: count, time (processing or event) and count-or-time.

A window *spec* (``CountWindow(1000)``) is plain configuration;
``core.windows.build.logic_for(spec)`` makes the per-instance *logic*
(``core/windows/logic.py``) that assigns records to windows and says which
have closed. Logic objects know nothing of the
runtime: they take batches and the current time and return closed windows,
so they are tested directly, and their ``snapshot()`` goes into checkpoints.
"""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal, TypeAlias

from streamlet.core.model.record import Record
from streamlet.errors import TopologyError

__all__ = (
    "BUILT_IN_FOLDS",
    "CountOrTimeWindow",
    "CountWindow",
    "FoldHow",
    "SessionWindow",
    "Ticks",
    "TimeWindow",
    "WindowSpec",
)

#: How ``window_reduce`` combines values per key: a built-in name or ``fn(acc, value) -> acc``.
FoldHow: TypeAlias = "str | Callable[[Any, Any], Any]"
BUILT_IN_FOLDS = ("sum", "count", "min", "max")

TimeKind = Literal["processing", "event"]
MissingTs = Literal["clock", "fail"]


class WindowSpec(ABC):  # noqa: B024 - a base for isinstance checks and validate(), no abstract method
    """Configuration of a window: plain data; ``core.windows.build.logic_for`` makes its logic per instance."""

    def validate(self, where: str) -> None:
        """Raise ``TopologyError`` (naming ``where``) for impossible sizes."""


def _positive(where: str, name: str, value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise TopologyError(f"{where}: window {name} must be > 0, got {value!r}")


def _slide_within_size(where: str, size: float, slide: float) -> None:
    if slide > size:
        raise TopologyError(
            f"{where}: window slide {slide!r} is larger than its size {size!r}: records between two windows "
            "would belong to none (sample or filter before a tumbling window instead)"
        )


def _check_time_kind(where: str, time: str, allowed_lateness: float, missing_ts: str) -> None:
    """What time and event-time windows share: a known time kind, lateness >= 0 on event time only."""
    if time not in ("processing", "event"):
        raise TopologyError(f"{where}: window time must be 'processing' or 'event', got {time!r}")
    if allowed_lateness < 0:
        raise TopologyError(f"{where}: allowed_lateness must be >= 0, got {allowed_lateness!r}")
    if allowed_lateness and time != "event":
        raise TopologyError(f"{where}: allowed_lateness applies to event time only (time='event')")
    if missing_ts not in ("clock", "fail"):
        raise TopologyError(f"{where}: missing_ts must be 'clock' or 'fail', got {missing_ts!r}")


class Ticks:
    """Seconds <-> whole ticks of ``unit`` seconds. A timestamp becomes its nearest tick; a tick back in
    seconds is the float nearest to its exact value (``Ticks(0.001).seconds(300) == 0.3``).

    Example:
        >>> ticks = Ticks(0.001)
        >>> ticks.of(0.35), ticks.seconds(400), ticks.whole(0.1), ticks.whole(0.0015)
        (350, 0.4, 100, None)
    """

    __slots__ = ("_divisor", "per_second", "unit")

    def __init__(self, unit: float) -> None:
        # 0.001 is not exact in binary: the nearest fraction with a small denominator is the unit meant
        self.unit = Fraction(unit).limit_denominator(10**9)
        self.per_second = float(1 / self.unit)
        # a unit of 1/n s: tick / n is one correctly rounded float division, ~40x cheaper than a Fraction
        self._divisor = self.unit.denominator if self.unit.numerator == 1 else 0

    @property
    def divisor(self) -> int:
        """``n`` for a unit of ``1/n`` s, where a tick in seconds is ``tick / n`` (what :meth:`seconds` gives,
        for loops that convert many ticks without a call each); 0 for other units."""
        return self._divisor

    def of(self, seconds: float) -> int:
        """The tick nearest to ``seconds``."""
        return round(seconds * self.per_second)

    def seconds(self, tick: int) -> float:
        """Tick ``tick`` in seconds (correctly rounded: exact ticks print as the user wrote them)."""
        if self._divisor:
            return tick / self._divisor
        return float(tick * self.unit)

    def bound(self, tick: int, whole_seconds: bool) -> float:
        """Tick ``tick`` in seconds, an ``int`` when ``whole_seconds`` (the records' timestamps are ints) and
        it is a whole second: a window of int timestamps reports int bounds, as the user's data has them."""
        seconds = self.seconds(tick)
        return int(seconds) if whole_seconds and seconds.is_integer() else seconds

    def whole(self, seconds: float) -> int | None:
        """``seconds`` as a whole number of ticks, or ``None`` when it is not one."""
        tick = self.of(seconds)
        return tick if math.isclose(tick, seconds * self.per_second, rel_tol=1e-9, abs_tol=1e-6) else None


@dataclass(frozen=True, slots=True)
class CountWindow(WindowSpec):
    """Windows of ``size`` records, a new one every ``slide`` records (tumbling when ``slide`` is None).

    ``inputs.window`` is ``(start, end)``: the indexes of the first record and
    one past the last, counted over everything this instance received.

    With ``per_key=True`` each key has windows of its own: ``size`` of its
    records, a new one every ``slide`` of its records, and ``inputs.window``
    is ``(start, end)`` indexes within that key's records. Windows are handed
    over in the order they filled; at end of stream each key's partial
    windows end at its last record (keys in the order they first came).

    Example:
        >>> CountWindow(1000)             # tumbling
        CountWindow(size=1000, slide=None, per_key=False)
        >>> CountWindow(3, per_key=True)  # every 3 records of each key
        CountWindow(size=3, slide=None, per_key=True)
    """

    size: int
    slide: int | None = None
    per_key: bool = False

    def validate(self, where: str) -> None:
        """Sizes are whole numbers > 0; ``per_key`` is a bool."""
        for name, value in (("size", self.size), ("slide", (self.size if self.slide is None else self.slide))):
            if not isinstance(value, int):
                raise TopologyError(f"{where}: window {name} must be a whole number of records, got {value!r}")
            _positive(where, name, value)
        if not isinstance(self.per_key, bool):
            raise TopologyError(f"{where}: window per_key must be True or False, got {self.per_key!r}")
        _slide_within_size(where, self.size, self.size if self.slide is None else self.slide)


@dataclass(frozen=True, slots=True)
class TimeWindow(WindowSpec):
    """Windows of ``size`` seconds starting every ``slide`` seconds (tumbling when ``slide`` is None).

    ``time="processing"`` assigns records by the clock when they arrive and
    closes a window when the clock passes its end. ``time="event"`` assigns
    by ``record.ts`` and closes a window when the *watermark* reaches its
    end. Watermarks come from the sources (``add_source(...,
    watermarks=Watermarks(...))``: the largest event time read minus a
    declared out-of-orderness bound), and a task's watermark is the minimum
    over its inputs, so which records are late never depends on the
    parallelism. A window fires once, ``"on_time"``, when the watermark
    passes its end; with ``allowed_lateness`` it is kept that much longer
    and a record for it fires it again, marked ``"late"``, with everything
    it holds. A record whose every window is past that is *late*: it is
    counted, goes to the task's late output port and to ``on_late``, never
    dropped silently. With ``early_firing``, open windows that took records
    fire every ``early_firing`` seconds of the clock before their end,
    marked ``"early"`` (``inputs.firing`` and each result's ``firing``
    say which). With ``idle_timeout``, a stream that stays quiet that many
    seconds closes its open windows as if the watermark had passed them.
    Windows start at ``offset`` plus a whole number of slides (``offset=
    1800`` with ``size=3600``: hours from half past). ``inputs.window`` is
    ``(start, end)`` in seconds.

    ``missing_ts`` says what an event-time window does with a record whose
    ``ts`` is ``None``: ``"clock"`` (the default) places it at the job
    clock's time when it arrives; ``"fail"`` stops the job with a
    ``TaskError`` naming the task, the port and the record's key.

    Time is counted in whole ticks of ``time_unit`` seconds (default 1 ms),
    because floats cannot hold 0.1 exactly: a timestamp becomes its nearest
    tick, window bounds are integer tick arithmetic (tumbling and sliding
    alike), and ``size``, ``slide``, ``offset`` and ``allowed_lateness`` must
    be whole numbers of ticks. So 0.3 and 0.35 fall in ``(0.3, 0.4)`` and 0.5
    in ``(0.5, 0.6)`` with ``TimeWindow(0.1)``. A window's results are
    stamped with its last tick (its end minus one tick): fed into a longer
    window they land in the window that holds the whole of theirs.

    A slide larger than the size is refused: records between two windows
    would belong to none.
    """

    size: float
    slide: float | None = None
    time: TimeKind = "processing"
    allowed_lateness: float = 0.0
    idle_timeout: float | None = None
    on_late: Callable[[Record], Any] | None = field(default=None, compare=False)
    missing_ts: MissingTs = "clock"
    time_unit: float = 0.001
    offset: float = 0.0
    early_firing: float | None = None

    def validate(self, where: str) -> None:
        """Positive sizes that are whole numbers of ticks, a known time kind, non-negative lateness."""
        _positive(where, "time_unit", self.time_unit)
        _positive(where, "size", self.size)
        slide = self.size if self.slide is None else self.slide
        _positive(where, "slide", slide)
        _slide_within_size(where, self.size, slide)
        ticks = Ticks(self.time_unit)
        named = ("size", self.size), ("slide", self.slide), ("allowed_lateness", self.allowed_lateness)
        for name, value in (*named, ("offset", self.offset)):
            if isinstance(value, int | float) and value >= 0 and ticks.whole(value) is None:
                raise TopologyError(
                    f"{where}: window {name} {value!r} is not a whole number of ticks of time_unit {self.time_unit!r} s"
                )
        _check_time_kind(where, self.time, self.allowed_lateness, self.missing_ts)
        if not isinstance(self.offset, int | float) or not 0 <= self.offset < slide:
            raise TopologyError(
                f"{where}: window offset must be >= 0 and below the slide {slide!r}, got {self.offset!r}"
            )
        if self.idle_timeout is not None:
            _positive(where, "idle_timeout", self.idle_timeout)
        if self.early_firing is not None:
            _positive(where, "early_firing", self.early_firing)


@dataclass(frozen=True, slots=True)
class CountOrTimeWindow(WindowSpec):
    """Tumbling windows that close after ``count`` records or ``seconds`` after they opened, whichever is first.

    Processing time; ``inputs.window`` is ``(opened, closed)`` in seconds.
    """

    count: int
    seconds: float

    def validate(self, where: str) -> None:
        """A whole count > 0 and seconds > 0."""
        if not isinstance(self.count, int):
            raise TopologyError(f"{where}: window count must be a whole number of records, got {self.count!r}")
        _positive(where, "count", self.count)
        _positive(where, "seconds", self.seconds)


@dataclass(frozen=True, slots=True)
class SessionWindow(WindowSpec):
    """Per-key sessions: a key's records that follow each other within ``gap`` seconds share a window.

    A record at time ``t`` opens the session ``[t, t + gap)`` for its key;
    sessions of one key that overlap or touch are merged, so a record can
    bridge two sessions into one. A session ends ``gap`` after its latest
    record: ``inputs.window`` is ``(start, end)`` in seconds, and each
    session holds one key (``window_reduce`` emits one result per session).
    Merging sessions with ``window_reduce`` combines their values with the
    fold itself (a function gets ``fn(earlier, later)``, so it should be
    associative, as a sum, a product or a max is).

    ``time="processing"`` places records at the job clock's time when they
    arrive and closes a session when the clock reaches its end.
    ``time="event"`` places them at ``record.ts`` (``missing_ts`` as for
    :class:`TimeWindow`) and closes a session, marked ``"on_time"``, when the
    watermark reaches its end. With ``allowed_lateness`` a closed session is
    kept that much longer: a record that joins it fires it again, marked
    ``"late"``, with everything it holds (a record that stretches it past the
    watermark opens it again instead: it fires on time at its new end). A
    record that joins no session and whose own ``[t, t + gap)`` ends
    ``allowed_lateness`` or more before the watermark is *late*: counted,
    sent to the task's late port and to ``on_late``.

    Sessions are handed over by end, then start, then in the order their
    keys came. Times are whole ticks of ``time_unit`` seconds, as with
    :class:`TimeWindow`; results are stamped with the session's last tick.

    Example:
        >>> by_clock = SessionWindow(30.0)  # a key's records at most 30 s apart, by the job clock
        >>> visits = SessionWindow(1800, time="event", allowed_lateness=60)  # 30 min of inactivity ends a visit
        >>> by_clock.time, visits.gap
        ('processing', 1800)
    """

    gap: float
    time: TimeKind = "processing"
    allowed_lateness: float = 0.0
    on_late: Callable[[Record], Any] | None = field(default=None, compare=False)
    missing_ts: MissingTs = "clock"
    time_unit: float = 0.001

    def validate(self, where: str) -> None:
        """A gap > 0 and a lateness >= 0 in whole ticks, a known time kind and ``missing_ts``."""
        _positive(where, "time_unit", self.time_unit)
        _positive(where, "gap", self.gap)
        ticks = Ticks(self.time_unit)
        for name, value in (("gap", self.gap), ("allowed_lateness", self.allowed_lateness)):
            # under one tick counts too: a gap of no tick would close every session as it opens
            if isinstance(value, int | float) and value > 0 and not ticks.whole(value):
                raise TopologyError(
                    f"{where}: window {name} {value!r} is not a whole number of ticks of time_unit {self.time_unit!r} s"
                )
        _check_time_kind(where, self.time, self.allowed_lateness, self.missing_ts)
