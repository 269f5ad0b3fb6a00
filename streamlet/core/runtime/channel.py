"""The receiving side of channels, and the ``Channel`` seam senders use.

Every task or sink instance owns one :class:`Inbox`: one bounded FIFO per
incoming channel (one sender instance into one input port). Keeping senders
apart is what lets a checkpoint barrier hold back one sender while the
others catch up (Flink's alignment). A :class:`Channel` is the sending end;
the in-process implementation puts the batch object itself into the inbox,
a network implementation serialises it first. The runtime only ever sees
the ``Channel`` interface.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

from streamlet.core.model.items import Item
from streamlet.core.model.record import Barrier
from streamlet.core.model.world import monotonic

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
    """Bounded per-channel FIFOs of one instance, with one waiting reader.

    Capacity is counted in items (batches or markers) per channel. A sender
    finding its channel full waits until the reader takes an item from it:
    the backpressure that reaches back to the sources. A checkpoint barrier
    never waits: it goes in behind the items ahead of it however full the
    channel is, so an instance that takes no more data (``map_async`` at full
    concurrency) still sees it and can take the records ahead of it. Each item's arrival
    time is kept beside it: ``last_arrival`` is the one of the item popped
    last (the instance's latency counts from there).
    """

    __slots__ = (
        "_arrivals",
        "_capacities",
        "_capacity",
        "_on_pop",
        "_queues",
        "_reader",
        "_space_waiters",
        "last_arrival",
        "loop_channels",
        "ports",
        "senders",
    )

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._queues: list[deque[Item]] = []
        self._arrivals: list[deque[float]] = []  # monotonic() when each queued item came in
        self.last_arrival = 0.0
        self._capacities: list[int] = []
        self._space_waiters: list[deque[asyncio.Future[None]]] = []
        self._reader: asyncio.Future[None] | None = None
        self._on_pop: list[Callable[[], None] | None] = []
        self.ports: list[int] = []  # the input port of each channel
        self.senders: list[tuple[str, int]] = []  # the sending instance of each channel: (node, index)
        self.loop_channels: set[int] = set()  # channels from inside a loop the receiver is in: no watermarks

    def add_channel(self, port: int, *, unbounded: bool = False, sender: tuple[str, int] = ("", 0)) -> int:
        """A new channel into ``port`` from instance ``sender``; returns its index (what senders put to)."""
        self._queues.append(deque())
        self._arrivals.append(deque())
        self._capacities.append(UNBOUNDED if unbounded else self._capacity)
        self._space_waiters.append(deque())
        self._on_pop.append(None)
        self.ports.append(port)
        self.senders.append(sender)
        return len(self._queues) - 1

    def capacity(self, channel: int) -> int:
        """How many items ``channel`` holds before senders wait."""
        return self._capacities[channel]

    def queued(self, channel: int) -> int:
        """Items waiting in ``channel``."""
        return len(self._queues[channel])

    def queued_by_port(self, ports: int) -> list[int]:
        """Items waiting per input port (``ports`` of them), over every channel into each."""
        counts = [0] * ports
        for port, queue in zip(self.ports, self._queues, strict=True):
            if port < ports:
                counts[port] += len(queue)
        return counts

    def on_pop(self, channel: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time the reader takes an item from ``channel`` (network credit)."""
        self._on_pop[channel] = callback

    @property
    def channel_count(self) -> int:
        """Number of incoming channels."""
        return len(self._queues)

    async def put(self, channel: int, item: Item) -> None:
        """Append ``item`` to ``channel``, waiting while it is full (a barrier never waits)."""
        queue = self._queues[channel]
        while len(queue) >= self._capacities[channel] and type(item) is not Barrier:
            waiter = asyncio.get_running_loop().create_future()
            self._space_waiters[channel].append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                self._pass_on_wakeup(channel, waiter)
                raise
        queue.append(item)
        self._arrivals[channel].append(monotonic())
        self.wake()

    def put_nowait(self, channel: int, item: Item) -> None:
        """Append ``item`` ignoring capacity (control markers from the runtime)."""
        self._queues[channel].append(item)
        self._arrivals[channel].append(monotonic())
        self.wake()

    def head(self, channel: int) -> Item | None:
        """The next item of ``channel`` without taking it, or ``None`` when empty."""
        queue = self._queues[channel]
        return queue[0] if queue else None

    def pop(self, channel: int) -> Item:
        """Take the next item of ``channel`` (which must not be empty)."""
        item = self._queues[channel].popleft()
        self.last_arrival = self._arrivals[channel].popleft()
        hook = self._on_pop[channel]
        if hook is not None:
            hook()
        waiters = self._space_waiters[channel]
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        return item

    def holds(self, channel: int, kind: type) -> bool:
        """Some item of type ``kind`` (a marker class) is queued in ``channel``, anywhere in it."""
        return any(type(item) is kind for item in self._queues[channel])

    def is_empty(self, channel: int) -> bool:
        """True when ``channel`` holds nothing."""
        return not self._queues[channel]

    def depth(self) -> int:
        """Items queued over all channels (a load signal)."""
        return sum(len(queue) for queue in self._queues)

    def fill(self) -> float:
        """The fullest bounded channel's share of its capacity (0..1; 0 with none bounded)."""
        return max(
            (len(q) / c for q, c in zip(self._queues, self._capacities, strict=True) if c != UNBOUNDED), default=0.0
        )

    def full(self) -> bool:
        """Every bounded channel is at capacity: all senders would wait (the instance is a bottleneck)."""
        bounded = [(len(q), c) for q, c in zip(self._queues, self._capacities, strict=True) if c != UNBOUNDED]
        return bool(bounded) and all(queued >= capacity for queued, capacity in bounded)

    async def wait(self) -> None:
        """Return once something is put (or :meth:`wake` is called)."""
        waiter = asyncio.get_running_loop().create_future()
        self._reader = waiter
        try:
            await waiter
        finally:
            self._reader = None

    def waiting(self) -> bool:
        """The reader waits in :meth:`wait` and nothing has woken it yet."""
        reader = self._reader
        return reader is not None and not reader.done()

    def wake(self) -> None:
        """Wake the waiting reader, if any (new data, or a timer fell due)."""
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    def _pass_on_wakeup(self, channel: int, waiter: asyncio.Future[None]) -> None:
        # A cancelled sender that had already been woken must hand its turn on.
        if waiter.done() and not waiter.cancelled():
            for other in self._space_waiters[channel]:
                if not other.done():
                    other.set_result(None)
                    break


class LocalChannel:
    """A :class:`~streamlet.core.runtime.channel.Channel` to an instance in this process.

    No copy and no serialisation: the receiver gets the very list that was
    sent, so batches are read-only once sent.
    """

    __slots__ = ("_inbox", "_port")

    def __init__(self, inbox: Inbox, port: int) -> None:
        self._inbox = inbox
        self._port = port

    async def send(self, item: Item) -> None:
        """Put ``item`` into the receiver's inbox, waiting while it is full."""
        await self._inbox.put(self._port, item)

    async def aclose(self) -> None:
        """Nothing to release in memory."""
