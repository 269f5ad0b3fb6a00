"""Routes: what happens to a record emitted on an output port.

An output port feeds zero or more edges (1-to-N); each edge is a route to
every instance of one downstream node. A route buffers records and hands
whole batches to its channels when flushed, so emitting never awaits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from streamlet.core.model.partition import BROADCAST, ROUND_ROBIN, SAME_KEY, KeyPartitioner, PartitionSpec
from streamlet.core.model.record import END_OF_STREAM, Batch, LoopRecord, Marker, Record
from streamlet.core.runtime.channel import Channel
from streamlet.errors import EncodingError, TopologyError


class FlowCounter:
    """Counts batches in flight inside a cycle (see ``runtime.CycleTracker``)."""

    __slots__ = ("closed", "dropped", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self.closed = False
        self.dropped = 0


class Route(ABC):
    """One edge from an output port to all instances of a downstream node."""

    __slots__ = ("add", "buffers", "channels", "cycle", "label", "send_eos", "send_watermarks", "sent")

    #: Buffers one record: the hot path, bound by each subclass to a list append or a small closure.
    add: Callable[[Record], None]

    def __init__(self, channels: list[Channel], buffers: int) -> None:
        self.channels = channels
        self.buffers: list[Batch] = [[] for _ in range(buffers)]
        self.sent = 0
        self.cycle: FlowCounter | None = None  # set when the receiver is in a cycle
        self.send_eos = True  # False on edges inside a cycle: the tracker ends them
        self.send_watermarks = True  # False on edges inside a cycle: a loop cannot hold its own head back
        self.label = "edge"  # "edge 'a' -> 'b' input port 0", for messages

    def add_batch(self, records: Batch) -> None:
        """Buffer many records."""
        for record in records:
            self.add(record)

    def buffered(self) -> int:
        """Largest number of records waiting in one buffer."""
        return max(len(buffer) for buffer in self.buffers)

    def marks(self) -> list[int]:
        """Buffer lengths now, to roll back to with :meth:`truncate`."""
        return [len(buffer) for buffer in self.buffers]

    def truncate(self, marks: list[int]) -> None:
        """Forget records buffered since :meth:`marks` (a failed execute)."""
        for buffer, mark in zip(self.buffers, marks, strict=True):
            del buffer[mark:]

    async def flush(self, at_least: int = 1) -> None:
        """Send every buffer holding at least ``at_least`` records."""
        for index, buffer in enumerate(self.buffers):
            if len(buffer) >= at_least:
                batch = buffer.copy()
                buffer.clear()
                await self._deliver(index, batch)

    async def end(self) -> None:
        """Flush, then tell every receiver this sender is done."""
        await self.flush()
        if self.send_eos:
            await self.broadcast(END_OF_STREAM)

    async def broadcast(self, marker: Marker) -> None:
        """Send ``marker`` to every instance, in order after the data."""
        for channel in self.channels:
            await channel.send(marker)

    @abstractmethod
    async def _deliver(self, index: int, batch: Batch) -> None:
        """Send buffer ``index``'s batch to its channel(s)."""

    async def _send(self, channel: Channel, batch: Batch) -> None:
        cycle = self.cycle
        if cycle is not None:
            if cycle.closed:  # the loop already ended: nobody will read this
                cycle.dropped += len(batch)
                return
            cycle.pending += 1
        self.sent += len(batch)
        try:
            await channel.send(batch)
        except EncodingError as exc:  # a record that cannot go over TCP: name the edge as well as the channel
            raise EncodingError(f"{self.label}: {exc}", value_type=exc.value_type) from exc.__cause__


class RoundRobinRoute(Route):
    """Whole batches go to the instances in turn (cheaper than per record)."""

    __slots__ = ("_next",)

    def __init__(self, channels: list[Channel]) -> None:
        super().__init__(channels, 1)
        self.add = self.buffers[0].append
        self._next = 0

    def add_batch(self, records: Batch) -> None:
        """Buffer many records."""
        self.buffers[0].extend(records)

    async def _deliver(self, index: int, batch: Batch) -> None:
        channel = self.channels[self._next]
        self._next = (self._next + 1) % len(self.channels)
        await self._send(channel, batch)


