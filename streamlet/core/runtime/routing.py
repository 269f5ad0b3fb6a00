"""Routes: what happens to a record emitted on an output port.

An output port feeds zero or more edges (1-to-N); each edge is a route to
every instance of one downstream node. A route buffers records and hands
whole batches to its channels when flushed, so emitting never awaits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.partition import BROADCAST, ROUND_ROBIN, SAME_KEY, SESSION_TABLE, PartitionSpec
from streamlet.core.model.record import (
    CAUGHT_UP,
    END_OF_STREAM,
    Batch,
    Element,
    Marker,
    Reconfigure,
    Record,
    Watermark,
    record_of,
)
from streamlet.core.model.segments import DEFAULT_SEGMENTS, SegmentTable, segment_of
from streamlet.core.model.views import getrefcount, new_view
from streamlet.core.runtime.channel import Channel
from streamlet.core.runtime.column_routing import ColumnOwners, split_by_instance
from streamlet.errors import EncodingError, TopologyError


class FlowCounter:
    """Counts batches in flight inside a cycle (see ``runtime.CycleTracker``)."""

    __slots__ = ("closed", "dropped", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self.closed = False
        self.dropped = 0


@dataclass
class Switch:
    """A reconfiguration waiting for the sender to reach a batch boundary (its next flush).

    Then the route sends what it buffered by the old table to the old
    channels, ``marker`` after it on each of them, and from there on routes
    to ``channels`` by ``table`` (keyed routes); ``done`` is told once.
    """

    channels: list[Channel]
    table: SegmentTable | None
    marker: Reconfigure
    done: Callable[[], None]


class Route(ABC):
    """One edge from an output port to all instances of a downstream node."""

    __slots__ = (
        "add", "buffers", "caught_up", "channels", "columnar", "columns", "cycle", "label", "send_eos",
        "send_watermarks", "sent", "switch", "watermark",
    )  # fmt: skip

    #: Buffers one record: the hot path, bound by each subclass to a list append or a small closure.
    add: Callable[[Element], None]

    def __init__(self, channels: list[Channel], buffers: int) -> None:
        self.channels = channels
        self.buffers: list[Batch] = [[] for _ in range(buffers)]
        self.sent = 0
        self.cycle: FlowCounter | None = None  # set when the receiver is in a cycle
        self.send_eos = True  # False on edges inside a cycle: the tracker ends them
        self.send_watermarks = True  # False on edges inside a cycle: a loop cannot hold its own head back
        self.label = "edge"  # "edge 'a' -> 'b' input port 0", for messages
        self.switch: Switch | None = None  # a reconfiguration to apply at the next flush
        self.watermark: Watermark | None = None  # the last one sent: a channel added later gets it first
        self.caught_up = False  # CAUGHT_UP was sent: a channel added later gets it first too
        self.columnar = False  # the receiver takes columnar batches as they are (else they become elements here)
        self.columns: list[tuple[int, ColumnBatch]] = []  # columnar batches to send: (buffer index, batch)

    def add_columns(self, batch: ColumnBatch) -> None:
        """Buffer a columnar batch: as it is for a columnar receiver, else as its elements (made once)."""
        if self.columnar:
            self._add_columns(batch)
        else:
            self.add_batch(batch.elements())

    def _add_columns(self, batch: ColumnBatch) -> None:
        """Buffer a columnar batch for a columnar receiver (whole: index 0 is the next channel)."""
        self.columns.append((0, batch))

    def add_batch(self, records: Batch) -> None:
        """Buffer many records."""
        for record in records:
            self.add(record)

    def marks(self) -> list[int]:
        """Buffer lengths now (the columnar batches' last), to roll back to with :meth:`truncate`."""
        return [*(len(buffer) for buffer in self.buffers), len(self.columns)]

    def truncate(self, marks: list[int]) -> None:
        """Forget records buffered since :meth:`marks` (a failed execute)."""
        *lengths, columns = marks
        for buffer, mark in zip(self.buffers, lengths, strict=True):
            del buffer[mark:]
        del self.columns[columns:]

    async def flush(self, at_least: int = 1) -> None:
        """Send every buffer holding at least ``at_least`` records (all of them first, when a switch waits)."""
        if self.switch is not None:
            await self._apply_switch(self.switch)
        for index, buffer in enumerate(self.buffers):
            if len(buffer) >= at_least:
                batch = buffer.copy()
                buffer.clear()
                await self._deliver(index, batch)
        if self.columns:  # a columnar batch is a batch already: it goes whatever its size
            await self._deliver_columns()

    async def _deliver_columns(self) -> None:
        columns, self.columns = self.columns, []
        for index, batch in columns:
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

    async def _apply_switch(self, switch: Switch) -> None:
        """Old buffers to old channels, the marker after them, then route by the new layout."""
        self.switch = None
        for index, buffer in enumerate(self.buffers):
            if buffer:
                batch = buffer.copy()
                buffer.clear()
                await self._deliver(index, batch)
        if self.columns:
            await self._deliver_columns()
        await self.broadcast(switch.marker)
        old = {id(channel) for channel in self.channels}
        self.retarget(switch.channels, switch.table)
        for channel in switch.channels:
            if id(channel) not in old:  # a new instance learns at once what the others were told
                if self.watermark is not None:  # its watermark must not wait for this sender's next rise
                    await channel.send(self.watermark)
                if self.caught_up:
                    await channel.send(CAUGHT_UP)
        switch.done()

    def retarget(self, channels: list[Channel], table: SegmentTable | None) -> None:
        """Route to ``channels`` from now on (every buffer must be empty)."""
        self.channels = channels

    @abstractmethod
    async def _deliver(self, index: int, batch: Batch | ColumnBatch) -> None:
        """Send buffer ``index``'s batch to its channel(s)."""

    async def _send(self, channel: Channel, batch: Batch | ColumnBatch) -> None:
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

    async def _deliver(self, index: int, batch: Batch | ColumnBatch) -> None:
        channel = self.channels[self._next]
        self._next = (self._next + 1) % len(self.channels)
        await self._send(channel, batch)

    def retarget(self, channels: list[Channel], table: SegmentTable | None) -> None:
        """Deal batches over ``channels`` from now on."""
        self.channels = channels
        self._next %= len(channels)


class BroadcastRoute(RoundRobinRoute):
    """Every instance gets every batch (the same list object)."""

    __slots__ = ()

    async def _deliver(self, index: int, batch: Batch | ColumnBatch) -> None:
        for channel in self.channels:
            await self._send(channel, batch)
        self.sent -= len(batch) * (len(self.channels) - 1)  # count records, not copies


class PartitionedRoute(Route):
    """Each record goes to the instance its partition function picks (a user function: ``fn(record, count)``)."""

    __slots__ = ("_appenders", "_count")

    def __init__(self, channels: list[Channel], fn: Callable[[Record, int], int], label: str = "edge") -> None:
        super().__init__(channels, len(channels))
        self._appenders = appenders = [buffer.append for buffer in self.buffers]
        self._count = count = [len(channels)]  # a cell, so a rescale reaches the closure

        record = new_view()  # one record refilled element after element while the function keeps none
        view = [record]
        free = getrefcount(record)  # held by the cell, a local and the call: as in add

        def add(element: Element) -> None:
            parts = count[0]
            record = view[0]
            if len(element) != 3:  # a loop or window element: a record of its own
                record = record_of(element)
            else:
                if getrefcount(record) != free:  # the function kept it: the user's now
                    record = view[0] = new_view()
                record.key, record.value, record.ts = element
            try:
                index = fn(record, parts)  # user code: it sees a record
            except Exception as exc:
                raise TopologyError(f"{label}: the partition function raised {type(exc).__name__}: {exc}") from exc
            if type(index) is not int or not 0 <= index < parts:
                raise TopologyError(f"{label}: the partition function returned {index!r}, expected 0..{parts - 1}")
            appenders[index](element)

        self.add = add

    def _add_columns(self, batch: ColumnBatch) -> None:
        raise TopologyError(f"{self.label}: a partition function cannot route columnar batches; use SAME_KEY")

    async def _deliver(self, index: int, batch: Batch | ColumnBatch) -> None:
        await self._send(self.channels[index], batch)

    def retarget(self, channels: list[Channel], table: SegmentTable | None) -> None:
        """One buffer per instance of the new layout."""
        self.channels = channels
        self.buffers = [[] for _ in channels]
        self._appenders[:] = [buffer.append for buffer in self.buffers]
        self._count[0] = len(channels)


class KeyedRoute(Route):
    """``SAME_KEY``: the key's segment picks the instance through the segment table, cached per key.

    Hashing a key costs a few hundred nanoseconds, a dict lookup about thirty,
    and stream keys repeat: so the instance of each key is cached until the
    cache is full (then it starts afresh: keys drift, and a fresh cache beats
    an LRU's per-hit cost) or the table changes.
    """

    __slots__ = ("_appenders", "_by_key", "_cache", "_column_owners", "_owners", "_place")

    def __init__(
        self, channels: list[Channel], table: SegmentTable, label: str = "edge", cache_limit: int = 1 << 17
    ) -> None:
        super().__init__(channels, len(channels))
        _check_table(table, channels, label)
        self._appenders = appenders = [buffer.append for buffer in self.buffers]
        self._cache: dict[Any, int] = {}
        cache = self._cache
        self._owners = owners = [table.owners]  # a cell: a switch replaces the table the closure reads

        def place(key: Any) -> int:
            table = owners[0]
            index = table[_segment(key, label, table)]
            try:
                if len(cache) >= cache_limit:
                    cache.clear()  # keys drift: a fresh cache beats an LRU's per-hit cost
                cache[key] = index
            except TypeError:  # an unhashable key (a list): correct, just not cached
                pass
            return index

        def add(element: Element) -> None:
            key = element[0]
            try:
                index = cache.get(key)
            except TypeError:
                index = None
            if index is None:
                index = place(key)
            appenders[index](element)

        self._by_key = add
        self._place = place
        self._column_owners = ColumnOwners(self._instances_of)  # the same, for key columns of Arrow batches
        self._set_add()

    def _instances_of(self, keys: list[Any]) -> list[int]:
        """The instance each of ``keys`` goes to (the cache first, as :attr:`add` does; one scan for misses)."""
        get = self._cache.get
        try:
            found = [get(key) for key in keys]
        except TypeError:  # an unhashable key (a list): placed without the cache
            found = [None] * len(keys)
        if None not in found:
            return found  # type: ignore[return-value]  # no None left
        place = self._place
        return [place(key) if index is None else index for key, index in zip(keys, found, strict=True)]

    def _add_columns(self, batch: ColumnBatch) -> None:
        """Split the batch by the instance of each row's key (the same instance as the key's elements)."""
        if len(self.buffers) == 1:
            self.columns.append((0, batch))
        else:
            self.columns.extend(split_by_instance(batch, self._column_owners, len(self.buffers), self.label))

    def _set_add(self) -> None:
        # one instance: every key goes there, so no lookup at all (the outputs re-read ``add`` after a switch)
        self.add = self.buffers[0].append if len(self.channels) == 1 else self._by_key

    def add_batch(self, records: Batch) -> None:
        """Buffer many records."""
        if len(self.buffers) == 1:
            self.buffers[0].extend(records)
        else:
            add = self._by_key
            for record in records:
                add(record)

    async def _deliver(self, index: int, batch: Batch | ColumnBatch) -> None:
        await self._send(self.channels[index], batch)

    def retarget(self, channels: list[Channel], table: SegmentTable | None) -> None:
        """Route by ``table`` to ``channels`` (one per instance) from now on."""
        assert table is not None, "a keyed route switches to a segment table"
        _check_table(table, channels, self.label)
        self.channels = channels
        self.buffers = [[] for _ in channels]
        self._appenders[:] = [buffer.append for buffer in self.buffers]
        self._owners[0] = table.owners
        self._cache.clear()
        self._column_owners = ColumnOwners(self._instances_of)
        self._set_add()


class SessionTableRoute(KeyedRoute):
    """``SESSION_TABLE``: ``SAME_KEY`` routing over the segment table that also counts each segment's records.

    ``loads[segment]`` (cumulative, never reset: a rate is the difference of
    two reads) is what the session-table balancer weighs segments by; it
    caches each key's *segment* (fixed for the job's life) rather than its
    instance, so a moved segment needs no cache flush. ``target`` is the
    downstream task.
    """

    __slots__ = ("loads", "target")

    def __init__(
        self, channels: list[Channel], table: SegmentTable, label: str, target: str, cache_limit: int = 1 << 17
    ) -> None:
        Route.__init__(self, channels, len(channels))
        _check_table(table, channels, label)
        self.target = target
        self.loads = loads = [0] * table.segments
        self._appenders = appenders = [buffer.append for buffer in self.buffers]
        cache: dict[Any, int] = {}
        self._cache = cache
        self._owners = owners = [table.owners]

        def add(element: Element) -> None:
            key = element[0]
            try:
                segment = cache.get(key)
            except TypeError:  # an unhashable key (a list): correct, just not cached
                segment = None
            if segment is None:
                segment = _segment(key, label, owners[0])
                try:
                    if len(cache) >= cache_limit:
                        cache.clear()  # keys drift: a fresh cache beats an LRU's per-hit cost
                    cache[key] = segment
                except TypeError:
                    pass
            loads[segment] += 1
            appenders[owners[0][segment]](element)

        self._by_key = self.add = add

    def _set_add(self) -> None:
        self.add = self._by_key  # one instance or many: every record is counted

    def _add_columns(self, batch: ColumnBatch) -> None:
        raise TopologyError(f"{self.label}: SESSION_TABLE cannot route columnar batches; use SAME_KEY")

    def add_batch(self, records: Batch) -> None:
        """Buffer many records (each counted in its segment)."""
        add = self._by_key
        for record in records:
            add(record)

    def retarget(self, channels: list[Channel], table: SegmentTable | None) -> None:
        """Route by ``table`` to ``channels`` from now on; a key's segment never changes, so the cache stays."""
        cache = dict(self._cache)
        super().retarget(channels, table)
        self._cache.update(cache)


def segment_loads(routes: Iterable[Route]) -> dict[str, list[int]]:
    """Per downstream task, the records ``routes`` sent into each of its segments (``SESSION_TABLE`` edges only)."""
    found: dict[str, list[int]] = {}
    for route in routes:
        if isinstance(route, SessionTableRoute):
            totals = found.setdefault(route.target, [0] * len(route.loads))
            for segment, count in enumerate(route.loads):
                totals[segment] += count
    return found


def _segment(key: Any, label: str, owners: tuple[int, ...]) -> int:
    try:
        return segment_of(key, len(owners))
    except EncodingError as exc:  # a key msgpack cannot hash: name the edge too
        raise EncodingError(f"{label}: {exc}", value_type=exc.value_type) from exc


def _check_table(table: SegmentTable, channels: list[Channel], label: str) -> None:
    if table.instances != len(channels):
        raise TopologyError(f"{label}: a segment table for {table.instances} instances, but {len(channels)} channels")


def in_loop_adder(
    add: Callable[[Element], None], sender: HasIteration, back_edge_limit: int | None, counter: FlowCounter
) -> Callable[[Element], None]:
    """Wrap ``add`` of an edge inside a cycle so records carry their iteration.

    The count is the sending instance's current one (``sender.iteration``),
    plus one across a back edge, where records past ``back_edge_limit`` are
    dropped and counted.
    """
    if back_edge_limit is None:

        def add_in_loop(element: Element) -> None:
            add((element[0], element[1], element[2], sender.iteration, None, None))

        return add_in_loop
    limit = back_edge_limit

    def add_looped(element: Element) -> None:
        iteration = sender.iteration + 1
        if iteration > limit:
            counter.dropped += 1
            return
        add((element[0], element[1], element[2], iteration, None, None))

    return add_looped


class HasIteration(Protocol):
    """What an in-loop edge reads from its sender."""

    iteration: int


def make_route(
    channels: list[Channel],
    partitioning: PartitionSpec,
    label: str = "edge",
    table: SegmentTable | None = None,
    target: str = "",
) -> Route:
    """The route for ``partitioning`` towards ``channels`` (one per instance); ``label`` names the edge in errors.

    A ``SAME_KEY`` or ``SESSION_TABLE`` route follows ``table`` (default: contiguous segment ranges over the
    channels); ``target`` names the downstream task a ``SESSION_TABLE`` route counts segment loads for.
    """
    route = _make_route(channels, partitioning, label, table, target)
    route.label = label
    return route


def _make_route(
    channels: list[Channel], partitioning: PartitionSpec, label: str, table: SegmentTable | None, target: str
) -> Route:
    if partitioning is ROUND_ROBIN:
        return RoundRobinRoute(channels)
    if partitioning is BROADCAST:
        return BroadcastRoute(channels)
    if partitioning is SAME_KEY:
        return KeyedRoute(channels, table or SegmentTable.contiguous(DEFAULT_SEGMENTS, len(channels)), label)
    if partitioning is SESSION_TABLE:
        table = table or SegmentTable.contiguous(DEFAULT_SEGMENTS, len(channels))
        return SessionTableRoute(channels, table, label, target)
    user_fn: Any = partitioning
    return PartitionedRoute(channels, user_fn, label)


class DiscardRoute(RoundRobinRoute):
    """An output port nobody listens to: records are counted, then dropped."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__([])
        self.send_eos = False

    def add_columns(self, batch: ColumnBatch) -> None:
        """Nobody listens: count the rows, make nothing of them."""
        self.sent += len(batch)

    async def _deliver(self, index: int, batch: Batch | ColumnBatch) -> None:
        self.sent += len(batch)
