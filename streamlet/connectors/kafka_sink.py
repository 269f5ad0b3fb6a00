"""``KafkaSink``: records to a Kafka topic; idempotent, or transactional and exactly-once with checkpoints.

**Plain mode** uses an idempotent producer (``enable_idempotence=True``: a
retried send is never written twice). At each checkpoint barrier the sink
waits until everything sent so far is acknowledged, so with checkpoints the
output is at-least-once across crashes (a restore may send again what
followed the last checkpoint).

**Transactional mode** (``transactional=True``) is exactly-once for
``read_committed`` consumers. aiokafka cannot resume a transaction that a
crashed process left open (a new producer with the same transactional id
fences and aborts it), so the sink never keeps a transaction open across a
checkpoint. Instead:

1. ``write`` serializes records and stages them in a local file
   (``staging_dir/<transactional id>/<attempt>/``: each run of the job stages
   apart); ``prepare_commit(epoch)`` fsyncs that file as the epoch's.
2. ``commit(epoch)`` (the checkpoint is complete) produces every staged epoch
   up to ``epoch`` inside **one** transaction, together with a marker record
   ``(transactional id, epoch)`` on ``marker_topic`` partition 0, commits it,
   and only then deletes the staged files.
3. ``restore(point)`` after a crash looks only at what the run that took
   checkpoint ``point`` staged: epochs after ``point.epoch`` are dropped
   (their records are replayed by the sources). Epochs up to it whose files
   remain were completed but maybe not committed: the sink reads the markers
   (``read_committed``) and produces again exactly those epochs that have no
   committed marker. Another run's staging is never produced.

A crash *inside* ``commit`` leaves a transaction open with part of the
epoch: the restarted instance's producer (same transactional id) fences it,
the broker aborts it, so ``read_committed`` consumers never see it, and the
epoch (no committed marker) is produced again. This relies on the broker's
transaction isolation, which librdkafka's mock cluster used in the tests does
not implement.

Each sink instance has its own transactional id, the same in every run of
the job: ``f"streamlet.{job_id}.{node}.{index}"`` (``job_id`` from
``SinkContext``: ``local.<topology name>`` in-process, the cluster's own
name for the job there), or ``f"{transactional_id}-{index}"`` when a prefix
is given. Starting its producer fences every older incarnation, including a
stale run of the instance that still runs elsewhere. Give a prefix when two
deployments of one topology write through the same Kafka cluster.

Limits: records reach Kafka only when the checkpoint that covers them
completes (latency = checkpoint interval). The staging directory must be on
durable storage that the restarted instance sees again (local disk, same
machine): an instance restored elsewhere cannot redo an epoch whose commit
was cut short. The marker topic must exist (or be auto-created) with at least
one partition; it grows by one small record per checkpoint and sink instance
(``cleanup.policy=compact`` keeps one per instance). Without checkpoints a
transactional sink publishes everything in one transaction when the job ends.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog

from streamlet.connectors.kafka_common import Serializer, broker_errors, encode, require_aiokafka, servers
from streamlet.connectors.kafka_staging import StagedEpochs, StagedRecord, Staging
from streamlet.core.model.record import Record, Records
from streamlet.core.model.sinks import RestorePoint, Sink, SinkContext, SinkWriter
from streamlet.errors import KafkaError

log = structlog.get_logger("streamlet")

ABORT_TIMEOUT = 5.0  # seconds an aborting sink may spend closing its producer
MARKER_SCAN_TIMEOUT = 60.0  # seconds a restore may spend reading the commit markers


class KafkaSink(Sink):
    """Records to ``topic``: key and value through the serializers, ``ts`` as the Kafka timestamp.

    Args:
        topic: the topic to write to.
        bootstrap_servers: ``"host:port"`` or a list of them.
        transactional: exactly-once with checkpoints (see the module docstring); needs ``staging_dir``.
        key_serializer: ``key -> bytes | None``; default: bytes as they are, ``str`` as UTF-8,
            ``None`` as null, anything else as compact JSON.
        value_serializer: ``value -> bytes | None``; the same default as ``key_serializer``.
        headers: ``record -> [(name, bytes), ...]`` for each record's Kafka headers.
        staging_dir: where a transactional sink stages each epoch's records (durable local disk).
        transactional_id: prefix of the instances' transactional ids (default: from the job and sink name).
        marker_topic: where a transactional sink marks committed epochs (default ``f"{topic}.streamlet-commits"``).
        producer_options: more ``AIOKafkaProducer`` keyword arguments.
        consumer_options: more ``AIOKafkaConsumer`` keyword arguments for reading the markers.

    Example:
        >>> sink = KafkaSink("totals", "localhost:9092", transactional=True, staging_dir="kafka-staging")
    """

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str | Sequence[str],
        *,
        transactional: bool = False,
        key_serializer: Serializer = encode,
        value_serializer: Serializer = encode,
        headers: Callable[[Record], Sequence[tuple[str, bytes]]] | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        transactional_id: str | None = None,
        marker_topic: str | None = None,
        producer_options: dict[str, Any] | None = None,
        consumer_options: dict[str, Any] | None = None,
    ) -> None:
        if transactional and staging_dir is None:
            raise KafkaError(f"KafkaSink for topic {topic!r}: transactional=True needs a staging_dir")
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.transactional = transactional
        self.key_serializer = key_serializer
        self.value_serializer = value_serializer
        self.headers = headers
        self.staging_dir = None if staging_dir is None else Path(staging_dir)
        self.transactional_id = transactional_id
        self.marker_topic = marker_topic or f"{topic}.streamlet-commits"
        self.producer_options = dict(producer_options or {})
        self.consumer_options = dict(consumer_options or {})

    def exactly_once_with_checkpoints(self) -> bool:
        """Transactional: its transactions commit with the checkpoints."""
        return self.transactional

    def open(self, context: SinkContext) -> SinkWriter:
        """A writer for instance ``context.index``; it connects on first use."""
        require_aiokafka()
        what = f"sink '{context.node}' instance {context.index}"
        if self.transactional:
            return _TransactionalWriter(self, self.transactional_id_of(context), context.attempt, what)
        return _IdempotentWriter(self, what)

    def transactional_id_of(self, context: SinkContext) -> str:
        """The transactional id of instance ``context.index``: the same in every run of the job."""
        if self.transactional_id is not None:
            return f"{self.transactional_id}-{context.index}"
        return f"streamlet.{context.job_id}.{context.node}.{context.index}"

    def serialize(self, batch: Records) -> list[StagedRecord]:
        """``[key, value, timestamp_ms, headers]`` per record, as they will be produced."""
        key_of, value_of, headers_of = self.key_serializer, self.value_serializer, self.headers
        return [
            [
                key_of(record.key),
                value_of(record.value),
                None if record.ts is None else int(record.ts * 1000),
                [] if headers_of is None else [[name, data] for name, data in headers_of(record)],
            ]
            for record in batch
        ]

    def make_producer(self, **options: Any) -> Any:
        """An ``AIOKafkaProducer`` (not started) with this sink's settings."""
        aiokafka = require_aiokafka()
        settings = {"enable_idempotence": True, **self.producer_options, **options}
        return aiokafka.AIOKafkaProducer(bootstrap_servers=servers(self.bootstrap_servers), **settings)


