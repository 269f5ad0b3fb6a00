"""Windows: count, time (processing or event) and count-or-time.

A window *spec* (``CountWindow(1000)``) is configuration; ``spec.build()``
makes the per-instance *logic* that assigns records to windows and says
which windows have closed. Logic objects know nothing of the runtime: they
take batches and the current time and return closed windows, so they are
tested directly, and their ``snapshot()`` goes into checkpoints.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from streamlet.core.record import Batch, Record
from streamlet.core.state import hashable
from streamlet.errors import TopologyError

TimeKind = Literal["processing", "event"]


@dataclass(slots=True)
class ClosedWindow:
    """A window ready for ``execute``: its bounds and its records per input port."""

    start: float
    end: float
    records: dict[int, Batch]

    def all_records(self) -> Batch:
        """Records of every port, in port order."""
        return [record for port in sorted(self.records) for record in self.records[port]]


class WindowLogic(ABC):
    """Per-instance window state: assigns records, reports closed windows."""

    late: int = 0

    @abstractmethod
    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        """Assign ``batch``; return the windows that closed and the records that came too late."""

    def on_time(self, now: float) -> list[ClosedWindow]:
        """Windows closed by time alone (no record arrived)."""
        return []

    def next_deadline(self) -> float | None:
        """When :meth:`on_time` next has something to close, if ever."""
        return None

    @abstractmethod
    def close_all(self) -> list[ClosedWindow]:
        """End of stream: every open window, in order."""

    @abstractmethod
    def snapshot(self) -> Any:
        """Open windows and counters as msgpack-able data."""

    @abstractmethod
    def restore(self, snapshot: Any) -> None:
        """Continue from :meth:`snapshot`'s data."""


class WindowSpec(ABC):
    """Configuration of a window; ``build()`` makes one logic object per instance."""

    @abstractmethod
    def build(self) -> WindowLogic:
        """Fresh per-instance window logic."""

    def validate(self, where: str) -> None:
        """Raise ``TopologyError`` (naming ``where``) for impossible sizes."""


