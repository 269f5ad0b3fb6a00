"""The receiving side of channels, and the ``Channel`` seam senders use.

Every task or sink instance owns one :class:`Inbox` with a bounded FIFO per
input port. A :class:`Channel` is the sending end of one edge into one input
port of one instance; the in-process implementation puts the batch object
itself into the inbox, a network implementation serialises it first. The
runtime only ever sees the ``Channel`` interface.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

from streamlet.core.record import Item

UNBOUNDED = 1 << 62


class Channel(Protocol):
    """Sending end of one edge into one input port of one instance."""

    async def send(self, item: Item) -> None:
        """Deliver a batch or marker in order; waits while the receiver is full."""
        ...

    async def aclose(self) -> None:
        """Release what the channel holds; the receiver is not told (send EOS first)."""
        ...


ChannelFactory = Callable[["Inbox", int], Channel]


class Inbox:
    """Bounded per-port FIFOs of one instance, with one waiting reader.

    Capacity is counted in items (batches or markers). A sender finding its
    port full waits until the reader takes an item from that port: this is the
    backpressure that reaches back to the sources.
    """

    __slots__ = ("_capacities", "_queues", "_reader", "_space_waiters")

    def __init__(self, ports: int, capacity: int) -> None:
        self._queues: list[deque[Item]] = [deque() for _ in range(ports)]
        self._capacities = [capacity] * ports
        self._space_waiters: list[deque[asyncio.Future[None]]] = [deque() for _ in range(ports)]
        self._reader: asyncio.Future[None] | None = None

    def make_unbounded(self, port: int) -> None:
        """Never make senders to ``port`` wait (back edges of a cycle, see runtime)."""
        self._capacities[port] = UNBOUNDED

    async def put(self, port: int, item: Item) -> None:
        """Append ``item`` to ``port``, waiting while the port is full."""
        queue = self._queues[port]
        while len(queue) >= self._capacities[port]:
            waiter = asyncio.get_running_loop().create_future()
            self._space_waiters[port].append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                self._pass_on_wakeup(port, waiter)
                raise
        queue.append(item)
        self._wake_reader()

    def put_nowait(self, port: int, item: Item) -> None:
        """Append ``item`` ignoring capacity (control markers from the runtime)."""
        self._queues[port].append(item)
        self._wake_reader()

    def head(self, port: int) -> Item | None:
        """The next item of ``port`` without taking it, or ``None`` when empty."""
        queue = self._queues[port]
        return queue[0] if queue else None

    def pop(self, port: int) -> Item:
        """Take the next item of ``port`` (which must not be empty)."""
        item = self._queues[port].popleft()
        waiters = self._space_waiters[port]
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        return item

    def is_empty(self, port: int) -> bool:
        """True when ``port`` holds nothing."""
        return not self._queues[port]

    def depth(self) -> int:
        """Items queued over all ports (a load signal)."""
        return sum(len(queue) for queue in self._queues)

    async def wait(self) -> None:
        """Return once something is put into any port."""
        waiter = asyncio.get_running_loop().create_future()
        self._reader = waiter
        try:
            await waiter
        finally:
            self._reader = None

    def _wake_reader(self) -> None:
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    def _pass_on_wakeup(self, port: int, waiter: asyncio.Future[None]) -> None:
        # A cancelled sender that had already been woken must hand its turn on.
        if waiter.done() and not waiter.cancelled():
            for other in self._space_waiters[port]:
                if not other.done():
                    other.set_result(None)
                    break
