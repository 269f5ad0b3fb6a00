"""What session windows are made of: one key's session, the agenda that fires sessions by tick, and folding.

A session folds its records as they come when the task folds (``window_reduce``: one value, and two sessions that
merge combine theirs with the fold), or keeps them per input port. Its bounds are whole ticks (``Ticks``), so
placing and merging are exact integer arithmetic; its bounds in seconds are made only when it is handed over.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from streamlet.core.model.record import Batch
from streamlet.core.model.windows import FoldHow

__all__ = ("NOTHING", "Agenda", "Session", "combine", "fold_steps")

#: A session that folds but holds no value yet (or does not fold at all).
NOTHING: Any = object()


class Session:
    """One key's session ``[start, end)`` in ticks: its folded value, or its records per input port.

    Sessions link to each other instead of sitting in lists (a list per session is one more object for the
    garbage collector to trace, and a stream of short sessions has nearly one a record): ``next`` is the key's
    next session by start, ``earlier``/``later`` its neighbours at its tick on an agenda.
    """

    __slots__ = (
        "due", "earlier", "end", "fired", "key", "last_ts", "later", "next",
        "rank", "records", "start", "value", "whole",
    )  # fmt: skip

    def __init__(
        self, key: Any, start: int, end: int, rank: int, whole: bool, records: dict[int, Batch] | None
    ) -> None:
        self.key = key
        self.start, self.end = start, end
        self.rank = rank  # the key's place in the order of arrival: orders sessions with equal bounds
        self.whole = whole  # its bounds are int seconds where whole: the timestamps were ints when they last moved
        self.fired = False  # handed to the task already, and kept for allowed lateness
        self.records = records  # per input port, when not folding
        self.value: Any = NOTHING  # the folded value, when folding
        self.last_ts: float | None = None  # event time of the last record folded in
        self.next: Session | None = None  # the key's next session (a later start)
        self.due: int | None = None  # the tick it waits for on an agenda (None: on none)
        self.earlier: Session | None = None  # the sessions before and after it at that tick
        self.later: Session | None = None

    def __repr__(self) -> str:
        return f"Session({self.key!r}, {self.start}, {self.end}, fired={self.fired})"


#: Sessions due at one tick are handed over by start, then in the order their keys came.
ORDER = attrgetter("start", "rank")


class Agenda:
    """Sessions by the tick they are due at: open ones by end, fired ones by when their lateness ends.

    A chain of sessions a tick (``Session.earlier``/``later``) and a heap of those ticks, so a watermark takes
    every session it passed in one sweep, however far it jumps, and a session whose bounds move is unlinked
    from its tick and linked at the new one: nothing stale is left behind. Ticks whose chain emptied stay in
    the heap until they come up (or pile up: then the heap is rebuilt).
    """

    def __init__(self) -> None:
        self.chains: dict[int, Session] = {}  # tick -> the first session due then
        self.heap: list[int] = []  # every tick of a chain, and some whose chain emptied

    def put(self, session: Session, when: int) -> None:
        """Schedule ``session`` (on this agenda or on none) at tick ``when``."""
        if session.due is not None:
            self.remove(session)
        self._link(session, when)

    def put_ends(self, sessions: list[Session]) -> None:
        """Schedule each of ``sessions`` (open ones, on this agenda or on none) at its end, unless it is there:
        one call for a batch's new and stretched sessions (what :meth:`put` does, without two calls each)."""
        chains, heap, remove = self.chains, self.heap, self.remove
        for session in sessions:
            when = session.end
            if session.due == when:
                continue
            if session.due is not None:
                remove(session)
            first = chains.get(when)
            session.due, session.later = when, first
            if first is None:
                heapq.heappush(heap, when)
            else:
                first.earlier = session
            chains[when] = session
        if len(heap) > 2 * len(chains) + 64:
            self._rebuild()

    def _link(self, session: Session, when: int) -> None:
        chains = self.chains
        first = chains.get(when)
        session.due, session.later = when, first
        if first is None:
            heapq.heappush(self.heap, when)
            if len(self.heap) > 2 * len(chains) + 64:
                self._rebuild()
        else:
            first.earlier = session
        chains[when] = session

    def remove(self, session: Session) -> None:
        """Take ``session`` off this agenda (it is on it)."""
        earlier, later, when = session.earlier, session.later, session.due
        assert when is not None
        if earlier is not None:
            earlier.later = later
        elif later is not None:
            self.chains[when] = later
        else:
            del self.chains[when]
        if later is not None:
            later.earlier = earlier
        session.due = session.earlier = session.later = None

    def pop_through(self, tick: float) -> list[Session]:
        """Sessions due at or before ``tick`` by tick, start and key rank, taken off the agenda."""
        due: list[Session] = []
        heap, chains = self.heap, self.chains
        while heap and heap[0] <= tick:
            session = chains.pop(heapq.heappop(heap), None)
            if session is None:
                continue  # its chain emptied
            if session.later is None:  # the common case: one session due at that tick
                session.due = None
                due.append(session)
                continue
            taken = []
            while session is not None:
                taken.append(session)
                later = session.later
                session.due = session.earlier = session.later = None
                session = later
            taken.sort(key=ORDER)
            due += taken
        return due

    def first(self) -> int | None:
        """The earliest tick a session is due at, if any."""
        heap, chains = self.heap, self.chains
        while heap and heap[0] not in chains:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _rebuild(self) -> None:
        self.heap[:] = self.chains  # in place: put_ends holds the heap while it links
        heapq.heapify(self.heap)

    def clear(self) -> None:
        """Forget every entry."""
        self.chains, self.heap = {}, []


def _plus_one(count: Any, _value: Any) -> Any:
    return count + 1


def fold_steps(how: FoldHow) -> tuple[Any, Callable[[Any, Any], Any]]:
    """What a session's fold starts from (``NOTHING``: the first record's value) and its step, as
    ``fold_into`` folds (a sum starts from ``0 + value``; a min or max keeps the earlier value on ties)."""
    if how == "sum":
        return 0, operator.add
    if how == "count":
        return 0, _plus_one
    if how == "min":
        return NOTHING, min  # min(earlier, later) is later only where later < earlier
    if how == "max":
        return NOTHING, max
    assert callable(how)
    return NOTHING, how


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
