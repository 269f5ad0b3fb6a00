"""The per-instance logic of each window kind (made for a spec by ``build.logic_for``)."""

from __future__ import annotations

import math
from typing import Any

from streamlet.core.model.record import Batch
from streamlet.core.model.windows import Ticks
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
    """Windows keyed by their start tick; subclasses decide which time and when they close.

    All arithmetic is on whole ticks (``Ticks``): one code path for tumbling and sliding windows, and
    bounds that hold every record assigned to them.
    """

    def __init__(self, size: float, slide: float, ticks: Ticks | None = None) -> None:
        self.ticks = ticks = ticks or Ticks(0.001)
        self.size, self.slide = size, slide
        self.size_ticks, self.slide_ticks = ticks.of(size), ticks.of(slide)
        self.windows: dict[int, ClosedWindow] = {}

    def starts(self, tick: int) -> list[int]:
        """Start ticks of every window that contains ``tick``, latest first."""
        start = tick - tick % self.slide_ticks
        starts = []
        while start + self.size_ticks > tick:
            starts.append(start)
            start -= self.slide_ticks
        return starts

    def window(self, start: int) -> ClosedWindow:
        """The open window starting at tick ``start`` (opened now if need be)."""
        window = self.windows.get(start)
        if window is None:
            seconds = self.ticks.seconds
            window = self.windows[start] = ClosedWindow(seconds(start), seconds(start + self.size_ticks), {})
        return window

    def close_until(self, tick: float) -> list[ClosedWindow]:
        """Windows whose end is at or before ``tick``, oldest first."""
        size = self.size_ticks
        due = sorted(start for start in self.windows if start + size <= tick)
        return [self.windows.pop(start) for start in due]

    def close_all(self) -> list[ClosedWindow]:
        return self.close_until(math.inf)

    def next_deadline(self) -> float | None:
        return min((w.end for w in self.windows.values()), default=None)

    def result_ts(self, window: ClosedWindow) -> float | None:
        """A window's results carry its last tick, so a longer window downstream holds all of them."""
        return self.ticks.seconds(self.ticks.of(window.end) - 1)

    def snapshot(self) -> Any:
        return {"windows": [window_data(w) for w in self.windows.values()]}

    def restore(self, snapshot: Any) -> None:
        self.windows = {self.ticks.of(w.start): w for w in map(window_from, snapshot["windows"])}


class ProcessingTimeLogic(TimeLogic):
    """Records go to the windows open by the clock when they arrive."""

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        tick = self.ticks.of(now)
        closed = self.close_until(tick)
        starts = self.starts(tick)
        if not starts:  # hopping windows with gaps: no window is open now
            self.late += len(batch)
            return closed, batch
        for start in starts:
            self.collect(self.window(start), port, batch)
        return closed, []

    def on_time(self, now: float) -> list[ClosedWindow]:
        return self.close_until(self.ticks.of(now))


class EventTimeLogic(TimeLogic):
    """Records go to the windows of their event time; the watermark (in ticks) closes windows."""

    def __init__(
        self, size: float, slide: float, lateness: float, idle_timeout: float | None, ticks: Ticks | None = None
    ) -> None:
        super().__init__(size, slide, ticks)
        self.lateness = lateness
        self.lateness_ticks = self.ticks.of(lateness)
        self.idle_timeout = idle_timeout
        # the highest record's time in ticks (+ half a tick: see add) minus the lateness, -inf at first
        self.watermark: float = -math.inf
        self.last_arrival = 0.0
        self.refuse_missing_ts = False  # TimeWindow(missing_ts="fail"): a record without ts stops the job

    def _check_timestamps(self, batch: Batch) -> None:
        if self.refuse_missing_ts and any(record.ts is None for record in batch):
            raise ValueError("a record has no ts")  # the task instance names it

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        # The hot path: records are cut into runs that fall in the same windows (streams are mostly in
        # order), and each run is collected or folded at once. Tumbling and sliding windows share it.
        self._check_timestamps(batch)
        late: Batch = []
        self.last_arrival = now
        per_second, size, slide = self.ticks.per_second, self.size_ticks, self.slide_ticks
        lateness, watermark = self.lateness_ticks, self.watermark
        highest = watermark + lateness
        # A record's time in ticks, plus half a tick: ``u``. Its nearest tick is floor(u), and because window
        # bounds are whole ticks, u's slide and its comparisons with bounds are those of that nearest tick:
        # exact, without paying for a floor or a round per record.
        now_u = now * per_second + 0.5
        run: Batch = []
        run_starts: list[int] = []
        # Records in one slide share their windows when the size is a whole number of slides; otherwise
        # only records of one tick do: runs are cut by that span.
        span = slide if size % slide == 0 else 1
        run_key = math.nan  # the span the run's records fall in: they share its windows
        first_end = last_end = math.inf  # ends of the run's latest and earliest windows
        for record in batch:
            ts = record.ts
            u = now_u if ts is None else ts * per_second + 0.5
            key = u - u % span
            if key != run_key:  # another span: other windows
                if run:
                    self._collect_run(port, run, run_starts)
                    run = []
                run_key, run_starts = key, self.starts(math.floor(u))
                first_end = run_starts[0] + size if run_starts else -math.inf
                last_end = run_starts[-1] + size if run_starts else -math.inf
            if first_end <= watermark:  # every window of this record has closed
                late.append(record)
                continue
            if last_end <= watermark:  # some of its windows have closed: only the open ones take it
                if run:
                    self._collect_run(port, run, run_starts)
                    run = []
                self._collect_run(port, [record], [s for s in run_starts if s + size > watermark])
            else:
                run.append(record)
            if u > highest:
                highest = u
                watermark = highest - lateness
        if run:
            self._collect_run(port, run, run_starts)
        self.watermark = watermark
        self.late += len(late)
        return self.close_until(watermark), late

    def _collect_run(self, port: int, run: Batch, starts: list[int]) -> None:
        for start in starts:
            self.collect(self.window(start), port, run)

    def on_time(self, now: float) -> list[ClosedWindow]:
        if self.idle_timeout is not None and self.windows and now >= self.last_arrival + self.idle_timeout:
            closed = self.close_all()
            self.watermark = max(self.watermark, max(self.ticks.of(w.end) for w in closed))
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
