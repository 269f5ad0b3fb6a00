"""Plain aiokafka producing and consuming for the Kafka tests: what the connectors are checked against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

CHECK_CRCS_OFF = {"check_crcs": False}  # the mock broker writes transaction markers with CRC 0


@dataclass(frozen=True)
class Message:
    """One record as written to or read from Kafka."""

    key: bytes | None
    value: bytes | None
    partition: int = 0
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes], ...] = field(default=())
    offset: int = -1


async def produce(bootstrap: str, topic: str, messages: list[Message]) -> None:
    """Write ``messages`` in order, each to its partition, and wait for every acknowledgement."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for message in messages:
            await producer.send(
                topic,
                value=message.value,
                key=message.key,
                partition=message.partition,
                timestamp_ms=message.timestamp_ms,
                headers=list(message.headers),
            )
        await producer.flush()
    finally:
        await producer.stop()


async def consume(bootstrap: str, topic: str, isolation_level: str = "read_committed") -> list[Message]:
    """Everything in ``topic`` now, partition by partition in offset order."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level=isolation_level, enable_auto_commit=False, **CHECK_CRCS_OFF
    )
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()
        partitions = [TopicPartition(topic, p) for p in sorted(cluster.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        read: dict[int, list[Message]] = {p.partition: [] for p in partitions}
        with anyio.fail_after(20):
            while [p for p in partitions if await consumer.position(p) < ends[p]]:
                for partition, records in (await consumer.getmany(timeout_ms=200)).items():
                    read[partition.partition] += [_message(record) for record in records]
        return [message for p in sorted(read) for message in read[p]]
    finally:
        await consumer.stop()


def _message(record: Any) -> Message:
    return Message(
        record.key, record.value, record.partition, record.timestamp, tuple(record.headers or ()), record.offset
    )


async def committed(bootstrap: str, group_id: str, topic: str, partitions: int) -> list[int | None]:
    """The group's committed offset of each partition of ``topic`` (``None``: never committed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False)
    await consumer.start()
    try:
        return [await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        await consumer.stop()


async def commit(bootstrap: str, group_id: str, topic: str, offsets: list[int]) -> None:
    """Commit ``offsets`` (one per partition of ``topic``) for ``group_id``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(len(offsets))]
        consumer.assign(partitions)
        await consumer.commit({p: OffsetAndMetadata(offset, "") for p, offset in zip(partitions, offsets, strict=True)})
    finally:
        await consumer.stop()
