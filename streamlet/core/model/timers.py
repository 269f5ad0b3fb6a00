"""Per-key timers (Flink's ProcessFunction timers): a task asks to be called back at a time, per key.

A task reaches them as ``self.timers`` (set by the runtime, like ``self.state``)
and is called back through ``Task.on_timer(key, when, time, outputs)``:

* an *event-time* timer fires once the instance's watermark reaches ``when``
  (watermark >= ``when``), before the watermark is passed downstream;
* a *processing-time* timer fires once the job's clock reaches ``when``.

One timer per ``(key, when, time)``: setting it again changes nothing.
Timers fire in order of ``when``, then of when they were set.

The class lives in the model, next to the ``Task`` that names it, because
the runtime layers may depend on the model and not the other way round; it
needs nothing but the exact encoding for its checkpoints.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Generator
from typing import Any, Literal

from streamlet.core.model import world
from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.model.segments import DEFAULT_SEGMENTS, SegmentTable

TimeDomain = Literal["event", "processing"]
TIME_DOMAINS: tuple[TimeDomain, ...] = ("event", "processing")

# A cancelled timer stays in its heap until it comes up (removing it from the middle would cost O(n));
# once stale entries outnumber live ones by this much, the heap is rebuilt from the live ones.
_COMPACT_AT = 64


class _Queue:
    """One time domain's timers: the live ones by ``(key, when)`` and a heap in firing order."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.live: dict[tuple[Any, float], int] = {}  # (key, when) -> the order it was set in
        self.heap: list[tuple[float, int, Any]] = []  # (when, order, key); entries not in ``live`` are stale

    def peek(self) -> tuple[float, int, Any] | None:
        """The next live entry, dropping stale ones off the top."""
        heap, live = self.heap, self.live
        while heap:
            when, order, key = heap[0]
            if live.get((key, when)) == order:
                return heap[0]
            heapq.heappop(heap)
        return None

    def compact(self) -> None:
        """Rebuild the heap when cancelled entries make up most of it (in place: a pass may hold it)."""
        if len(self.heap) > _COMPACT_AT and len(self.heap) > 2 * len(self.live):
            self.heap[:] = [(when, order, key) for (key, when), order in self.live.items()]
            heapq.heapify(self.heap)


