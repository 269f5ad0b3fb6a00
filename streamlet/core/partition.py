"""How records are spread over the instances of a downstream node.

``SAME_KEY`` must send a key to the same instance in every process and every
run, so it hashes the msgpack encoding of the key with CRC-32, never Python's
salted :func:`hash`. The same rule splits keyed state for scale-out.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Callable
from typing import Any, TypeAlias

import msgpack

from streamlet.core.record import Record


class Partitioning(enum.Enum):
    """Built-in partitioning schemes."""

    ROUND_ROBIN = "round_robin"
    SAME_KEY = "same_key"
    BROADCAST = "broadcast"


ROUND_ROBIN = Partitioning.ROUND_ROBIN
SAME_KEY = Partitioning.SAME_KEY
BROADCAST = Partitioning.BROADCAST

PartitionFn: TypeAlias = Callable[[Record, int], int]
PartitionSpec: TypeAlias = "Partitioning | PartitionFn"


def stable_hash(key: Any) -> int:
    """A 32-bit hash of ``key`` that is the same in every process and run.

    Example:
        >>> stable_hash("user42") == stable_hash("user42")
        True
    """
    return zlib.crc32(msgpack.packb(key, use_bin_type=True))


def partition_of(key: Any, parts: int) -> int:
    """The index in ``range(parts)`` that ``SAME_KEY`` gives ``key``."""
    return stable_hash(key) % parts


class KeyPartitioner:
    """``SAME_KEY`` routing with a bounded per-key cache of the hash.

    Hashing costs a few hundred nanoseconds; a dict lookup about thirty, and
    stream keys repeat, so the answer is cached until the cache is full.
    """

    __slots__ = ("_limit", "cache", "parts")

    def __init__(self, parts: int, cache_limit: int = 1 << 17) -> None:
        self.parts = parts
        self.cache: dict[Any, int] = {}
        self._limit = cache_limit

    def __call__(self, key: Any) -> int:
        """The instance index for ``key``."""
        index = self.cache.get(key)
        if index is None:
            index = partition_of(key, self.parts)
            if len(self.cache) >= self._limit:
                self.cache.clear()  # keys drift; a fresh cache beats an LRU's per-hit cost
            self.cache[key] = index
        return index
