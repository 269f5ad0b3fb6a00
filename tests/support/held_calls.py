"""What the async-call tests share: calls held on events the test releases, and waits on conditions.

A :class:`HeldCalls` is the base of a test's async function: it notes every
change (a call started, a call returned) on an ``asyncio.Event``, holds the
calls of chosen keys until :meth:`~HeldCalls.release`, and lets a test wait
until a condition holds, checked at each change, never on time.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeldCalls:
    """Events per held key, and a change event renewed at every change."""

    def __init__(self) -> None:
        self.events: dict[Any, asyncio.Event] = {}
        self.changed = asyncio.Event()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def hold(self, key: Any) -> None:
        """Wait until ``key`` is released."""
        await self.events.setdefault(key, asyncio.Event()).wait()

    def release(self, key: Any) -> None:
        """Let ``key``'s calls return."""
        self.events.setdefault(key, asyncio.Event()).set()

    async def until(self, done: Any) -> None:
        """Wait until ``done()`` holds (checked each time a call starts or returns)."""
        while not done():
            await self.changed.wait()


async def until_true(done: Any) -> None:
    """Wait until ``done()`` holds, letting the job run between looks (a safety bound, no timing)."""
    for _ in range(100_000):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("the job never reached the state waited for")
