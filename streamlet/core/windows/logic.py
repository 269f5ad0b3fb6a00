"""The per-instance logic of each window kind (made for a spec by ``build.logic_for``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

from streamlet.core.model.encoding import hashable
from streamlet.core.model.record import Batch
from streamlet.core.model.windows import Ticks
from streamlet.core.windows.fold import ClosedWindow, WindowLogic, joined, window_data, window_from


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
    bounds that hold every record assigned to them. Windows start at ``offset + k * slide``.
    With ``early`` (seconds), open windows that took records since their last firing fire early every
    ``early`` seconds of the clock, marked ``"early"``; a fold (``window_reduce``) fires only the keys that
    took records since their last early firing.
    """

    def __init__(
        self, size: float, slide: float, ticks: Ticks | None = None, offset: float = 0.0, early: float | None = None
    ) -> None:
        self.ticks = ticks = ticks or Ticks(0.001)
        self.size, self.slide = size, slide
        self.size_ticks, self.slide_ticks = ticks.of(size), ticks.of(slide)
        self.offset_ticks = ticks.of(offset) % self.slide_ticks
        self.windows: dict[int, ClosedWindow] = {}
        self.early = early
        self.next_early: float | None = None  # clock time of the next early firing, while a window is dirty
        self.dirty: set[int] = set()  # starts of open windows that took records since they last fired
        # window_reduce (a fold): the keys of each dirty window that took records since its last early firing,
        # so an early firing is per key, as Flink's keyed windows are (the results then do not depend on which
        # keys share an instance)
        self.dirty_keys: dict[int, set[Any]] = {}
        self.whole_seconds = False  # the records' timestamps are ints: whole-second bounds stay ints
        #: Set by the task instance to keep a fold's open windows elsewhere (RocksDB): makes an open window's
        #: empty values. A window fired on time hands them over as they are (the task reads them out once and
        #: drops them); one kept for allowed lateness gets them back as a dict (``_released``).
        self.new_folded: Callable[[], Any] | None = None

    def starts(self, tick: int) -> list[int]:
        """Start ticks of every window that contains ``tick``, latest first."""
        start = tick - (tick - self.offset_ticks) % self.slide_ticks
        starts = []
        while start + self.size_ticks > tick:
            starts.append(start)
            start -= self.slide_ticks
        return starts

    def window(self, start: int) -> ClosedWindow:
        """The open window starting at tick ``start`` (opened now if need be)."""
        window = self.windows.get(start)
        if window is None:
            window = self.windows[start] = self._opened(start)
        return window

    def _new_window(self, start: int) -> ClosedWindow:
        return ClosedWindow(self._bound(start), self._bound(start + self.size_ticks), {})

    def _opened(self, start: int) -> ClosedWindow:
        """A new open window (its fold's values kept where ``new_folded`` says, when it says)."""
        window = self._new_window(start)
        if self.new_folded is not None and self.fold is not None:
            window.folded = self.new_folded()
        return window

    @staticmethod
    def _released(window: ClosedWindow) -> ClosedWindow:
        """``window`` with its values a dict again (taken out of where they were kept)."""
        folded: Any = window.folded  # a dict, or values kept elsewhere (``new_folded``'s)
        if folded is not None and type(folded) is not dict:
            window.folded = folded.take_out()
        return window

    def _rehome(self) -> None:
        """After a restore: the open windows' values go where ``new_folded`` keeps them."""
        if self.new_folded is None or self.fold is None:
            return
        for window in self.windows.values():
            if window.folded is not None:
                kept = self.new_folded()
                kept.update(window.folded)
                window.folded = kept

    def _bound(self, tick: int) -> float:
        """Tick ``tick`` in seconds (see :meth:`Ticks.bound`)."""
        return self.ticks.bound(tick, self.whole_seconds)

    def close_until(self, tick: float) -> list[ClosedWindow]:
        """Windows whose end is at or before ``tick``, oldest first."""
        size = self.size_ticks
        due = sorted(start for start in self.windows if start + size <= tick)
        for start in due:
            self.dirty.discard(start)
            self.dirty_keys.pop(start, None)
        # a fold's values kept elsewhere stay there: the task reads them out when it emits the window
        return [_firing(self.windows.pop(start), "on_time") for start in due]

    def close_all(self) -> list[ClosedWindow]:
        return self.close_until(math.inf)

    def next_deadline(self) -> float | None:
        return _earliest(self.next_early, min((w.end for w in self.windows.values()), default=None))

    def result_ts(self, window: ClosedWindow) -> float | None:
        """A window's results carry its last tick, so a longer window downstream holds all of them."""
        return self.ticks.seconds(self.ticks.of(window.end) - 1)

    def collect_run(self, port: int, run: Batch, starts: list[int], now: float) -> None:
        """Put ``run`` into the open windows starting at ``starts`` (noting them for early firings)."""
        if run:
            self.whole_seconds = type(run[0][2]) is int
        for start in starts:
            self.collect(self.window(start), port, run)
        if self.early is not None and run:
            self.dirty.update(starts)
            if self.fold is not None:
                keys = {element[0] for element in run}
                for start in starts:
                    self.dirty_keys.setdefault(start, set()).update(keys)
            if self.next_early is None:
                self.next_early = now + self.early

    def fire_early(self, now: float) -> list[ClosedWindow]:
        """The dirty open windows, marked ``"early"``, when an early firing is due at ``now``."""
        if self.next_early is None or now < self.next_early:
            return []
        assert self.early is not None
        starts = [start for start in sorted(self.dirty) if start in self.windows]
        if self.fold is None:
            fired = [_firing(self.windows[start], "early") for start in starts]
        else:  # each key that took records since its last early firing, alone
            fired = [_keys_of(self.windows[start], self.dirty_keys.get(start, ()), "early") for start in starts]
        self.dirty.clear()
        self.dirty_keys.clear()
        self.next_early = None
        return fired

    def snapshot(self) -> Any:
        windows = [window_data(w) for w in self.windows.values()]
        dirty_keys = [[start, list(keys)] for start, keys in sorted(self.dirty_keys.items())]
        return {
            "windows": windows,
            "dirty": sorted(self.dirty),
            "dirty_keys": dirty_keys,
            "next_early": self.next_early,
        }

    def restore(self, snapshot: Any) -> None:
        for window in self.windows.values():  # the values kept elsewhere go: the snapshot's replace them
            kept: Any = window.folded
            if kept is not None and type(kept) is not dict:
                kept.drop()
        self.windows = {self.ticks.of(w.start): w for w in map(window_from, snapshot["windows"])}
        self._rehome()
        self.dirty = set(snapshot.get("dirty", ()))
        self.dirty_keys = {start: set(map(hashable, keys)) for start, keys in snapshot.get("dirty_keys", ())}
        # without it (a snapshot from before it was kept) the dirty windows wait for their next record
        self.next_early = snapshot.get("next_early")


