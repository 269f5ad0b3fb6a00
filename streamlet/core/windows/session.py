"""Session windows (``SessionWindow``): per key, records less than a gap apart share a window.

A key holds a few sessions at most (disjoint, not touching), chained by start (``session_agenda.Session``).
A record that opens its key's first session, or falls inside or stretches its key's one open session, is
placed in the batch loop itself; anything else (several sessions, a fired one, a bridge between two) goes
through :meth:`SessionLogic.merge`. Open sessions wait on an agenda by end, fired ones kept for lateness on
one by when that ends (``session_agenda.Agenda``): a watermark fires every session it passed in one sweep.
When the task only passes folded results on (``window_reduce``, ``emits_results``), a sweep hands over one
window holding the results of all the sessions it fired, made here as the elements the task emits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import nullcontext
from operator import attrgetter
from typing import Any

from streamlet.core.model.encoding import hashable
from streamlet.core.model.record import Batch
from streamlet.core.model.windows import Ticks
from streamlet.core.windows.fold import ClosedWindow, WindowLogic, window_data, window_from
from streamlet.core.windows.session_agenda import NOTHING, Agenda, Session, combine, fold_steps

__all__ = ("EventTimeSessionLogic", "ProcessingTimeSessionLogic", "SessionLogic", "combine")

_CLOSING_ORDER = attrgetter("end", "start", "rank")
FIRING_PART = 10_000  # sessions a store's sweep fires together


class SessionLogic(WindowLogic):
    """Per-key sessions in ticks: placing, merging, firing in a fixed order, snapshots.

    Subclasses say which time places records and what closes sessions.
    """

    lateness = 0  # ticks a fired session is kept for records that rejoin it (event time only)
    whole_seconds = False  # the records' timestamps are ints: whole-second bounds stay ints (event time only)

    def __init__(self, gap: float, ticks: Ticks | None = None) -> None:
        self.ticks = ticks = ticks or Ticks(0.001)
        self.gap = ticks.of(gap)
        #: Per key, its first session by start: open ones and fired ones kept (a dict, or a store's chains).
        self.sessions: Any = {}
        # A key's place in the order of arrival orders sessions with equal bounds (``Session.rank``); a key
        # that has no session left is forgotten and gets a new place when it comes back.
        self.next_rank = 0
        self.closing: Any = Agenda()  # open sessions by end
        self.expiring: Any = Agenda()  # fired sessions kept, by end + lateness
        #: Where the sessions live when not in memory (RocksDB's ``SessionStore``, see :meth:`keep_in`).
        self.store: Any = None

    def keep_in(self, store: Any) -> None:
        """Keep the sessions in ``store`` (``core.state.rocks_sessions.SessionStore``: its chains as
        ``sessions``, its agendas as ``closing`` and ``expiring``) rather than in memory."""
        self.store = store
        self.sessions = store.chains
        self.closing, self.expiring = store.closing, store.expiring

    def _call_starts(self) -> None:
        """A call of the logic starts: a store goes back within its cache's bound (the sessions the last call
        held on to are free to go, if it raised before :meth:`_call_ends`)."""
        if self.store is not None:
            self.store.release()

    def _call_ends(self) -> None:
        """A call of the logic that placed records ends: a store goes back within its cache's bound now, not at
        the next call (an idle instance would hold every chain of its last batch). What the call hands back
        refers to no session: windows copy them, results carry their values."""
        if self.store is not None:
            self.store.release()

    def _forget_sessions(self) -> None:
        if self.store is None:
            self.sessions = {}
        else:
            self.store.reset()

    # -- placing and merging ------------------------------------------------------

    def held(self, key: Any) -> Iterator[Session]:
        """``key``'s sessions, by start."""
        session = self.sessions.get(key)
        while session is not None:
            yield session
            session = session.next

    def touching(self, key: Any, start: int, end: int) -> list[Session]:
        """``key``'s sessions that overlap or touch ``[start, end)``, by start."""
        return [s for s in self.held(key) if s.start <= end and start <= s.end]

    def merge(self, key: Any, start: int, end: int, touching: list[Session]) -> Session:
        """The open session of ``key`` that holds ``[start, end)``: ``touching`` merged, or a new one.

        Scheduling it is the caller's (:meth:`schedule`), or firing it: one that was fired is open again and
        on no agenda, a new one on none yet.
        """
        if len(touching) == 1 and not touching[0].fired and touching[0].start <= start and end <= touching[0].end:
            return touching[0]  # a record inside its open session: nothing moves
        if not touching:
            return self._open(key, start, end)
        session = touching[0]
        for other in touching[1:]:  # later sessions: their records follow this one's
            self._absorb(session, other)
        if session.fired:  # open again
            self.expiring.remove(session)
            session.fired = False
        session.start, session.end = min(start, session.start), max(end, session.end)
        session.whole = self.whole_seconds
        return session

    def _open(self, key: Any, start: int, end: int) -> Session:
        records: dict[int, Batch] | None = {} if self.fold is None else None
        first = self.sessions.get(key)
        if first is None:
            session = Session(key, start, end, self.next_rank, self.whole_seconds, records)
            self.next_rank += 1
            self.sessions[key] = session
            return session
        session = Session(key, start, end, first.rank, self.whole_seconds, records)
        if start < first.start:  # disjoint from the others: its place by start is unique
            session.next, self.sessions[key] = first, session
            return session
        before = first
        while before.next is not None and before.next.start < start:
            before = before.next
        session.next, before.next = before.next, session
        return session

    def _absorb(self, session: Session, other: Session) -> None:
        """Move ``other``'s bounds and contents into ``session`` (``other`` starts later)."""
        session.end = max(session.end, other.end)
        if other.records:
            assert session.records is not None  # both keep records: the logic does not fold
            for port, records in other.records.items():
                session.records.setdefault(port, []).extend(records)
        if other.value is not NOTHING:
            if session.value is NOTHING:
                session.value = other.value
            else:
                assert self.fold is not None  # folded values exist only when folding
                session.value = combine(self.fold, session.value, other.value)
            session.last_ts = other.last_ts
        self._forget(other)

    def take(self, session: Session, port: int, records: Batch) -> None:
        """Put ``records`` (of the session's key) into ``session``: fold them, or keep them for ``port``."""
        if session.records is not None:
            kept = session.records.get(port)
            if kept is None:
                session.records[port] = list(records)
            else:
                kept.extend(records)
            return
        assert self.fold is not None
        initial, step = fold_steps(self.fold)
        value = session.value
        for record in records:
            if value is NOTHING:
                value = record[1] if initial is NOTHING else step(initial, record[1])
            else:
                value = step(value, record[1])
        session.value, session.last_ts = value, records[-1][2]

    def schedule(self, session: Session) -> None:
        """Put an open session on the closing agenda at its end, unless it is there already."""
        if session.due != session.end:
            self.closing.put(session, session.end)

    def _forget(self, session: Session) -> None:
        """Drop ``session``: off its agenda, out of its key's chain."""
        if session.due is not None:
            (self.expiring if session.fired else self.closing).remove(session)
        self._unchain(session)

    def _unchain(self, session: Session) -> None:
        key = session.key
        first: Session = self.sessions[key]
        if first is session:
            if session.next is None:
                del self.sessions[key]  # the key is forgotten: it gets a new rank when it comes back
            else:
                self.sessions[key] = session.next
            return
        while first.next is not session:
            first = first.next  # type: ignore[assignment]  # session is in the chain
        first.next = session.next

    # -- firing ---------------------------------------------------------------------

    def fire(self, due: list[Session], firing: str, through: float) -> list[ClosedWindow]:
        """Hand ``due`` over in order, marked ``firing``; each is kept while its lateness lasts past ``through``.

        With ``emits_results``, as one window holding their results; else one window each (a copy of what a
        kept session holds: it keeps taking records).
        """
        if not due:
            return []
        self._retire(due, through)
        if self.emits_results:
            return [self.results_window(due, firing)]
        return [self.window_of(session, firing) for session in due]

    def _retire(self, due: list[Session], through: float) -> None:
        """Keep each of ``due`` (on no agenda) on the expiring agenda while its lateness lasts past ``through``,
        or drop it."""
        lateness, sessions = self.lateness, self.sessions
        for session in due:
            if lateness and session.end + lateness > through:
                session.fired = True
                self.expiring.put(session, session.end + lateness)
            elif session.next is None and sessions[session.key] is session:  # the common case, without a call
                del sessions[session.key]
            else:
                self._unchain(session)

    def results_window(self, sessions: list[Session], firing: str) -> ClosedWindow:
        """One window standing for ``sessions``: their results as ``window_reduce`` emits them, in order (its
        bounds span them)."""
        ticks = self.ticks
        bound, divisor = ticks.bound, ticks.divisor
        results: Batch = []
        add = results.append
        for s in sessions:
            start, end = s.start, s.end
            if divisor and not s.whole:  # what Ticks.seconds does, without a call per bound
                add((s.key, s.value, (end - 1) / divisor, 0, (start / divisor, end / divisor), firing))
            else:
                add((s.key, s.value, ticks.seconds(end - 1), 0, (bound(start, s.whole), bound(end, s.whole)), firing))
        first, last = sessions[0], sessions[-1]
        return ClosedWindow(
            bound(first.start, first.whole), bound(last.end, last.whole), {}, firing=firing, results=results
        )

    def window_of(self, session: Session, firing: str) -> ClosedWindow:
        """``session`` as a window (its records copied: a fired session may take more)."""
        whole = session.whole
        start, end = self.ticks.bound(session.start, whole), self.ticks.bound(session.end, whole)
        folded = None if session.value is NOTHING else {session.key: session.value}
        records = {port: list(batch) for port, batch in (session.records or {}).items()}
        return ClosedWindow(start, end, records, folded, last_ts=session.last_ts, firing=firing)

    def fire_through(self, tick: float) -> list[ClosedWindow]:
        """Open sessions that end at or before ``tick``, fired on time in order; fired ones expired."""
        if self.store is not None:
            return self._fire_through_in_parts(tick)
        closed = self.fire(self.closing.pop_through(tick), "on_time", tick)
        for session in self.expiring.pop_through(tick):
            self._forget(session)
        return closed

    def _fire_through_in_parts(self, tick: float) -> list[ClosedWindow]:
        """:meth:`fire_through` over a store: ``FIRING_PART`` sessions at a time, each part's chains let go of
        before the next is read (a watermark that passes a million sessions holds their results, not them)."""
        closed: list[ClosedWindow] = []
        while due := self.closing.pop_through(tick, FIRING_PART):
            closed += self.fire(due, "on_time", tick)
            self.store.release()
        while kept := self.expiring.pop_through(tick, FIRING_PART):
            for session in kept:
                self._forget(session)
            self.store.release()
        if self.emits_results and len(closed) > 1:  # one window holds a sweep's results, as in memory
            results = [result for window in closed for result in window.results or ()]
            closed = [ClosedWindow(closed[0].start, closed[-1].end, {}, firing="on_time", results=results)]
        return closed

    def close_all(self) -> list[ClosedWindow]:
        """End of stream: every open session, in firing order (fired ones kept for lateness are done)."""
        if self.store is not None:  # the closing agenda holds them in that order: fired part by part
            closed = self._fire_through_in_parts(math.inf)
            self._forget_sessions()
            return closed
        with self._walking():
            open_sessions = [s for key in self.sessions for s in self.held(key) if not s.fired]
        open_sessions.sort(key=_CLOSING_ORDER)
        self._forget_sessions()
        self.closing.clear()
        self.expiring.clear()
        if not open_sessions:
            return []
        if self.emits_results:
            return [self.results_window(open_sessions, "on_time")]
        return [self.window_of(session, "on_time") for session in open_sessions]

    def result_ts(self, window: ClosedWindow) -> float | None:
        """A session's results carry its last tick, as a time window's do."""
        return self.ticks.seconds(self.ticks.of(window.end) - 1)

    # -- snapshots --------------------------------------------------------------------

    def snapshot(self) -> Any:
        with self._walking():
            sessions = [self.snapshot_entry(key, first) for key, first in self.sessions.items()]
        return {"sessions": sessions, "next_rank": self.next_rank, "late": self.late}

    def snapshot_entry(self, key: Any, first: Session) -> list[Any]:
        """The entry of :meth:`snapshot`'s ``sessions`` for ``key``, whose chain starts at ``first``."""
        chain: list[Any] = []
        session: Session | None = first
        while session is not None:
            chain.append([session.start, session.end, session.fired, window_data(self.window_of(session, "on_time"))])
            session = session.next
        return [key, first.rank, chain]

    def snapshot_increment(self) -> Any:
        """With a store: its chains as an incremental checkpoint (what changed since the last one, under
        ``chains``; ``core.state.rocks_sessions.window_form`` reads it back into :meth:`snapshot`'s form) and the
        counters; else :meth:`snapshot`."""
        if self.store is None:
            return self.snapshot()
        self.store.release()
        return {"chains": self.store.checkpoint_increment(), "next_rank": self.next_rank, "late": self.late}

    def _walking(self) -> Any:
        """A context for a walk over every session that changes none: a store reads them through its cache
        without holding on to them."""
        return nullcontext() if self.store is None else self.store.walking()

    def restore(self, snapshot: Any) -> None:
        self._forget_sessions()
        self.closing.clear()
        self.expiring.clear()
        with self._walking():  # each chain is complete (its dues set) before it is stored
            self._restore_chains(snapshot)
        self.next_rank = snapshot["next_rank"]
        self.late = snapshot["late"]

    def _restore_chains(self, snapshot: Any) -> None:
        for key_data, rank, held in snapshot["sessions"]:
            key = hashable(key_data)  # plain msgpack gives lists for tuples
            chain = [_restored(key, rank, *data) for data in held]
            for session, after in zip(chain, [*chain[1:], None], strict=True):
                session.next = after
                if session.fired:
                    self.expiring.put(session, session.end + self.lateness)
                else:
                    self.closing.put(session, session.end)
            self.sessions[key] = chain[0]


