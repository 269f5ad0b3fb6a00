"""``KafkaSource``: records from Kafka topics, replayable from checkpoints, offsets committed after them.

Partitions are assigned by hand, not by a consumer group's rebalancing:
instance ``i`` of ``n`` reads the partitions at positions ``i, i+n, i+2n, ...``
of the sorted ``(topic, partition)`` list, so an instance's partitions never
move while the job runs. The group (``group_id``) only stores offsets:

- A checkpoint holds each instance's next offset per partition; a restore
  seeks there, so the job replays exactly what follows the checkpoint.
- Those offsets are committed to the group **only after the checkpoint is
  complete** (``checkpoint_complete``), never by a timer. A job started without
  a checkpoint to restore begins at the group's committed offsets, or at
  ``auto_offset_reset`` for partitions the group has not committed.
- Without checkpoints nothing is committed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import anyio
import structlog

from streamlet.connectors.kafka_common import (
    Deserializer,
    broker_errors,
    decode_utf8,
    partitions_of,
    require_aiokafka,
    servers,
)
from streamlet.core.model.record import Batch, DeadLetter, Record
from streamlet.core.model.sources import Source, SourceContext, SourceReader
from streamlet.errors import KafkaError

log = structlog.get_logger("streamlet")

Partition = tuple[str, int]


class KafkaSource(Source):
    """Records from ``topics``: key and value from the deserializers, ``ts`` the Kafka timestamp in seconds.

    Args:
        topics: a topic name or several.
        bootstrap_servers: ``"host:port"`` or a list of them.
        group_id: the consumer group that stores committed offsets (``None``: none kept).
        key_deserializer: ``bytes -> key``; default UTF-8 text. A null key stays ``None`` without a call.
        value_deserializer: ``bytes -> value``; default UTF-8 text. A null value (a tombstone) stays
            ``None`` without a call.
        with_headers: make each value ``{"value": value, "headers": [(name, bytes), ...]}``.
        on_error: what an undecodable record (a deserializer raised) does: ``"skip"``
            (default: it goes to ``result.dead_letters`` with its raw bytes, is counted in
            ``statistics.dead_lettered``, and the stream goes on) or ``"fail"`` (the job
            stops with a ``KafkaError`` naming topic, partition and offset).
        stop_at_end: read up to the end offsets seen at start, then end (batch use, tests);
            by default the source never ends.
        auto_offset_reset: where a partition without a committed offset starts: ``"earliest"`` or ``"latest"``.
        isolation_level: ``"read_uncommitted"`` (aiokafka's default) or ``"read_committed"``.
        poll_timeout: seconds one fetch waits for data.
        metadata_timeout: seconds to wait for the topics to exist before failing.
        consumer_options: more ``AIOKafkaConsumer`` keyword arguments.

    Example:
        >>> source = KafkaSource("clicks", "localhost:9092", "clicks-job", stop_at_end=True)
    """

    def __init__(
        self,
        topics: str | Sequence[str],
        bootstrap_servers: str | Sequence[str],
        group_id: str | None,
        *,
        key_deserializer: Deserializer = decode_utf8,
        value_deserializer: Deserializer = decode_utf8,
        with_headers: bool = False,
        on_error: str = "skip",
        stop_at_end: bool = False,
        auto_offset_reset: str = "earliest",
        isolation_level: str = "read_uncommitted",
        poll_timeout: float = 0.5,
        metadata_timeout: float = 10.0,
        consumer_options: dict[str, Any] | None = None,
    ) -> None:
        if on_error not in ("skip", "fail"):
            raise KafkaError(f"KafkaSource on_error must be 'skip' or 'fail', not {on_error!r}")
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer
        self.with_headers = with_headers
        self.on_error = on_error
        self.stop_at_end = stop_at_end
        self.auto_offset_reset = auto_offset_reset
        self.isolation_level = isolation_level
        self.poll_timeout = poll_timeout
        self.metadata_timeout = metadata_timeout
        self.consumer_options = dict(consumer_options or {})

    def open(self, context: SourceContext) -> SourceReader:
        """A reader for instance ``context.index``; connects on its first read."""
        require_aiokafka()
        return _KafkaReader(self, context)

    def make_consumer(self, group_id: str | None) -> Any:
        """An ``AIOKafkaConsumer`` (not started) with this source's settings; offsets are never auto-committed."""
        aiokafka = require_aiokafka()
        return aiokafka.AIOKafkaConsumer(
            bootstrap_servers=servers(self.bootstrap_servers),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset=self.auto_offset_reset,
            isolation_level=self.isolation_level,
            **self.consumer_options,
        )


class _KafkaReader(SourceReader):
    """One instance's consumer. ``read`` only awaits while nothing is fetched, so cancelling it loses nothing."""

    gives_elements = True  # (key, value, ts) tuples

    def __init__(self, source: KafkaSource, context: SourceContext) -> None:
        self.source = source
        self.context = context
        self.what = f"source '{context.node}' instance {context.index}"
        self.consumer: Any = None
        self.closed = False
        self.next_offsets: dict[Any, int] = {}  # TopicPartition -> offset of the next record to emit
        self.seek_to: dict[Partition, int] = {}
        self.ends: dict[Any, int] = {}  # with stop_at_end: TopicPartition -> end offset seen at start
        self.start_ends: dict[Any, int] = {}  # TopicPartition -> end offset seen at start (for caught_up)
        self.caught = False  # every partition reached the end offset seen at start
        self.done: set[Any] = set()
        self.newest: dict[Any, float] = {}  # TopicPartition -> largest event time read from it

    # -- starting -----------------------------------------------------------------

    async def _start(self) -> None:
        self.consumer = consumer = self.source.make_consumer(self.source.group_id)
        await consumer.start()
        await self._assign(consumer)  # on failure aclose() stops the consumer

    async def _assign(self, consumer: Any) -> None:
        aiokafka = require_aiokafka()
        everything = await partitions_of(consumer._client, self.source.topics, self.what, self.source.metadata_timeout)
        ctx = self.context
        mine = [aiokafka.TopicPartition(*pair) for pair in everything[ctx.index :: ctx.parallelism]]
        if not mine:
            log.warning("kafka source has no partition", task=ctx.node, instance=ctx.index, partitions=len(everything))
            return
        consumer.assign(mine)
        for partition in mine:
            offset = self.seek_to.get((partition.topic, partition.partition))
            if offset is not None:
                consumer.seek(partition, offset)
        for partition in mine:  # resolves committed offsets and auto_offset_reset now, for position()
            self.next_offsets[partition] = await consumer.position(partition)
        self.start_ends = await consumer.end_offsets(mine)
        if self.source.stop_at_end:
            self.ends = dict(self.start_ends)
            await self._mark_done()

    # -- reading ------------------------------------------------------------------

    async def read(self, max_records: int) -> Batch | None:
        with broker_errors(self.what):
            return await self._read(max_records)

    async def _read(self, max_records: int) -> Batch | None:
        if self.consumer is None:
            with anyio.CancelScope(shield=True):  # a barrier waits for the start: half a start would leak
                await self._start()
        timeout_ms = int(self.source.poll_timeout * 1000)
        while self.next_offsets and len(self.done) < len(self.next_offsets):
            fetched = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            batch = self._records(fetched)  # no await from here on: fetched records are never lost
            if batch:
                self.caught = self.caught or self._at_start_ends()
                return batch
            if self.source.stop_at_end:
                await self._mark_done()
            if not self.caught and await self._reached_start_ends():
                self.caught = True
                return []  # an empty read: the runtime asks caught_up() now, not once the next record comes
        return None

    def caught_up(self) -> bool:
        """Every partition of this instance reached the end offset it had when the reader started."""
        return self.caught

    def _at_start_ends(self) -> bool:
        return all(self.next_offsets[partition] >= end for partition, end in self.start_ends.items())

    async def _reached_start_ends(self) -> bool:
        """Nothing fetched: whether the consumer stands at the start's end offsets (it skips transaction
        markers, which are never records, so ask it)."""
        for partition, end in self.start_ends.items():
            if self.next_offsets[partition] < end:
                standing = min(await self.consumer.position(partition), end)
                self.next_offsets[partition] = max(self.next_offsets[partition], standing)
        return self._at_start_ends()

    def _records(self, fetched: dict[Any, list[Any]]) -> Batch:
        source, clock = self.source, self.context.clock
        key_of, value_of, headers = source.key_deserializer, source.value_deserializer, source.with_headers
        records: Batch = []
        append = records.append
        for partition, messages in fetched.items():
            end = self.ends.get(partition)
            top = -math.inf  # the largest Kafka timestamp read from this partition now
            for message in messages:
                if end is not None and message.offset >= end:
                    break  # past the end seen at start: stop_at_end leaves it unread
                self.next_offsets[partition] = message.offset + 1
                ts = message.timestamp / 1000 if message.timestamp is not None and message.timestamp >= 0 else None
                if ts is not None and ts > top:
                    top = ts
                try:
                    key = None if message.key is None else key_of(message.key)
                    value = None if message.value is None else value_of(message.value)
                except Exception as exc:  # noqa: BLE001 - a user deserializer: any error follows on_error
                    self._undecodable(message, ts, exc)
                    continue
                if headers:
                    value = {"value": value, "headers": [(name, data) for name, data in message.headers]}
                append((key, value, clock.now() if ts is None else ts))
            if top > self.newest.get(partition, -math.inf):
                self.newest[partition] = top
        if self.ends:
            self._reached_ends(fetched)
        return records

    def event_time_progress(self) -> float | None:
        """The minimum over this instance's partitions of the largest event time read from each, so one
        partition that lags holds the watermark back. Partitions that have sent nothing yet, or have reached
        their end (``stop_at_end``), do not hold it back."""
        reading = [ts for partition, ts in self.newest.items() if partition not in self.done]
        return min(reading, default=None)

    def _reached_ends(self, fetched: dict[Any, list[Any]]) -> None:
        for partition in fetched:
            if partition not in self.done and self.next_offsets[partition] >= self.ends[partition]:
                self.done.add(partition)
                self.consumer.pause(partition)  # nothing past the end is wanted

    def _undecodable(self, message: Any, ts: float | None, exc: Exception) -> None:
        where = f"topic {message.topic!r} partition {message.partition} offset {message.offset}"
        error = f"{where}: {type(exc).__name__}: {exc}"
        if self.source.on_error == "fail":
            raise KafkaError(f"{self.what} cannot decode the record at {error}") from exc
        record = Record(message.key, message.value, ts)
        self.context.dead_letters.append(DeadLetter(self.context.node, self.context.index, record, error, exc))
        log.warning("record dead-lettered", task=self.context.node, instance=self.context.index, error=error)

    async def _mark_done(self) -> None:
        """With ``stop_at_end``: which partitions reached their end (the consumer also skips
        transaction markers, which are never records, so ask it where it stands)."""
        for partition, end in self.ends.items():
            if partition in self.done:
                continue
            standing = min(await self.consumer.position(partition), end)
            self.next_offsets[partition] = max(self.next_offsets[partition], standing)
            if standing >= end:
                self.done.add(partition)
                self.consumer.pause(partition)

    # -- checkpoints ----------------------------------------------------------------

    def position(self) -> list[list[Any]]:
        """``[[topic, partition, next offset], ...]``; empty before the first read (then the
        group's committed offsets or ``auto_offset_reset`` decide, as they would now)."""
        if self.consumer is None:
            return [[topic, partition, offset] for (topic, partition), offset in sorted(self.seek_to.items())]
        return [[p.topic, p.partition, offset] for p, offset in sorted(self.next_offsets.items())]

    async def seek(self, position: Any) -> None:
        self.seek_to = {(topic, partition): offset for topic, partition, offset in position}

    async def checkpoint_complete(self, epoch: int, position: Any) -> None:
        """Commit ``position`` to the group. A failed commit is logged, not raised: the checkpoint
        holds the offsets; the group's only serve a job started without one."""
        if self.source.group_id is None or not position:
            return
        aiokafka = require_aiokafka()
        offsets = {aiokafka.TopicPartition(t, p): aiokafka.structs.OffsetAndMetadata(o, "") for t, p, o in position}
        try:
            if self.consumer is not None and not self.closed:
                await self.consumer.commit(offsets)
            else:  # the source has ended and closed its consumer: the final checkpoint commits through another
                await self._commit_aside(offsets)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("kafka offsets not committed", task=self.context.node, epoch=epoch, error=repr(exc))

    async def _commit_aside(self, offsets: dict[Any, Any]) -> None:
        consumer = self.source.make_consumer(self.source.group_id)
        await consumer.start()
        try:
            consumer.assign(list(offsets))
            await consumer.commit(offsets)
        finally:
            with anyio.CancelScope(shield=True):
                await consumer.stop()

    async def aclose(self) -> None:
        self.closed = True
        if self.consumer is not None:
            with anyio.CancelScope(shield=True):
                await self.consumer.stop()