def _positive(where: str, name: str, value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise TopologyError(f"{where}: window {name} must be > 0, got {value!r}")


# -- count windows -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CountWindow(WindowSpec):
    """Windows of ``size`` records, a new one every ``slide`` records (tumbling when ``slide`` is None).

    ``inputs.window`` is ``(start, end)``: the indexes of the first record and
    one past the last, counted over everything this instance received.

    Example:
        >>> CountWindow(1000)             # tumbling
        CountWindow(size=1000, slide=None)
    """

    size: int
    slide: int | None = None

    def build(self) -> WindowLogic:
        """Count-window logic."""
        return _CountLogic(self.size, (self.size if self.slide is None else self.slide))

    def validate(self, where: str) -> None:
        """Sizes are whole numbers > 0."""
        for name, value in (("size", self.size), ("slide", (self.size if self.slide is None else self.slide))):
            if not isinstance(value, int):
                raise TopologyError(f"{where}: window {name} must be a whole number of records, got {value!r}")
            _positive(where, name, value)


class _CountLogic(WindowLogic):
    def __init__(self, size: int, slide: int) -> None:
        self.size, self.slide = size, slide
        self.seen = 0  # records assigned so far: the index of the next one
        self.open: list[ClosedWindow] = []  # windows with a start <= seen, oldest first

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        closed: list[ClosedWindow] = []
        position = 0
        while position < len(batch):
            self._open_due()
            # take records up to the next window boundary (an end or a new start) in one slice
            next_start = (self.seen // self.slide + 1) * self.slide
            limit = min([next_start, *(int(w.end) for w in self.open)])
            take = batch[position : position + limit - self.seen]
            for window in self.open:
                window.records.setdefault(port, []).extend(take)
            position += len(take)
            self.seen += len(take)
            while self.open and self.open[0].end <= self.seen:
                closed.append(self.open.pop(0))
        return closed, []

    def _open_due(self) -> None:
        if self.seen % self.slide == 0 and not any(w.start == self.seen for w in self.open):
            self.open.append(ClosedWindow(self.seen, self.seen + self.size, {}))

    def close_all(self) -> list[ClosedWindow]:
        closed = [w for w in self.open if w.records]
        for window in closed:
            window.end = min(window.end, self.seen)  # a partial window ends at the last record
        self.open = []
        return closed

    def snapshot(self) -> Any:
        return {"seen": self.seen, "open": [_window_data(w) for w in self.open]}

    def restore(self, snapshot: Any) -> None:
        self.seen = snapshot["seen"]
        self.open = [_window_from(data) for data in snapshot["open"]]


# -- time windows ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimeWindow(WindowSpec):
    """Windows of ``size`` seconds starting every ``slide`` seconds (tumbling when ``slide`` is None).

    ``time="processing"`` assigns records by the clock when they arrive and
    closes a window when the clock passes its end. ``time="event"`` assigns
    by ``record.ts``; the watermark is the largest event time seen minus
    ``allowed_lateness``, and a window closes when the watermark reaches its
    end. A record whose every window has closed is *late*: it is counted,
    goes to the task's late output port and to ``on_late``, never dropped
    silently. With ``idle_timeout``, a stream that stays quiet that many
    seconds closes its open windows as if the watermark had passed them.
    ``inputs.window`` is ``(start, end)`` in seconds.
    """

    size: float
    slide: float | None = None
    time: TimeKind = "processing"
    allowed_lateness: float = 0.0
    idle_timeout: float | None = None
    on_late: Callable[[Record], Any] | None = field(default=None, compare=False)

    def build(self) -> WindowLogic:
        """Time-window logic."""
        slide = self.size if self.slide is None else self.slide
        if self.time == "event":
            return _EventTimeLogic(self.size, slide, self.allowed_lateness, self.idle_timeout)
        return _ProcessingTimeLogic(self.size, slide)

    def validate(self, where: str) -> None:
        """Positive sizes, a known time kind, non-negative lateness."""
        _positive(where, "size", self.size)
        _positive(where, "slide", (self.size if self.slide is None else self.slide))
        if self.time not in ("processing", "event"):
            raise TopologyError(f"{where}: window time must be 'processing' or 'event', got {self.time!r}")
        if self.allowed_lateness < 0:
            raise TopologyError(f"{where}: allowed_lateness must be >= 0, got {self.allowed_lateness!r}")
        if self.idle_timeout is not None:
            _positive(where, "idle_timeout", self.idle_timeout)


class _TimeLogic(WindowLogic):
    """Windows keyed by start time; subclasses decide which time and when they close."""

    def __init__(self, size: float, slide: float) -> None:
        self.size, self.slide = size, slide
        self.windows: dict[float, ClosedWindow] = {}

    def starts(self, ts: float) -> list[float]:
        """Starts of every window that contains ``ts``."""
        last = math.floor(ts / self.slide) * self.slide
        starts = []
        start = last
        while start + self.size > ts:
            starts.append(start)
            start -= self.slide
        return starts

    def put(self, start: float, port: int, record: Record) -> None:
        window = self.windows.get(start)
        if window is None:
            window = self.windows[start] = ClosedWindow(start, start + self.size, {})
        window.records.setdefault(port, []).append(record)

    def close_until(self, time: float) -> list[ClosedWindow]:
        """Windows whose end is at or before ``time``, oldest first."""
        due = sorted(start for start, window in self.windows.items() if window.end <= time)
        return [self.windows.pop(start) for start in due]

    def close_all(self) -> list[ClosedWindow]:
        return self.close_until(math.inf)

    def next_deadline(self) -> float | None:
        return min((w.end for w in self.windows.values()), default=None)

    def snapshot(self) -> Any:
        return {"windows": [_window_data(w) for w in self.windows.values()]}

    def restore(self, snapshot: Any) -> None:
        self.windows = {w.start: w for w in map(_window_from, snapshot["windows"])}


class _ProcessingTimeLogic(_TimeLogic):
    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        closed = self.close_until(now)
        starts = self.starts(now)
        if not starts:  # hopping windows with gaps: no window is open now
            self.late += len(batch)
            return closed, batch
        for start in starts:
            if start not in self.windows:
                self.windows[start] = ClosedWindow(start, start + self.size, {})
            self.windows[start].records.setdefault(port, []).extend(batch)
        return closed, []

    def on_time(self, now: float) -> list[ClosedWindow]:
        return self.close_until(now)


class _EventTimeLogic(_TimeLogic):
    def __init__(self, size: float, slide: float, lateness: float, idle_timeout: float | None) -> None:
        super().__init__(size, slide)
        self.lateness = lateness
        self.idle_timeout = idle_timeout
        self.watermark = -math.inf
        self.last_arrival = 0.0

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        late: Batch = []
        self.last_arrival = now
        if self.slide == self.size:
            self._add_tumbling(port, batch, now, late)
        else:
            for record in batch:
                ts = now if record.ts is None else record.ts
                starts = [s for s in self.starts(ts) if s + self.size > self.watermark]
                if not starts:
                    late.append(record)
                for start in starts:
                    self.put(start, port, record)
                self._advance(ts)
        self.late += len(late)
        return self.close_until(self.watermark), late

    def _add_tumbling(self, port: int, batch: Batch, now: float, late: Batch) -> None:
        # The hot path: one window per record, the bucket found by a dict lookup.
        size, windows, watermark = self.size, self.windows, self.watermark
        highest = watermark + self.lateness
        for record in batch:
            ts = record.ts
            if ts is None:
                ts = now
            start = ts - ts % size
            if start + size <= watermark:
                late.append(record)
                continue
            window = windows.get(start)
            if window is None:
                window = windows[start] = ClosedWindow(start, start + size, {port: []})
            bucket = window.records.get(port)
            if bucket is None:
                bucket = window.records[port] = []
            bucket.append(record)
            if ts > highest:
                highest = ts
                watermark = highest - self.lateness
        self.watermark = watermark

    def _advance(self, ts: float) -> None:
        if ts - self.lateness > self.watermark:
            self.watermark = ts - self.lateness

    def on_time(self, now: float) -> list[ClosedWindow]:
        if self.idle_timeout is not None and self.windows and now >= self.last_arrival + self.idle_timeout:
            closed = self.close_all()
            self.watermark = max(self.watermark, max(w.end for w in closed))
            return closed
        return []

    def next_deadline(self) -> float | None:
        if self.idle_timeout is None or not self.windows:
            return None
        return self.last_arrival + self.idle_timeout

    def snapshot(self) -> Any:
        extra = {"watermark": self.watermark, "late": self.late, "last_arrival": self.last_arrival}
        return {**super().snapshot(), **extra}

    def restore(self, snapshot: Any) -> None:
        super().restore(snapshot)
        self.watermark = snapshot["watermark"]
        self.late = snapshot["late"]
        self.last_arrival = snapshot["last_arrival"]


# -- count or time -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CountOrTimeWindow(WindowSpec):
    """Tumbling windows that close after ``count`` records or ``seconds`` after they opened, whichever is first.

    Processing time; ``inputs.window`` is ``(opened, closed)`` in seconds.
    """

    count: int
    seconds: float

    def build(self) -> WindowLogic:
        """Count-or-time logic."""
        return _CountOrTimeLogic(self.count, self.seconds)

    def validate(self, where: str) -> None:
        """A whole count > 0 and seconds > 0."""
        if not isinstance(self.count, int):
            raise TopologyError(f"{where}: window count must be a whole number of records, got {self.count!r}")
        _positive(where, "count", self.count)
        _positive(where, "seconds", self.seconds)


class _CountOrTimeLogic(WindowLogic):
    def __init__(self, count: int, seconds: float) -> None:
        self.count, self.seconds = count, seconds
        self.current: ClosedWindow | None = None
        self.size = 0

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        closed = self.on_time(now)
        position = 0
        while position < len(batch):
            if self.current is None:
                self.current, self.size = ClosedWindow(now, now + self.seconds, {}), 0
            take = batch[position : position + self.count - self.size]
            self.current.records.setdefault(port, []).extend(take)
            self.size += len(take)
            position += len(take)
            if self.size == self.count:
                self.current.end = now
                closed.append(self.current)
                self.current = None
        return closed, []

    def on_time(self, now: float) -> list[ClosedWindow]:
        if self.current is not None and now >= self.current.end:
            window, self.current = self.current, None
            return [window]
        return []

    def next_deadline(self) -> float | None:
        return None if self.current is None else self.current.end

    def close_all(self) -> list[ClosedWindow]:
        window, self.current = self.current, None
        return [] if window is None else [window]

    def snapshot(self) -> Any:
        return {"current": None if self.current is None else _window_data(self.current), "size": self.size}

    def restore(self, snapshot: Any) -> None:
        data = snapshot["current"]
        self.current = None if data is None else _window_from(data)
        self.size = snapshot["size"]


# -- snapshots ---------------------------------------------------------------


def _window_data(window: ClosedWindow) -> list[Any]:
    return [
        window.start,
        window.end,
        [[port, [[r.key, r.value, r.ts] for r in records]] for port, records in window.records.items()],
    ]


def _window_from(data: list[Any]) -> ClosedWindow:
    start, end, ports = data
    return ClosedWindow(
        start, end, {port: [Record(hashable(k), v, ts) for k, v, ts in records] for port, records in ports}
    )
