"""The clock seam: what the runtime needs of time. Implementations (system time, a manual clock for tests)
are in ``core.runtime.clock``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    """A scheduled callback that can be cancelled."""

    def cancel(self) -> None:
        """Do not call the callback (no effect once it ran)."""
        ...


class Clock(Protocol):
    """What the runtime needs from time: now, waiting, and callbacks at a time."""

    def now(self) -> float:
        """Seconds since the epoch (or since the clock's own origin)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` of this clock's time."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Call ``callback`` (in the event loop) once the clock reads ``when``."""
        ...