class ProcessingTimeLogic(TimeLogic):
    """Records go to the windows open by the clock when they arrive."""

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        tick = self.ticks.of(now)
        closed = self.close_until(tick)
        starts = self.starts(tick)
        if not starts:  # cannot happen since slide <= size is enforced; kept so nothing is ever lost silently
            self.late += len(batch)
            return closed, batch
        self.collect_run(port, batch, starts, now)
        return closed + self.fire_early(now), []

    def on_time(self, now: float) -> list[ClosedWindow]:
        return self.close_until(self.ticks.of(now)) + self.fire_early(now)


class EventTimeLogic(TimeLogic):
    """Records go to the windows of their event time; the input's watermark closes windows.

    The watermark comes from the sources (``advance``), never from the records seen here, so which
    records are late does not depend on the parallelism. A window fires (``"on_time"``) when the
    watermark reaches its end. With ``allowed_lateness`` it is kept that much longer: each record for it
    fires it again at once (``"late"``, with everything it holds; a fold: that record's key's result
    alone). Records for windows past that are late: they go to the late port.
    """

    def __init__(
        self,
        size: float,
        slide: float,
        lateness: float,
        idle_timeout: float | None,
        ticks: Ticks | None = None,
        offset: float = 0.0,
        early: float | None = None,
    ) -> None:
        super().__init__(size, slide, ticks, offset, early)
        self.lateness = lateness
        self.lateness_ticks = self.ticks.of(lateness)
        self.idle_timeout = idle_timeout
        self.watermark: float = -math.inf  # in ticks: windows ending at or before it have fired
        self.fired: dict[int, ClosedWindow] = {}  # fired windows kept for allowed_lateness, by start
        self.last_arrival = 0.0
        self.refuse_missing_ts = False  # TimeWindow(missing_ts="fail"): a record without ts stops the job
        # Restored open windows the watermark already passed (a merge of instances whose watermarks differed,
        # ``core/windows/split.py``): they fire, on time, before anything else this logic does.
        self.overdue = False

    def _check_timestamps(self, batch: Batch) -> None:
        if self.refuse_missing_ts and any(record[2] is None for record in batch):
            raise ValueError("a record has no ts")  # the task instance names it

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        # The hot path: records are cut into runs that fall in the same windows (streams are mostly in
        # order), and each run is placed at once. Tumbling and sliding windows share it.
        self._check_timestamps(batch)
        caught = self._catch_up() if self.overdue else []
        late: Batch = []
        refired: list[ClosedWindow] = []
        self.last_arrival = now
        per_second, size, slide = self.ticks.per_second, self.size_ticks, self.slide_ticks
        watermark, kept = self.watermark, self.watermark - self.lateness_ticks
        # A record's time in ticks from the offset, plus half a tick: ``u``. Its nearest tick is floor(u), and
        # because window bounds are whole ticks, u's slide and its comparisons with bounds are those of that
        # nearest tick: exact, without paying for a floor or a round per record.
        shift = 0.5 - self.offset_ticks
        now_u = now * per_second + shift
        run_starts: list[int] = []
        # Records in one slide share their windows when the size is a whole number of slides; otherwise
        # only records of one tick do: runs are cut by that span. A run is a slice of the batch, taken when
        # it ends: a record costs its time's arithmetic and one comparison, never an append.
        span = slide if size % slide == 0 else 1
        low = high = math.nan  # the span the run's records fall in (u in [low, high)): they share its windows
        run_late = run_mixed = False
        start = index = 0
        for element in batch:
            ts = element[2]
            u = now_u if ts is None else ts * per_second + shift
            if not low <= u < high:  # another span: other windows (u - u % span is exact: whole ticks)
                if index > start:
                    self._place_run(port, batch[start:index], run_starts, run_late, run_mixed, late, refired, now)
                start = index
                low = u - u % span
                high = low + span
                run_starts = self.starts(math.floor(u) + self.offset_ticks)
                first_end = run_starts[0] + size  # the latest window's end
                run_late = first_end <= kept  # every window of this record is past its lateness
                run_mixed = run_starts[-1] + size <= watermark  # some of its windows have fired
            index += 1
        if index > start:
            self._place_run(port, batch[start:index], run_starts, run_late, run_mixed, late, refired, now)
        self.late += len(late)
        return caught + refired + self.fire_early(now), late

    def _place_run(
        self,
        port: int,
        run: Batch,
        starts: list[int],
        is_late: bool,
        mixed: bool,
        late: Batch,
        refired: list[ClosedWindow],
        now: float,
    ) -> None:
        if is_late:
            late.extend(run)
        else:
            self._place(port, run, starts, mixed, refired, now)

    def _place(
        self, port: int, run: Batch, starts: list[int], mixed: bool, refired: list[ClosedWindow], now: float
    ) -> None:
        if not mixed:
            self.collect_run(port, run, starts, now)
            return
        size, watermark, kept = self.size_ticks, self.watermark, self.watermark - self.lateness_ticks
        self.collect_run(port, run, [s for s in starts if s + size > watermark], now)
        again = sorted(start for start in starts if kept < start + size <= watermark)  # fired, within lateness
        if not again:
            return
        # Each late record fires its fired windows again at once, as in Flink: once per record whatever the
        # batches, and with a fold only its own key's result (the others' have not changed)
        for element in run:
            for start in again:
                window = self.fired.get(start)
                if window is None:
                    window = self.fired[start] = self._new_window(start)
                self.collect(window, port, [element])
                if self.fold is None:
                    refired.append(_firing(_copied(window), "late"))
                else:
                    refired.append(_keys_of(window, (element[0],), "late"))

    def advance(self, watermark: float) -> list[ClosedWindow]:
        tick = self.ticks.of(watermark)
        if tick <= self.watermark:
            return self._catch_up()
        self.watermark = tick
        self.overdue = False  # firing through the new watermark fires the overdue windows too
        return self._fire_until(tick)

    def _catch_up(self) -> list[ClosedWindow]:
        """The overdue open windows, fired on time through the current watermark.

        Copies: the windows kept for lateness may take a late record in the same ``add``, before the task
        gets what fired on time.
        """
        if not self.overdue:
            return []
        self.overdue = False
        return [_copied(window) for window in self._fire_until(self.watermark)]

    def _fire_until(self, tick: float) -> list[ClosedWindow]:
        fired = self.close_until(tick)
        if self.lateness_ticks:
            for window in fired:
                self._released(window)  # kept for late records: its values in memory from now on
                start = self.ticks.of(window.start)
                held = self.fired.get(start)
                # After a merge, another instance's keys of this window may have fired already: they are kept
                # together, so a late record fires the window with everything, and ``window`` goes out as it is.
                self.fired[start] = window if held is None else joined(held, window)
            kept = self.watermark - self.lateness_ticks
            for start in [s for s in self.fired if s + self.size_ticks <= kept]:
                del self.fired[start]
        return fired

    def on_time(self, now: float) -> list[ClosedWindow]:
        caught = self._catch_up()
        if self.idle_timeout is not None and self.windows and now >= self.last_arrival + self.idle_timeout:
            end = max(self.ticks.of(w.end) for w in self.windows.values())
            self.watermark = max(self.watermark, end)
            return caught + self._fire_until(end)
        return caught + self.fire_early(now)

    def next_deadline(self) -> float | None:
        if self.overdue:
            return -math.inf  # due already
        idle = None if self.idle_timeout is None or not self.windows else self.last_arrival + self.idle_timeout
        return _earliest(idle, self.next_early)

    def snapshot(self) -> Any:
        extra = {
            "watermark": self.watermark,
            "late": self.late,
            "last_arrival": self.last_arrival,
            "fired": [window_data(w) for w in self.fired.values()],
        }
        return {**super().snapshot(), **extra}

    def restore(self, snapshot: Any) -> None:
        super().restore(snapshot)
        self.watermark = snapshot["watermark"]
        self.late = snapshot["late"]
        self.last_arrival = snapshot["last_arrival"]
        self.fired = {self.ticks.of(w.start): w for w in map(window_from, snapshot["fired"])}
        self.overdue = any(start + self.size_ticks <= self.watermark for start in self.windows)


def _copied(window: ClosedWindow) -> ClosedWindow:
    records = {port: list(batch) for port, batch in window.records.items()}
    folded = None if window.folded is None else dict(window.folded)
    copy = ClosedWindow(window.start, window.end, records, folded, window.last_ts, window.firing)
    copy.columns = window.columns  # an Arrow batch: read-only, shared
    return copy


def _keys_of(window: ClosedWindow, keys: Collection[Any], firing: str) -> ClosedWindow:
    """A firing of ``window``'s folded results for ``keys`` alone (a fold window's per-key firing), in the
    order the window's keys came."""
    folded = window.folded or {}
    if len(keys) == 1:
        chosen = {key: folded[key] for key in keys if key in folded}
    else:
        chosen = {key: value for key, value in folded.items() if key in keys}
    return ClosedWindow(window.start, window.end, {}, chosen, window.last_ts, firing)


def _firing(window: ClosedWindow, firing: str) -> ClosedWindow:
    window.firing = firing
    return window


def _earliest(*times: float | None) -> float | None:
    return min((t for t in times if t is not None), default=None)


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
