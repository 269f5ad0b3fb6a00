"""How records are spread over the instances of a downstream node.

``SAME_KEY`` must send a key to the same instance in every process and every
run, so it hashes the msgpack encoding of the key with CRC-32, never Python's
salted :func:`hash`. The same rule splits keyed state for scale-out.
"""

from __future__ import annotations

import enum
import threading
import zlib
from collections.abc import Callable
from typing import Any, TypeAlias

import msgpack

from streamlet.core.model.encoding import pack
from streamlet.core.model.record import Record


class Partitioning(enum.Enum):
    """Built-in partitioning schemes."""

    ROUND_ROBIN = "round_robin"
    SAME_KEY = "same_key"
    BROADCAST = "broadcast"
    SESSION_TABLE = "session_table"


ROUND_ROBIN = Partitioning.ROUND_ROBIN
SAME_KEY = Partitioning.SAME_KEY
BROADCAST = Partitioning.BROADCAST
#: ``SAME_KEY`` routing whose senders also count each key segment's records: the load the session-table
#: balancer reads to move segments between instances (SpeedStream); a key's records still all go to one
#: instance, in order.
SESSION_TABLE = Partitioning.SESSION_TABLE
KEYED = frozenset({SAME_KEY, SESSION_TABLE})  # partitionings that send each key to the instance owning its segment

PartitionFn: TypeAlias = Callable[[Record, int], int]
PartitionSpec: TypeAlias = "Partitioning | PartitionFn"


def stable_hash(key: Any) -> int:
    """A 32-bit hash of ``key`` that is the same in every process and run.

    Keys that Python holds equal hash the same (``1``, ``1.0`` and ``True``;
    a tuple and the list msgpack turns it into), because they are the same
    key to a task's state.

    Example:
        >>> stable_hash("user42") == stable_hash("user42")
        True
        >>> stable_hash(1) == stable_hash(1.0) == stable_hash(True)
        True
    """
    kind = type(key)
    if kind is str or kind is int or kind is bytes:  # already canonical: one reused packer, no wrapper
        try:
            return zlib.crc32(_packer().pack(key))
        except (OverflowError, ValueError):
            pass  # an int msgpack cannot hold: the general path says so, naming it
    return zlib.crc32(pack(_canonical(key), "SAME_KEY partitioning", "key"))


_LOCAL = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's packer (``msgpack.packb`` builds one per call: most of the cost of hashing a short key)."""
    try:
        packer: msgpack.Packer = _LOCAL.packer
    except AttributeError:
        packer = _LOCAL.packer = msgpack.Packer(use_bin_type=True)
    return packer


def _canonical(key: Any) -> Any:
    kind = type(key)
    if kind is bool:
        return int(key)
    if kind is float and key.is_integer() and -(2**63) <= key < 2**64:  # 1e20 has no int twin that encodes
        return int(key)
    if kind is tuple or kind is list:
        return [_canonical(item) for item in key]
    return key


def partition_of(key: Any, parts: int) -> int:
    """The index in ``range(parts)`` that ``SAME_KEY`` gives ``key``."""
    return stable_hash(key) % parts
