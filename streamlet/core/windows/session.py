"""Session windows (``SessionWindow``): per key, records less than a gap apart share a window.

All times are whole ticks (``Ticks``), so merging is exact integer arithmetic. A key holds a few sessions
at most (they are disjoint and do not touch), kept in a list by start; which session closes next is a
heap of deadlines. Sessions change bounds as records extend or merge them, so heap entries are not
updated in place: a new entry is pushed, and an entry that no longer matches its session is skipped when
it comes up (and dropped when the heap is compacted).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from streamlet.core.model.encoding import hashable
from streamlet.core.model.record import Batch
from streamlet.core.model.windows import FoldHow, Ticks
from streamlet.core.windows.fold import ClosedWindow, WindowLogic, window_data, window_from

__all__ = ("EventTimeSessionLogic", "ProcessingTimeSessionLogic", "SessionLogic")


class Session:
    """One key's session ``[start, end)`` in ticks, and the window that holds its records or folded value."""

    __slots__ = ("alive", "end", "fired", "key", "start", "window")

    def __init__(self, key: Any, start: int, end: int, window: ClosedWindow, fired: bool = False) -> None:
        self.key = key
        self.start, self.end = start, end
        self.window = window
        self.fired = fired  # handed to the task already, and kept for allowed lateness
        self.alive = True  # False once merged into another session or dropped

    def __repr__(self) -> str:
        return f"Session({self.key!r}, {self.start}, {self.end}, fired={self.fired})"


_START = attrgetter("start")

# (deadline tick, start tick, key rank, push order, session): ordered by end, then start, then key arrival
_Entry = tuple[int, int, int, int, Session]