async def _send(producer: Any, topic: str, record: StagedRecord) -> Any:
    key, value, timestamp_ms, headers = record
    return await producer.send(
        topic, value=value, key=key, timestamp_ms=timestamp_ms, headers=[(name, data) for name, data in headers]
    )


async def _started(producer: Any) -> Any:
    """``producer``, started; stopped again if starting fails (an unstopped one leaks its connections)."""
    try:
        await producer.start()
    except BaseException:
        await _stop(producer)
        raise
    return producer


async def _stop(producer: Any) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT):
        await producer.stop()


class _IdempotentWriter(SinkWriter):
    """Sends as records come; a barrier waits for every acknowledgement (at-least-once)."""

    def __init__(self, sink: KafkaSink, what: str) -> None:
        self.sink = sink
        self.what = what
        self.producer: Any = None
        self.pending: list[asyncio.Future[Any]] = []

    async def write(self, batch: Records) -> None:
        with broker_errors(self.what):
            if self.producer is None:
                self.producer = await _started(self.sink.make_producer())
            for record in self.sink.serialize(batch):
                self.pending.append(await _send(self.producer, self.sink.topic, record))
        self._check()

    def _check(self) -> None:
        """Raise the first failed send; forget the acknowledged ones."""
        still = []
        for future in self.pending:
            if not future.done():
                still.append(future)
            elif future.exception() is not None:
                error = future.exception()
                raise KafkaError(f"{self.what} could not send to topic {self.sink.topic!r}: {error!r}") from error
        self.pending = still

    async def _flush(self) -> None:
        if self.producer is not None:
            with broker_errors(self.what):
                await self.producer.flush()
            if self.pending:
                await asyncio.wait(self.pending)
            self._check()

    async def prepare_commit(self, epoch: int) -> None:
        await self._flush()

    async def close(self) -> None:
        await self._flush()
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None

    async def abort(self) -> None:
        if self.producer is not None:
            await _stop(self.producer)
            self.producer = None


