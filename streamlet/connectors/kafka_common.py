"""What the Kafka source and sink share: the aiokafka import, the error, default (de)serializers, metadata.

aiokafka is imported only when a connector is opened, so ``import streamlet``
works without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import anyio

from streamlet.errors import KafkaError

INSTALL_HINT = "the Kafka connectors need aiokafka: pip install 'streamlet[kafka]'"

Deserializer = Callable[[bytes], Any]
Serializer = Callable[[Any], bytes | None]


def require_aiokafka() -> ModuleType:
    """The ``aiokafka`` module, or a ``KafkaError`` naming the extra to install."""
    try:
        import aiokafka
    except ImportError as exc:
        raise KafkaError(INSTALL_HINT) from exc
    module: ModuleType = aiokafka
    return module


@contextmanager
def broker_errors(what: str) -> Iterator[None]:
    """Translate aiokafka's errors into a ``KafkaError`` that says who failed (the original is chained)."""
    errors = require_aiokafka().errors
    try:
        yield
    except errors.KafkaError as exc:
        raise KafkaError(f"{what}: {str(exc) or type(exc).__name__}") from exc  # aiokafka's str names the class


def decode_utf8(data: bytes) -> str:
    """The default deserializer of keys and values: UTF-8 text (invalid UTF-8 raises)."""
    return data.decode("utf-8")


def encode(value: Any) -> bytes | None:
    """The default serializer of keys and values: bytes as they are, ``str`` as UTF-8, ``None`` as
    ``None`` (a null key or a tombstone), anything else as compact JSON."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def servers(bootstrap_servers: str | Sequence[str]) -> str | list[str]:
    """``bootstrap_servers`` as aiokafka takes it."""
    return bootstrap_servers if isinstance(bootstrap_servers, str) else list(bootstrap_servers)


async def partitions_of(client: Any, topics: Sequence[str], what: str, wait: float) -> list[tuple[str, int]]:
    """The sorted ``(topic, partition)`` pairs of ``topics``; waits a while for topics just created.

    ``client`` is an aiokafka client (``consumer._client``): aiokafka offers no
    public async way to ask a consumer for a topic's partitions.
    """
    missing: list[str] = list(topics)
    with anyio.move_on_after(wait):
        while True:
            cluster = await client.fetch_all_metadata()
            found = {topic: cluster.partitions_for_topic(topic) for topic in topics}
            missing = [topic for topic, partitions in found.items() if not partitions]
            if not missing:
                return sorted((topic, partition) for topic, partitions in found.items() for partition in partitions)
            await anyio.sleep(0.2)
    raise KafkaError(f"{what}: topic {missing[0]!r} does not exist (waited {wait:g} s for it)")
