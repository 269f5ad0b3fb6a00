"""Time, injected: every runtime timer reads a :class:`Clock`."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from streamlet.core.model import world
from streamlet.core.model.clock import Timer


class SystemClock:
    """Wall-clock time for ``now``; the event loop's timer for waiting."""

    def now(self) -> float:
        """Seconds since the Unix epoch."""
        return world.wall_time()

    async def sleep(self, seconds: float) -> None:
        """Sleep on the running event loop."""
        await asyncio.sleep(seconds)

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Schedule ``callback`` on the running loop."""
        return asyncio.get_running_loop().call_later(max(0.0, when - world.wall_time()), callback)


class ManualClock:
    """A clock that moves only when told to: deterministic time for tests.

    Example:
        >>> clock = ManualClock(start=100.0)
        >>> fired = []
        >>> _ = clock.call_at(105.0, lambda: fired.append(clock.now()))
        >>> clock.advance(10)
        >>> fired
        [105.0]
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """The current manual time."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` when :meth:`advance` reaches ``when``."""
        timer = _ManualTimer(callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by ``seconds``."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not done.done():
                done.set_result(None)

        self.call_at(self._now + seconds, wake)
        await done

    def advance(self, seconds: float) -> None:
        """Move time forward, running every callback that falls due, in time order."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            timer.fire()
        self._now = target

    def pending(self) -> int:
        """Timers not yet fired or cancelled."""
        return sum(1 for _, _, timer in self._timers if not timer.cancelled)


class _ManualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.callback()
