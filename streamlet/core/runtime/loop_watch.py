"""How long user code holds the event loop: which call holds it now, and how far the loop lags.

A plain ``def execute`` runs on the event loop of the process that drives its instance, and while it
runs nothing else of that process does: no other instance, no timer, no answer to the cluster. A call
that computes for a second holds the loop for a second. The runtime times every such call (two clock
reads a batch); a call longer than the job's ``loop_warning`` (:data:`DEFAULT_LOOP_WARNING` seconds)
adds its length to the instance's ``loop_held`` seconds (``streamlet_loop_blocked_seconds``, ``streamlet
top``, the dashboard), and the first such call of a task logs one warning naming it (see
docs/operations.md, "A task that holds the loop").

:data:`HOLDER` says which task's call holds the loop now and since when, and :class:`LoopLag` how late
the loop runs what it was asked to: both are read from another thread (a worker's heartbeat thread), which
is the point, since the loop itself cannot answer while it is held.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass

#: Seconds a single call of user code may hold the event loop before it is reported.
DEFAULT_LOOP_WARNING = 0.1
#: Seconds of user calls back to back after which an instance lets the loop run what waits (``sleep(0)``); a
#: plain execute whose calls compute longer than this gets its batches in pieces of about this long.
YIELD_AFTER = 0.05
#: Seconds a call may block (sleep, wait on I/O) before its batches go in pieces too (see ``YIELD_AFTER``).
BLOCKED_AFTER = 1.0
#: The environment variable that sets this process's default instead (an operator's knob: a worker's jobs, a
#: test run that starts many programs at once on few cores, where every call takes longer in wall time).
LOOP_WARNING_ENV = "STREAMLET_LOOP_WARNING"


def default_loop_warning() -> float:
    """``STREAMLET_LOOP_WARNING`` (seconds) when set, else :data:`DEFAULT_LOOP_WARNING`."""
    value = os.environ.get(LOOP_WARNING_ENV)
    return DEFAULT_LOOP_WARNING if not value else float(value)


@dataclass(frozen=True, slots=True)
class Holding:
    """A call of user code holding the loop: the task, its instance, and how long so far (seconds)."""

    task: str
    instance: int
    seconds: float


class LoopHolder:
    """Which call of user code runs on this process's loop now (one loop runs user code at a time)."""

    __slots__ = ("_call", "last")

    def __init__(self) -> None:
        self._call: tuple[str, int, float] | None = None  # (task, instance, perf_counter at entry)
        self.last: tuple[str, int] | None = None  # the task and instance of the latest call

    def enter(self, task: str, instance: int, began: float) -> None:
        """A call of ``task``'s code begins (``began``: ``time.perf_counter()``)."""
        self._call = (task, instance, began)
        self.last = (task, instance)

    def leave(self) -> None:
        """The call returned (or raised)."""
        self._call = None

    def now(self) -> Holding | None:
        """The call holding the loop now, if any; safe from any thread (one read of one attribute)."""
        call = self._call
        if call is None:
            return None
        task, instance, began = call
        return Holding(task, instance, time.perf_counter() - began)


#: The process's one holder: the runtime writes it around calls, a heartbeat thread reads it.
HOLDER = LoopHolder()

_WARNED: set[tuple[str, str]] = set()  # (job, task) whose call held the loop, warned of already


def first_warning(job: str, task: str) -> bool:
    """Whether this is the first time ``task`` of ``job`` held the loop in this process (warn once)."""
    if (job, task) in _WARNED:
        return False
    _WARNED.add((job, task))
    return True


class LoopLag:
    """How late the event loop runs a callback asked for every ``period`` seconds, read from any thread.

    The loop stamps the time at each tick; a reader compares it with the clock. A loop that is free
    lags by ~0; one held by a call for 3 s lags by ~3 s while it is held. ``worst`` is the most a tick came
    late since :meth:`start` (what an in-process job reports once the loop can answer again).
    """

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self.worst = 0.0
        self._last = time.monotonic()
        self._handle: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Begin ticking on the running loop."""
        self._last = time.monotonic()
        self._handle = asyncio.get_running_loop().call_later(self.period, self._tick)

    def stop(self) -> None:
        """Stop ticking."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            self.worst = max(self.worst, now - self._last - self.period)
            self._last = now
        self._handle = asyncio.get_running_loop().call_later(self.period, self._tick)

    def seconds(self) -> float:
        """How far behind the loop is now: 0 when it ticked on time."""
        with self._lock:
            last = self._last
        return max(0.0, time.monotonic() - last - self.period)
