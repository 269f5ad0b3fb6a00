"""Keyed state owned by the runtime, not by task attributes.

A task reaches it as ``self.state``. Because the runtime owns it, a task
restarted under ``on_error="restart"`` gets its state back, checkpoints
snapshot it, and a restore with a different parallelism splits it by key
with the same rule as ``SAME_KEY`` routing.

The ``StateStore`` seam (``core.model.state``) is what tasks and the
runtime need of a store; :class:`KeyedState` is the in-memory implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.model.segments import DEFAULT_SEGMENTS, SegmentTable
from streamlet.core.state.changelog import values_of

#: A keyed state's checkpoint: the in-memory state's packed map, or RocksDB's changelog (``core.state.changelog``).
StateSnapshot = bytes | dict[str, Any]


class KeyedState:
    """This instance's keyed values: ``get``, ``put``, ``delete``, ``items``.

    Example:
        >>> state = KeyedState()
        >>> state.put("a", state.get("a", 0) + 1)
        >>> list(state.items())
        [('a', 1)]
    """

    __slots__ = ("values",)

    #: Seconds an entry lives after its last write; ``None``: for ever (``ExpiringState`` sets it). Code that
    #: reads and writes ``values`` directly for speed must go through get/put when it is set.
    ttl: float | None = None

    def __init__(self, values: dict[Any, Any] | None = None) -> None:
        self.values: dict[Any, Any] = {} if values is None else values

    def get(self, key: Any, default: Any = None) -> Any:
        """The value stored for ``key``, or ``default``."""
        return self.values.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` for ``key`` (encodable values only; a restore gives them back with the same types)."""
        self.values[key] = value

    def delete(self, key: Any) -> None:
        """Forget ``key``; no error when it is absent."""
        self.values.pop(key, None)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """This instance's ``(key, value)`` pairs."""
        return iter(list(self.values.items()))

    def __len__(self) -> int:
        return len(self.values)

    def checkpoint(self) -> StateSnapshot:
        """A consistent snapshot: the key/value map as bytes (:func:`~streamlet.core.model.encoding.packb`).

        Packed at once in C: one object however many keys, so a snapshot
        neither slows the event loop down with allocations nor feeds the
        garbage collector, and later updates cannot change it. Only state
        holding tuples is packed again with its tuples encoded in Python.
        """
        return pack_exact(self.values, "keyed state")

    def checkpoint_increment(self) -> Any:
        """What a checkpoint keeps of this state: here the whole map (:meth:`checkpoint`); a backend that
        checkpoints incrementally returns what changed since its previous checkpoint."""
        return self.checkpoint()

    def restore(self, snapshot: StateSnapshot) -> None:
        """Replace the contents with :meth:`checkpoint`'s data (of either backend)."""
        self.values = _unpack(snapshot)

    @staticmethod
    def partition(snapshot: StateSnapshot, parts: int, owner: Callable[[Any], int] | None = None) -> list[bytes]:
        """Split a snapshot by key into ``parts``: part i holds the keys ``owner`` gives instance i
        (default: the ``SAME_KEY`` rule for ``parts`` instances, see ``core.model.segments``)."""
        owner = owner or default_owner(parts)
        split: list[dict[Any, Any]] = [{} for _ in range(parts)]
        for key, value in _unpack(snapshot).items():
            split[owner(key)][key] = value
        return [pack_exact(part, "keyed state") for part in split]

    @staticmethod
    def merge(parts: list[StateSnapshot]) -> bytes:
        """Join snapshots of several instances into one."""
        merged: dict[Any, Any] = {}
        for part in parts:
            merged.update(_unpack(part))
        return pack_exact(merged, "keyed state")


def default_owner(parts: int) -> Callable[[Any], int]:
    """Which of ``parts`` instances owns a key by default: contiguous ranges of the default segments."""
    return SegmentTable.contiguous(DEFAULT_SEGMENTS, parts).owner_function()


def _unpack(snapshot: StateSnapshot) -> dict[Any, Any]:
    """A snapshot's map: keys and values with the types they were put with (tuple keys are tuples again).
    Either backend's: the in-memory state's packed map or RocksDB's changelog (``core.state.changelog``)."""
    if isinstance(snapshot, dict):
        return values_of(snapshot)
    values = unpackb(snapshot)
    if type(values) is not dict:
        raise ValueError(f"a keyed state snapshot is a map, not {type(values).__name__}")
    return values