class _Agenda:
    """Sessions by a deadline, for sessions whose bounds keep changing: an entry is valid only while
    ``valid(entry)`` holds; stale entries are skipped when they come up and dropped when they pile up."""

    def __init__(self, valid: Callable[[_Entry], bool]) -> None:
        self.valid = valid
        self.heap: list[_Entry] = []
        self.order = itertools.count()
        self.compact_at = 64

    def push(self, when: int, session: Session, rank: int) -> None:
        """Schedule ``session`` at tick ``when`` (tied deadlines go by start, then ``rank``)."""
        heapq.heappush(self.heap, (when, session.start, rank, next(self.order), session))
        if len(self.heap) > self.compact_at:
            self.heap = [entry for entry in self.heap if self.valid(entry)]
            heapq.heapify(self.heap)
            self.compact_at = 2 * len(self.heap) + 64

    def pop_through(self, tick: float) -> list[Session]:
        """Valid sessions with a deadline at or before ``tick``, in order, taken off the agenda."""
        due: list[Session] = []
        taken: set[int] = set()  # a session fired again without moving has two entries alike
        heap = self.heap
        while heap and heap[0][0] <= tick:
            entry = heapq.heappop(heap)
            if self.valid(entry) and id(entry[4]) not in taken:
                taken.add(id(entry[4]))
                due.append(entry[4])
        return due

    def first(self) -> int | None:
        """The earliest valid deadline, if any."""
        heap = self.heap
        while heap and not self.valid(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def clear(self) -> None:
        """Forget every entry."""
        self.heap = []


def combine(how: FoldHow, earlier: Any, later: Any) -> Any:
    """Two folded values of one key merged, as if ``later``'s records had been folded after ``earlier``'s."""
    if how in ("sum", "count"):  # a count is a sum of ones
        return earlier + later
    if how == "min":
        return later if later < earlier else earlier
    if how == "max":
        return later if later > earlier else earlier
    fn: Any = how
    return fn(earlier, later)


class SessionLogic(WindowLogic):
    """Per-key sessions in ticks: placing, merging, firing in a fixed order, snapshots.

    Subclasses say which time places records and what closes sessions.
    """

    lateness = 0  # ticks a fired session is kept for records that rejoin it (event time only)
    whole_seconds = False  # the records' timestamps are ints: whole-second bounds stay ints (event time only)

    def __init__(self, gap: float, ticks: Ticks | None = None) -> None:
        self.ticks = ticks = ticks or Ticks(0.001)
        self.gap = ticks.of(gap)
        self.sessions: dict[Any, list[Session]] = {}  # per key, by start: open ones and fired ones kept
        # A key's place in the order of arrival, to order sessions with equal bounds; a key that has no
        # session left is forgotten and gets a new place when it comes back.
        self.ranks: dict[Any, int] = {}
        self.next_rank = 0
        self.closing = _Agenda(self._closes_then)  # open sessions by end
        self.expiring = _Agenda(self._expires_then)  # fired sessions kept, by end + lateness

    # -- placing and merging ------------------------------------------------------

    def touching(self, key: Any, start: int, end: int) -> list[Session]:
        """``key``'s sessions that overlap or touch ``[start, end)``, by start."""
        held = self.sessions.get(key)
        return [] if held is None else [s for s in held if s.start <= end and start <= s.end]

    def merge(self, key: Any, start: int, end: int, touching: list[Session]) -> Session:
        """The open session of ``key`` that holds ``[start, end)``: ``touching`` merged, or a new one."""
        if len(touching) == 1 and not touching[0].fired and touching[0].start <= start and end <= touching[0].end:
            return touching[0]  # the common case, a record inside its open session: nothing moves
        if not touching:
            session = Session(key, start, end, ClosedWindow(0.0, 0.0, {}))
            held = self.sessions.get(key)
            if held is None:
                held = self.sessions[key] = []
                self.ranks[key] = self.next_rank
                self.next_rank += 1
            held.append(session)
        else:
            session = touching[0]
            for other in touching[1:]:  # later sessions: their records follow this one's
                self._absorb(session, other)
            start, end = min(start, session.start), max(end, session.end)
        session.start, session.end, session.fired = start, end, False
        whole = self.whole_seconds
        session.window.start, session.window.end = self.ticks.bound(start, whole), self.ticks.bound(end, whole)
        self.sessions[key].sort(key=_START)
        self.closing.push(end, session, self.ranks[key])
        return session

    def _absorb(self, session: Session, other: Session) -> None:
        """Move ``other``'s bounds and contents into ``session`` (``other`` starts later)."""
        session.end = max(session.end, other.end)
        window, taken = session.window, other.window
        for port, records in taken.records.items():
            window.records.setdefault(port, []).extend(records)
        if taken.folded is not None:
            if window.folded is None:
                window.folded = taken.folded
            else:
                assert self.fold is not None  # folded values exist only when folding
                for key, value in taken.folded.items():
                    window.folded[key] = (
                        combine(self.fold, window.folded[key], value) if key in window.folded else value
                    )
            window.last_ts = taken.last_ts
        self._drop(other)

    def _drop(self, session: Session) -> None:
        session.alive = False
        held = self.sessions[session.key]
        held.remove(session)
        if not held:
            del self.sessions[session.key]
            del self.ranks[session.key]

    # -- firing ---------------------------------------------------------------------

    def _closes_then(self, entry: _Entry) -> bool:
        when, start, _, _, session = entry
        return session.alive and not session.fired and session.end == when and session.start == start

    def _expires_then(self, entry: _Entry) -> bool:
        session = entry[4]
        return session.alive and session.fired and session.end + self.lateness == entry[0]

    def fire(self, session: Session, firing: str, through: float) -> ClosedWindow:
        """Hand ``session`` over, marked ``firing``; keep it while its lateness lasts past ``through``."""
        if session.end + self.lateness <= through:
            self._drop(session)
            session.window.firing = firing
            return session.window
        session.fired = True
        self.expiring.push(session.end + self.lateness, session, self.ranks[session.key])
        # a copy: the task gets what the session holds now, and the session keeps taking records
        window = session.window
        records = {port: list(batch) for port, batch in window.records.items()}
        folded = None if window.folded is None else dict(window.folded)
        return ClosedWindow(window.start, window.end, records, folded, last_ts=window.last_ts, firing=firing)

    def fire_through(self, tick: float) -> list[ClosedWindow]:
        """Open sessions that end at or before ``tick``, fired on time in order; fired ones expired."""
        closed = [self.fire(session, "on_time", tick) for session in self.closing.pop_through(tick)]
        for session in self.expiring.pop_through(tick):
            self._drop(session)
        return closed

    def close_all(self) -> list[ClosedWindow]:
        """End of stream: every open session, in firing order (fired ones kept for lateness are done)."""
        open_sessions = [s for held in self.sessions.values() for s in held if not s.fired]
        open_sessions.sort(key=lambda s: (s.end, s.start, self.ranks[s.key]))
        self.sessions, self.ranks = {}, {}
        self.closing.clear()
        self.expiring.clear()
        return [session.window for session in open_sessions]

    def result_ts(self, window: ClosedWindow) -> float | None:
        """A session's results carry its last tick, as a time window's do."""
        return self.ticks.seconds(self.ticks.of(window.end) - 1)

    # -- snapshots --------------------------------------------------------------------

    def snapshot(self) -> Any:
        sessions = [
            [key, self.ranks[key], [[s.start, s.end, s.fired, window_data(s.window)] for s in held]]
            for key, held in self.sessions.items()
        ]
        return {"sessions": sessions, "next_rank": self.next_rank, "late": self.late}

    def restore(self, snapshot: Any) -> None:
        self.sessions, self.ranks = {}, {}
        self.closing.clear()
        self.expiring.clear()
        for key_data, rank, held in snapshot["sessions"]:
            key = hashable(key_data)  # plain msgpack gives lists for tuples
            self.ranks[key] = rank
            self.sessions[key] = [Session(key, start, end, window_from(w), fired) for start, end, fired, w in held]
            for session in self.sessions[key]:
                if session.fired:
                    self.expiring.push(session.end + self.lateness, session, rank)
                else:
                    self.closing.push(session.end, session, rank)
        self.next_rank = snapshot["next_rank"]
        self.late = snapshot["late"]


class ProcessingTimeSessionLogic(SessionLogic):
    """Records are placed at the clock's time when they arrive; the clock closes sessions."""

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        tick = self.ticks.of(now)
        closed = self.fire_through(tick)  # what the clock closed goes first, as if on_time had run
        by_key: dict[Any, Batch] = {}  # every record of the batch has the same time: one session per key
        for record in batch:
            by_key.setdefault(record[0], []).append(record)
        end = tick + self.gap
        for key, records in by_key.items():
            self.collect(self.merge(key, tick, end, self.touching(key, tick, end)).window, port, records)
        return closed, []

    def on_time(self, now: float) -> list[ClosedWindow]:
        return self.fire_through(self.ticks.of(now))

    def next_deadline(self) -> float | None:
        first = self.closing.first()
        return None if first is None else self.ticks.seconds(first)


class EventTimeSessionLogic(SessionLogic):
    """Records are placed at their event time; the watermark (from :meth:`advance`) closes sessions."""

    def __init__(
        self, gap: float, lateness: float = 0.0, ticks: Ticks | None = None, refuse_missing_ts: bool = False
    ) -> None:
        super().__init__(gap, ticks)
        self.lateness = self.ticks.of(lateness)
        self.refuse_missing_ts = refuse_missing_ts  # missing_ts="fail": a record without ts stops the job
        self.watermark: float = -math.inf  # a whole tick once advanced; never goes back
        # Restored sessions the watermark already passed (a merge of instances whose watermarks differed,
        # ``core/windows/split.py``): open ones fire on time, kept ones expire, before anything else.
        self.overdue = False

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        if self.refuse_missing_ts and any(record[2] is None for record in batch):
            raise ValueError("a record has no ts")  # the task instance names it
        fired: list[ClosedWindow] = self._catch_up() if self.overdue else []
        if batch:
            self.whole_seconds = type(batch[0][2]) is int  # int timestamps: whole-second bounds stay ints
        late: Batch = []
        # Records are collected in runs (consecutive records of one open session) to fold them at once.
        run: Batch = []
        run_session: Session | None = None
        for record in batch:
            tick = self.ticks.of(now if record[2] is None else record[2])
            end = tick + self.gap
            touching = self.touching(record[0], tick, end)
            if not touching and end + self.lateness <= self.watermark:
                late.append(record)
                continue
            if len(touching) > 1 and run_session in touching:  # the run's session merges into another
                assert run_session is not None
                self.collect(run_session.window, port, run)
                run = []
            session = self.merge(record[0], tick, end, touching)
            if session.end <= self.watermark:  # behind the watermark: within lateness, so it fires now
                self.collect(session.window, port, [record])
                fired.append(self.fire(session, "late", self.watermark))
                continue
            if session is not run_session:
                if run:
                    assert run_session is not None
                    self.collect(run_session.window, port, run)
                run, run_session = [], session
            run.append(record)
        if run:
            assert run_session is not None
            self.collect(run_session.window, port, run)
        self.late += len(late)
        return fired, late

    def advance(self, watermark: float) -> list[ClosedWindow]:
        tick = self.ticks.of(watermark)
        if tick <= self.watermark:
            return self._catch_up()
        self.watermark = tick
        self.overdue = False  # firing through the new watermark catches up too
        return self.fire_through(tick)

    def _catch_up(self) -> list[ClosedWindow]:
        """The overdue sessions fired (and expired) through the current watermark."""
        if not self.overdue:
            return []
        self.overdue = False
        return self.fire_through(self.watermark)

    def on_time(self, now: float) -> list[ClosedWindow]:
        return self._catch_up()

    def next_deadline(self) -> float | None:
        return -math.inf if self.overdue else None  # due already, or only the watermark closes sessions

    def snapshot(self) -> Any:
        return {**super().snapshot(), "watermark": self.watermark}

    def restore(self, snapshot: Any) -> None:
        super().restore(snapshot)
        self.watermark = snapshot["watermark"]
        passed = [self.closing.first(), self.expiring.first()]
        self.overdue = any(when is not None and when <= self.watermark for when in passed)