class BroadcastRoute(RoundRobinRoute):
    """Every instance gets every batch (the same list object)."""

    __slots__ = ()

    async def _deliver(self, index: int, batch: Batch) -> None:
        for channel in self.channels:
            await self._send(channel, batch)
        self.sent -= len(batch) * (len(self.channels) - 1)  # count records, not copies


class PartitionedRoute(Route):
    """Each record goes to the instance its partition function picks."""

    __slots__ = ()

    def __init__(self, channels: list[Channel], pick: Callable[[Record], int]) -> None:
        super().__init__(channels, len(channels))
        appenders = [buffer.append for buffer in self.buffers]

        def add(record: Record) -> None:
            appenders[pick(record)](record)

        self.add = add

    async def _deliver(self, index: int, batch: Batch) -> None:
        await self._send(self.channels[index], batch)


class KeyedRoute(PartitionedRoute):
    """``SAME_KEY``: the stable hash of the key picks the instance, cached per key."""

    __slots__ = ()

    def __init__(self, channels: list[Channel], label: str = "edge") -> None:
        Route.__init__(self, channels, len(channels))
        appenders = [buffer.append for buffer in self.buffers]
        by_key = KeyPartitioner(len(channels))
        cache = by_key.cache

        def add(record: Record) -> None:
            try:
                index = cache.get(record.key)
            except TypeError:  # unhashable key: the partitioner hashes it uncached
                index = None
            if index is None:
                try:
                    index = by_key(record.key)
                except EncodingError as exc:  # a key msgpack cannot hash: name the edge too
                    raise EncodingError(f"{label}: {exc}", value_type=exc.value_type) from exc
            appenders[index](record)

        self.add = add


def in_loop_adder(
    add: Callable[[Record], None], sender: HasIteration, back_edge_limit: int | None, counter: FlowCounter
) -> Callable[[Record], None]:
    """Wrap ``add`` of an edge inside a cycle so records carry their iteration.

    The count is the sending instance's current one (``sender.iteration``),
    plus one across a back edge, where records past ``back_edge_limit`` are
    dropped and counted.
    """
    if back_edge_limit is None:

        def add_in_loop(record: Record) -> None:
            add(LoopRecord(record.key, record.value, record.ts, sender.iteration))

        return add_in_loop
    limit = back_edge_limit

    def add_looped(record: Record) -> None:
        iteration = sender.iteration + 1
        if iteration > limit:
            counter.dropped += 1
            return
        add(LoopRecord(record.key, record.value, record.ts, iteration))

    return add_looped


class HasIteration(Protocol):
    """What an in-loop edge reads from its sender."""

    iteration: int


def make_route(channels: list[Channel], partitioning: PartitionSpec, label: str = "edge") -> Route:
    """The route for ``partitioning`` towards ``channels`` (one per instance); ``label`` names the edge in errors."""
    route = _make_route(channels, partitioning, label)
    route.label = label
    return route


def _make_route(channels: list[Channel], partitioning: PartitionSpec, label: str = "edge") -> Route:
    if partitioning is ROUND_ROBIN or (len(channels) == 1 and partitioning is SAME_KEY):
        return RoundRobinRoute(channels)
    if partitioning is BROADCAST:
        return BroadcastRoute(channels)
    if partitioning is SAME_KEY:
        return KeyedRoute(channels, label)
    count = len(channels)
    user_fn: Any = partitioning

    def pick(record: Record) -> int:
        try:
            index = user_fn(record, count)
        except Exception as exc:
            raise TopologyError(f"{label}: the partition function raised {type(exc).__name__}: {exc}") from exc
        if type(index) is not int or not 0 <= index < count:
            raise TopologyError(f"{label}: the partition function returned {index!r}, expected 0..{count - 1}")
        return index

    return PartitionedRoute(channels, pick)


class DiscardRoute(RoundRobinRoute):
    """An output port nobody listens to: records are counted, then dropped."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__([])
        self.send_eos = False

    async def _deliver(self, index: int, batch: Batch) -> None:
        self.sent += len(batch)