class Timers:
    """One task instance's timers: :meth:`at`, :meth:`cancel`, :meth:`pending`.

    Keys are any hashable, encodable value (as for ``self.state``); ``when`` is
    seconds, on the records' event-time scale (``time="event"``) or the job
    clock's (``time="processing"``): :meth:`now` reads that clock and
    :attr:`watermark` is the instance's event time. The runtime fires them and
    checkpoints them; a task restarted under ``on_error="restart"`` keeps them.

    Example:
        >>> timers = Timers()
        >>> timers.at("user-1", 60.0)
        >>> timers.at("user-1", 60.0)  # the same timer: still one
        >>> timers.at("user-2", 30.0, time="processing")
        >>> timers.pending()
        [('user-2', 30.0, 'processing'), ('user-1', 60.0, 'event')]
        >>> timers.cancel("user-1", 60.0)
        >>> timers.pending("user-1")
        []
    """

    __slots__ = ("_now", "_order", "_queues", "_undo_log", "watermark")

    def __init__(self, now: Callable[[], float] = world.wall_time) -> None:
        self._queues: dict[str, _Queue] = {time: _Queue() for time in TIME_DOMAINS}
        self._order = itertools.count()
        self._now = now
        #: The instance's watermark (set by the runtime as it rises; -inf until the first one, and after a restore).
        self.watermark: float = -math.inf
        #: While a call runs under a replaying error policy: what it set or cancelled, to take back.
        self._undo_log: list[tuple[Any, ...]] | None = None

    def now(self) -> float:
        """The job clock's time: what processing-time timers are set against (``now() + 30``)."""
        return self._now()

    # -- what a task calls -------------------------------------------------------

    def at(self, key: Any, when: float, time: TimeDomain = "event") -> None:
        """Call ``on_timer`` for ``key`` once ``time`` reaches ``when`` (no effect if that timer is set).

        An event-time timer set for a time the watermark has already passed
        fires at the next rise of the watermark (or at the end of the input);
        a processing-time one for a time already past, as soon as the
        instance next looks at the clock.
        """
        queue = self._queue(time)
        when = _check_when(when)
        slot = (key, when)
        if slot in queue.live:
            return
        order = next(self._order)
        queue.live[slot] = order
        heapq.heappush(queue.heap, (when, order, key))
        if self._undo_log is not None:
            self._undo_log.append((queue, slot, None))

    def cancel(self, key: Any, when: float, time: TimeDomain = "event") -> None:
        """Forget the timer for ``key`` at ``when``; no error when there is none."""
        queue = self._queue(time)
        slot = (key, _check_when(when))
        order = queue.live.pop(slot, None)
        if order is not None:
            if self._undo_log is not None:
                self._undo_log.append((queue, slot, order))
            queue.compact()

    def pending(self, key: Any = None) -> list[tuple[Any, float, TimeDomain]]:
        """``(key, when, time)`` of every timer not yet fired, in firing order; only ``key``'s when given.

        ``None`` means every key (a timer of the key ``None`` is among them).
        """
        entries = [
            (when, order, found, time)
            for time in TIME_DOMAINS
            for (found, when), order in self._queues[time].live.items()
            if key is None or found == key
        ]
        entries.sort(key=lambda entry: (entry[0], entry[1]))
        return [(found, when, time) for when, _, found, time in entries]

    # -- what the runtime calls --------------------------------------------------

    def next_due(self, time: TimeDomain) -> float | None:
        """When the earliest timer of ``time`` is due, or ``None`` when there is none."""
        entry = self._queues[time].peek()
        return None if entry is None else entry[0]

    def last_due(self, time: TimeDomain) -> float | None:
        """The latest ``when`` among the timers of ``time``, or ``None`` when there is none."""
        return max((when for _, when in self._queues[time].live), default=None)

    def due(self, time: TimeDomain, until: float) -> Generator[tuple[Any, float], None, None]:
        """One firing pass: take the timers of ``time`` with ``when <= until``, one ``(key, when)`` at a time.

        Each is removed before it is yielded, so the callback may set or
        cancel timers, and those it sets that are due (``when <= until``)
        are taken in this pass too, in order. A timer the pass has already
        fired that is set again during it (a callback re-setting its own
        timer at the same ``when``) is not taken twice: it stays pending for
        the next pass, so such a callback cannot loop forever. Close the
        iterator when done (a ``for`` loop does; on an error, call ``close``).
        """
        queue = self._queues[time]
        heap, live = queue.heap, queue.live
        fired: set[tuple[Any, float]] = set()
        deferred: list[tuple[float, int, Any]] = []
        try:
            while heap and heap[0][0] <= until:
                entry = heapq.heappop(heap)
                when, order, key = entry
                slot = (key, when)
                if live.get(slot) != order:
                    continue  # cancelled, or set again later (its newer entry comes up on its own)
                if slot in fired:
                    deferred.append(entry)
                    continue
                del live[slot]
                fired.add(slot)
                yield key, when
        finally:
            for entry in deferred:
                heapq.heappush(heap, entry)

    def clear(self) -> None:
        """Forget every timer."""
        for queue in self._queues.values():
            queue.live.clear()
            queue.heap.clear()

    # -- taking back a failed call (``core.state.undo``) ------------------------------

    def start_undo_log(self) -> None:
        """From now on, note what :meth:`at` and :meth:`cancel` change."""
        self._undo_log = []

    def stop_undo_log(self) -> None:
        """Stop noting; the changes stand."""
        self._undo_log = None

    def take_back(self) -> None:
        """Undo what was set or cancelled since :meth:`start_undo_log`, newest first; stop noting."""
        log, self._undo_log = self._undo_log or [], None
        for queue, slot, order in reversed(log):
            if order is None:  # set by the call: gone again
                queue.live.pop(slot, None)
            else:  # cancelled by the call: pending again, in its old place in the firing order
                queue.live[slot] = order
                heapq.heappush(queue.heap, (slot[1], order, slot[0]))

    # -- checkpoints ---------------------------------------------------------------

    def checkpoint(self) -> bytes:
        """The pending timers as bytes: ``[time, when, key]`` in firing order, keys exactly encoded."""
        entries = [[time, when, key] for key, when, time in self.pending()]
        return pack_exact(entries, "timers", "timer list")

    def checkpoint_increment(self) -> Any:
        """What an incremental checkpoint holds of the timers: here :meth:`checkpoint` (RocksDB's timers give
        what changed since the previous one)."""
        return self.checkpoint()

    def restore(self, snapshot: bytes | None) -> None:
        """Replace the timers with :meth:`checkpoint`'s (``None``, from a checkpoint without timers: none)."""
        self.clear()
        for time, when, key in _unpack(snapshot):
            self.at(key, when, time)

    @staticmethod
    def partition(snapshot: bytes | None, parts: int, owner: Callable[[Any], int] | None = None) -> list[bytes]:
        """Split a snapshot by key into ``parts``: part i holds the timers of the keys ``owner`` gives
        instance i (default: the ``SAME_KEY`` rule, as for keyed state)."""
        owner = owner or SegmentTable.contiguous(DEFAULT_SEGMENTS, parts).owner_function()
        split: list[list[Any]] = [[] for _ in range(parts)]
        for entry in _unpack(snapshot):
            split[owner(entry[2])].append(entry)
        return [pack_exact(part, "timers", "timer list") for part in split]

    @staticmethod
    def merge(parts: list[bytes | None]) -> bytes:
        """Join snapshots of several instances into one, in firing order."""
        entries = [entry for part in parts for entry in _unpack(part)]
        entries.sort(key=lambda entry: entry[1])  # stable: each instance's order among equal times is kept
        return pack_exact(entries, "timers", "timer list")

    def _queue(self, time: str) -> _Queue:
        try:
            return self._queues[time]
        except (KeyError, TypeError):
            raise ValueError(f"time must be 'event' or 'processing', got {time!r}") from None


def _check_when(when: Any) -> float:
    if type(when) is bool or not isinstance(when, int | float) or (isinstance(when, float) and math.isnan(when)):
        raise TypeError(f"a timer's when must be a number of seconds, got {when!r}")
    return when


def _unpack(snapshot: bytes | None) -> list[Any]:
    if snapshot is None:
        return []
    entries = unpackb(snapshot)
    if type(entries) is not list:
        raise ValueError(f"a timers snapshot is a list, not {type(entries).__name__}")
    return entries
