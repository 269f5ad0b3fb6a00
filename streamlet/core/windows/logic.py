"""The per-instance logic of each window kind (built by the specs in ``window.py``)."""

from __future__ import annotations

import math
from typing import Any

from streamlet.core.model.record import Batch
from streamlet.core.windows.fold import ClosedWindow, WindowLogic, window_data, window_from


class CountLogic(WindowLogic):
    """Windows of ``size`` records starting every ``slide`` records."""

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
                self.collect(window, port, take)
            position += len(take)
            self.seen += len(take)
            while self.open and self.open[0].end <= self.seen:
                closed.append(self.open.pop(0))
        return closed, []

    def _open_due(self) -> None:
        if self.seen % self.slide == 0 and not any(w.start == self.seen for w in self.open):
            self.open.append(ClosedWindow(self.seen, self.seen + self.size, {}))

    def close_all(self) -> list[ClosedWindow]:
        closed = [w for w in self.open if w.records or w.folded]
        for window in closed:
            window.end = min(window.end, self.seen)  # a partial window ends at the last record
        self.open = []
        return closed

    def snapshot(self) -> Any:
        return {"seen": self.seen, "open": [window_data(w) for w in self.open]}

    def restore(self, snapshot: Any) -> None:
        self.seen = snapshot["seen"]
        self.open = [window_from(data) for data in snapshot["open"]]


class TimeLogic(WindowLogic):
    """Windows keyed by start time; subclasses decide which time and when they close."""

    def __init__(self, size: float, slide: float) -> None:
        self.size, self.slide = size, slide
        self.windows: dict[float, ClosedWindow] = {}

    def starts(self, ts: float) -> list[float]:
        """Starts of every window that contains ``ts``."""
        start = math.floor(ts / self.slide) * self.slide
        starts = []
        while start + self.size > ts:
            starts.append(start)
            start -= self.slide
        return starts

    def window(self, start: float) -> ClosedWindow:
        """The open window starting at ``start`` (opened now if need be)."""
        window = self.windows.get(start)
        if window is None:
            window = self.windows[start] = ClosedWindow(start, start + self.size, {})
        return window

    def close_until(self, time: float) -> list[ClosedWindow]:
        """Windows whose end is at or before ``time``, oldest first."""
        due = sorted(start for start, window in self.windows.items() if window.end <= time)
        return [self.windows.pop(start) for start in due]

    def close_all(self) -> list[ClosedWindow]:
        return self.close_until(math.inf)

    def next_deadline(self) -> float | None:
        return min((w.end for w in self.windows.values()), default=None)

    def snapshot(self) -> Any:
        return {"windows": [window_data(w) for w in self.windows.values()]}

    def restore(self, snapshot: Any) -> None:
        self.windows = {w.start: w for w in map(window_from, snapshot["windows"])}


class ProcessingTimeLogic(TimeLogic):
    """Records go to the windows open by the clock when they arrive."""

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        closed = self.close_until(now)
        starts = self.starts(now)
        if not starts:  # hopping windows with gaps: no window is open now
            self.late += len(batch)
            return closed, batch
        for start in starts:
            self.collect(self.window(start), port, batch)
        return closed, []

    def on_time(self, now: float) -> list[ClosedWindow]:
        return self.close_until(now)


class EventTimeLogic(TimeLogic):
    """Records go to the windows of their event time; the watermark closes windows."""

    def __init__(self, size: float, slide: float, lateness: float, idle_timeout: float | None) -> None:
        super().__init__(size, slide)
        self.lateness = lateness
        self.idle_timeout = idle_timeout
        self.watermark = -math.inf
        self.last_arrival = 0.0
        self.refuse_missing_ts = False  # TimeWindow(missing_ts="fail"): a record without ts stops the job

    def _check_timestamps(self, batch: Batch) -> None:
        if self.refuse_missing_ts and any(record.ts is None for record in batch):
            raise ValueError("a record has no ts")  # the task instance names it

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        self._check_timestamps(batch)
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
                    self.collect(self.window(start), port, [record])
                if ts - self.lateness > self.watermark:
                    self.watermark = ts - self.lateness
        self.late += len(late)
        return self.close_until(self.watermark), late

    def _add_tumbling(self, port: int, batch: Batch, now: float, late: Batch) -> None:
        # The hot path: records are cut into runs that fall in the same window (streams are
        # mostly in order), and each run is collected or folded at once.
        size, lateness = self.size, self.lateness
        watermark = self.watermark
        highest = watermark + lateness
        run: Batch = []
        run_start = math.nan
        for record in batch:
            ts = record.ts
            if ts is None:
                ts = now
            start = ts - ts % size
            if start + size <= watermark:
                late.append(record)
                continue
            if start != run_start:
                if run:
                    self.collect(self.window(run_start), port, run)
                run, run_start = [], start
            run.append(record)
            if ts > highest:
                highest = ts
                watermark = highest - lateness
        if run:
            self.collect(self.window(run_start), port, run)
        self.watermark = watermark

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


class CountOrTimeLogic(WindowLogic):
    """Tumbling windows closed by a record count or a time limit, whichever comes first."""

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
            self.collect(self.current, port, take)
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
        return {"current": None if self.current is None else window_data(self.current), "size": self.size}

    def restore(self, snapshot: Any) -> None:
        data = snapshot["current"]
        self.current = None if data is None else window_from(data)
        self.size = snapshot["size"]
