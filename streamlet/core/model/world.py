"""Where time and chance come from: one seam for the clock, random bytes and blocking calls.

Everything in streamlet that reads the time of day, a monotonic clock or
random bytes (ids, nonces, secrets), or hands a blocking call to a thread,
asks this module instead of ``time``, ``secrets``, ``uuid`` or
``anyio.to_thread`` directly. By default it answers as those do
(:class:`RealWorld`). A deterministic simulation
(``streamlet.testing.chaos``) puts a world of its own in place for the code it
runs (:func:`using`): a virtual clock, bytes drawn from its seed, blocking calls
run inline. The same seed then makes the same run, event for event.

The world in force is a context variable: tasks inherit it from where they were
created, so a simulation's world reaches every task it starts and nothing else.

Example:
    >>> class Frozen(RealWorld):
    ...     def wall_time(self) -> float:
    ...         return 1000.0
    >>> with using(Frozen()):
    ...     wall_time()
    1000.0
    >>> wall_time() > 1000.0
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio.to_thread

T = TypeVar("T")


class RealWorld:
    """The machine's clocks, the operating system's random bytes, and a worker thread for blocking calls."""

    def wall_time(self) -> float:
        """Seconds since the Unix epoch (``time.time``)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for durations (``time.perf_counter``)."""
        return time.perf_counter()

    def token_bytes(self, count: int) -> bytes:
        """``count`` random bytes fit for secrets and nonces (``secrets.token_bytes``)."""
        return secrets.token_bytes(count)

    async def blocking(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` in a worker thread, so the event loop goes on meanwhile."""
        return await anyio.to_thread.run_sync(call, *args)

    def cpu_time(self) -> float:
        """Seconds of CPU the calling thread has used (``time.thread_time``)."""
        return time.thread_time()

    def watches_loop(self) -> bool:
        """Whether a job here measures its event loop's lag (a ticking timer): a real loop, yes; a simulation's
        virtual one has no lag to measure, and a timer of ours would be events in its schedule."""
        return True

    def loop_time(self) -> float:
        """:meth:`monotonic` less the seconds calls of user code held this process's event loop: the time the
        loop was there to answer. A peer's silence is judged on it, so a long call here (a task's plain ``def
        execute`` computing for seconds, when the peer's answers wait unread) does not count as the peer's."""
        return time.perf_counter() - _HELD[0]


_HELD = [0.0]  # seconds calls of user code held this process's loop so far (the runtime adds each one's)


def held_seconds() -> float:
    """Seconds calls of user code held this process's event loop so far (each counted once it returned)."""
    return _HELD[0]


def note_held(seconds: float) -> None:
    """A call of user code held this process's event loop ``seconds`` (see :meth:`RealWorld.loop_time`)."""
    _HELD[0] += seconds


_REAL = RealWorld()
_WORLD: contextvars.ContextVar[RealWorld] = contextvars.ContextVar("streamlet_world", default=_REAL)


@contextlib.contextmanager
def using(world: RealWorld) -> Iterator[RealWorld]:
    """Make ``world`` the one in force here (and in every task started from here) until the block ends."""
    token = _WORLD.set(world)
    try:
        yield world
    finally:
        _WORLD.reset(token)


def current() -> RealWorld:
    """The world in force."""
    return _WORLD.get()


def wall_time() -> float:
    """Seconds since the Unix epoch, in the world in force."""
    return _WORLD.get().wall_time()


def monotonic() -> float:
    """Seconds on a clock for durations, in the world in force."""
    return _WORLD.get().monotonic()


def cpu_time() -> float:
    """Seconds of CPU the calling thread has used, in the world in force."""
    return _WORLD.get().cpu_time()


def loop_time() -> float:
    """Seconds on a clock that stops while user code holds this process's loop, in the world in force."""
    return _WORLD.get().loop_time()


def token_bytes(count: int) -> bytes:
    """``count`` random bytes, in the world in force."""
    return _WORLD.get().token_bytes(count)


def token_hex(count: int) -> str:
    """``count`` random bytes as hex (``2 * count`` characters): ids that must not clash."""
    return _WORLD.get().token_bytes(count).hex()


async def blocking(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` off the event loop, in the world in force (a simulation runs it inline)."""
    return await _WORLD.get().blocking(call, *args)