class _TransactionalWriter(SinkWriter):
    """Stages per epoch; one transaction per completed checkpoint (see the module docstring)."""

    def __init__(self, sink: KafkaSink, transactional_id: str, attempt: str, what: str) -> None:
        assert sink.staging_dir is not None
        self.sink = sink
        self.what = f"{what} (transactional id {transactional_id!r})"
        self.transactional_id = transactional_id
        self.attempt = attempt
        self.staging = Staging(sink.staging_dir, transactional_id, attempt)
        self.producer: Any = None
        self.recovering: StagedEpochs | None = None  # a restore left completed epochs there to check and redo
        self.recover_through = -1

    def write(self, batch: Records) -> None:
        self.staging.append(self.sink.serialize(batch))

    async def prepare_commit(self, epoch: int) -> None:
        await anyio.to_thread.run_sync(self.staging.prepare, epoch)

    async def commit(self, epoch: int) -> None:
        with broker_errors(self.what):
            await self._ready()
            await self._publish(self.staging, [e for e in self.staging.epochs() if e <= epoch], epoch)

    def restore(self, point: RestorePoint | None) -> None:
        if point is None or point.attempt is None:
            return  # nothing staged belongs to a completed checkpoint
        restored = self.staging.of_attempt(point.attempt)
        staged = restored.epochs()
        restored.remove([e for e in staged if e > point.epoch])  # never completed: the sources replay these
        if point.attempt != self.attempt:
            restored.discard_inprogress()
        if any(e <= point.epoch for e in staged):
            self.recovering, self.recover_through = restored, point.epoch
        elif point.attempt != self.attempt:
            restored.remove_if_empty()

    async def close(self) -> None:
        if self.staging.staged_bytes:  # a job without checkpoints: everything it wrote, in one transaction
            with broker_errors(self.what):
                await self._ready()
                await self._in_transaction(self.staging.read_current(), marker=None)
        self.staging.close()
        self.staging.discard_inprogress()
        self.staging.remove_if_empty()
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None

    async def abort(self) -> None:
        self.staging.close()
        self.staging.discard_inprogress()  # in no checkpoint: nothing will produce it
        self.staging.remove_if_empty()  # staged epochs stay for a restore to judge
        if self.producer is not None:
            await _stop(self.producer)
            self.producer = None

    # -- transactions -------------------------------------------------------------

    async def _ready(self) -> None:
        """Start the producer (fencing older incarnations), then redo what a restore left to redo."""
        if self.producer is None:
            self.producer = await _started(self.sink.make_producer(transactional_id=self.transactional_id))
        if self.recovering is not None:
            await self._recover(self.recovering)
            self.recovering = None

    async def _recover(self, restored: StagedEpochs) -> None:
        """Produce the completed epochs ``restored`` holds that have no committed marker yet."""
        staged = [e for e in restored.epochs() if e <= self.recover_through]
        marked = await self._last_marked()
        restored.remove([e for e in staged if e <= marked])  # committed before the crash
        redo = [e for e in staged if e > marked]
        log.info("kafka sink recovering", transactional_id=self.transactional_id, committed=marked, redo=redo)
        if redo:
            await self._publish(restored, redo, redo[-1])
        if restored.directory != self.staging.directory:
            restored.remove_if_empty()

    async def _publish(self, staged: StagedEpochs, epochs: list[int], marker: int) -> None:
        if not epochs:
            return
        if any(staged.path(epoch).stat().st_size for epoch in epochs):
            await self._in_transaction((r for epoch in epochs for r in staged.read(epoch)), marker)
        staged.remove(epochs)

    async def _in_transaction(self, records: Iterable[StagedRecord], marker: int | None) -> None:
        producer, topic = self.producer, self.sink.topic
        await producer.begin_transaction()
        try:
            for record in records:
                await _send(producer, topic, record)
            if marker is not None:
                await producer.send(
                    self.sink.marker_topic, value=str(marker).encode(), key=self.transactional_id.encode(), partition=0
                )
            await producer.commit_transaction()
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT):
                try:
                    await producer.abort_transaction()
                except Exception as exc:  # noqa: BLE001 - the next incarnation fences it anyway
                    log.warning(
                        "kafka transaction not aborted", transactional_id=self.transactional_id, error=repr(exc)
                    )
            raise

    async def _last_marked(self) -> int:
        """The newest epoch this transactional id committed, by its markers (-1: none)."""
        aiokafka = require_aiokafka()
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=servers(self.sink.bootstrap_servers),
            isolation_level="read_committed",
            enable_auto_commit=False,
            **self.sink.consumer_options,
        )
        await consumer.start()
        try:
            return await _scan_markers(consumer, self.sink.marker_topic, self.transactional_id.encode())
        finally:
            with anyio.CancelScope(shield=True):
                await consumer.stop()


async def _scan_markers(consumer: Any, topic: str, key: bytes) -> int:
    aiokafka = require_aiokafka()
    cluster = await consumer._client.fetch_all_metadata()  # no public async partitions lookup on a consumer
    if not cluster.partitions_for_topic(topic):
        return -1  # no marker was ever written
    partition = aiokafka.TopicPartition(topic, 0)
    consumer.assign([partition])
    await consumer.seek_to_beginning(partition)
    end = (await consumer.end_offsets([partition]))[partition]
    newest = -1
    with anyio.move_on_after(MARKER_SCAN_TIMEOUT) as scope:
        while await consumer.position(partition) < end:
            fetched = await consumer.getmany(partition, timeout_ms=500)
            for message in fetched.get(partition, []):
                if message.key == key and message.offset < end:
                    newest = max(newest, int(message.value))
    if scope.cancelled_caught:  # guessing would risk a duplicate or a loss: stop instead
        raise KafkaError(f"could not read the commit markers in {topic!r} within {MARKER_SCAN_TIMEOUT:g} s")
    return newest