def _restored(key: Any, rank: int, start: int, end: int, fired: bool, data: list[Any]) -> Session:
    """A session back from its snapshot entry (``SessionLogic.snapshot``)."""
    window = window_from(data)
    # int bounds come only from int timestamps: the same flag gives the same bounds again
    whole = type(window.start) is int or type(window.end) is int
    session = Session(key, start, end, rank, whole, None if window.folded is not None else window.records)
    session.fired = fired
    if window.folded is not None:
        [session.value] = window.folded.values()  # a session holds one key
        session.last_ts = window.last_ts
    return session


class ProcessingTimeSessionLogic(SessionLogic):
    """Records are placed at the clock's time when they arrive; the clock closes sessions."""

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        self._call_starts()
        tick = self.ticks.of(now)
        closed = self.fire_through(tick)  # what the clock closed goes first, as if on_time had run
        by_key: dict[Any, Batch] = {}  # every record of the batch has the same time: one session per key
        for record in batch:
            by_key.setdefault(record[0], []).append(record)
        end = tick + self.gap
        for key, records in by_key.items():
            session = self.merge(key, tick, end, self.touching(key, tick, end))
            self.take(session, port, records)
            self.schedule(session)
        self._call_ends()
        return closed, []

    def on_time(self, now: float) -> list[ClosedWindow]:
        self._call_starts()
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
        self._call_starts()
        if self.refuse_missing_ts and any(record[2] is None for record in batch):
            raise ValueError("a record has no ts")  # the task instance names it
        fired: list[ClosedWindow] = self._catch_up() if self.overdue else []
        late: Batch = []
        if batch:
            self.whole_seconds = type(batch[0][2]) is int  # int timestamps: whole-second bounds stay ints
            self._place_all(port, batch, now, late, fired)
        self.late += len(late)
        self._call_ends()
        return fired, late

    def _place_all(self, port: int, batch: Batch, now: float, late: Batch, fired: list[ClosedWindow]) -> None:
        """Every record of ``batch`` into its session: the common cases here, the others by :meth:`_place`.

        Every open session ends after the watermark (the overdue ones fired first), so a record that opens its
        key's first session or one after its key's only session, or joins or stretches its key's one open
        session, cannot make it fire: it is folded in (or kept), and new or stretched sessions go on the closing
        agenda together after the loop.
        """
        per_second, gap, watermark, whole = self.ticks.per_second, self.gap, self.watermark, self.whole_seconds
        sessions = self.sessions
        folding = self.fold is not None
        initial, step = fold_steps(self.fold) if self.fold is not None else (NOTHING, _no_step)
        moved: list[Session] = []
        for record in batch:
            key, ts = record[0], record[2]
            tick = round((now if ts is None else ts) * per_second)
            end = tick + gap
            session = sessions.get(key)
            if session is None or (session.next is None and tick > session.end):  # the key's first, or one after
                if end <= watermark:  # late, or a session of its own that fires at once
                    self._place_aside(moved, port, record, tick, end, late, fired)
                    continue
                if folding:  # before the session exists: a fold that raises leaves none behind
                    value = record[1] if initial is NOTHING else step(initial, record[1])
                if session is None:
                    session = sessions[key] = Session(key, tick, end, self.next_rank, whole, None if folding else {})
                    self.next_rank += 1
                else:  # after its key's one session, not touching it: next in the chain
                    before = session
                    session = before.next = Session(key, tick, end, before.rank, whole, None if folding else {})
                moved.append(session)
                if folding:
                    session.value, session.last_ts = value, ts
                    continue
            elif session.next is None and not session.fired and session.start <= end and tick <= session.end:
                if tick < session.start:  # it stretches its session back
                    session.start, session.whole = tick, whole
                if end > session.end:  # ... or on: it closes later
                    session.end, session.whole = end, whole
                    moved.append(session)
                if folding:
                    session.value = step(session.value, record[1])
                    session.last_ts = ts
                    continue
            else:
                self._place_aside(moved, port, record, tick, end, late, fired)
                continue
            self.take(session, port, [record])
        self.closing.put_ends(moved)

    def _place_aside(
        self, moved: list[Session], port: int, record: Any, tick: int, end: int, late: Batch, fired: list[ClosedWindow]
    ) -> None:
        """:meth:`_place`, once the sessions the batch loop moved are on the agenda (a merge may drop one)."""
        self.closing.put_ends(moved)
        moved.clear()
        self._place(port, record, tick, end, late, fired)

    def _place(self, port: int, record: Any, tick: int, end: int, late: Batch, fired: list[ClosedWindow]) -> None:
        """``record`` placed wherever the batch loop does not place it: late, merging, or firing late at once."""
        key = record[0]
        touching = self.touching(key, tick, end)
        if not touching and end + self.lateness <= self.watermark:
            late.append(record)
            return
        session = self.merge(key, tick, end, touching)
        self.take(session, port, [record])
        if session.end <= self.watermark:  # behind the watermark: within lateness, so it fires now
            fired += self.fire([session], "late", self.watermark)
        else:
            self.schedule(session)

    def advance(self, watermark: float) -> list[ClosedWindow]:
        self._call_starts()
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
        self._call_starts()
        return self._catch_up()

    def next_deadline(self) -> float | None:
        return -math.inf if self.overdue else None  # due already, or only the watermark closes sessions

    def snapshot(self) -> Any:
        return {**super().snapshot(), "watermark": self.watermark}

    def snapshot_increment(self) -> Any:
        return {**super().snapshot_increment(), "watermark": self.watermark}

    def restore(self, snapshot: Any) -> None:
        super().restore(snapshot)
        self.watermark = snapshot["watermark"]
        passed = [self.closing.first(), self.expiring.first()]
        self.overdue = any(when is not None and when <= self.watermark for when in passed)


def _no_step(value: Any, _new: Any) -> Any:
    return value  # never called: a logic that does not fold keeps records
