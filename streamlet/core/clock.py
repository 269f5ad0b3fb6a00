"""Time, injected: every runtime timer reads a :class:`Clock`."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """What the runtime needs from time: now, and a way to wait."""

    def now(self) -> float:
        """Seconds since the epoch (or since the clock's own origin)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """Wall-clock time for ``now`` and the event loop's timer for ``sleep``."""

    def now(self) -> float:
        """Seconds since the Unix epoch."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """Sleep on the running event loop."""
        await asyncio.sleep(seconds)
