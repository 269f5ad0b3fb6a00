"""Keyed state owned by the runtime, not by task attributes.

A task reaches it as ``self.state``. Because the runtime owns it, a task
restarted under ``on_error="restart"`` gets its state back, checkpoints
snapshot it, and a restore with a different parallelism splits it by key
with the same rule as ``SAME_KEY`` routing.

The ``StateStore`` seam is what the runtime needs of a store:
``checkpoint()``, ``restore(snapshot)``, ``partition(snapshot, n)`` and
``merge(parts)``; :class:`KeyedState` is the in-memory implementation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from streamlet.core.partition import partition_of


class StateStore(Protocol):
    """The seam between tasks' keyed state and checkpoints."""

    def checkpoint(self) -> Any:
        """A consistent, msgpack-able snapshot."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Replace the contents with a snapshot."""
        ...

    @staticmethod
    def partition(snapshot: Any, parts: int) -> list[Any]:
        """Split a snapshot by key into ``parts``."""
        ...

    @staticmethod
    def merge(parts: list[Any]) -> Any:
        """Join several snapshots into one."""
        ...


class KeyedState:
    """This instance's keyed values: ``get``, ``put``, ``delete``, ``items``.

    Example:
        >>> state = KeyedState()
        >>> state.put("a", state.get("a", 0) + 1)
        >>> list(state.items())
        [('a', 1)]
    """

    __slots__ = ("values",)

    def __init__(self, values: dict[Any, Any] | None = None) -> None:
        self.values: dict[Any, Any] = {} if values is None else values

    def get(self, key: Any, default: Any = None) -> Any:
        """The value stored for ``key``, or ``default``."""
        return self.values.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` for ``key`` (msgpack-able values only)."""
        self.values[key] = value

    def delete(self, key: Any) -> None:
        """Forget ``key``; no error when it is absent."""
        self.values.pop(key, None)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """This instance's ``(key, value)`` pairs."""
        return iter(list(self.values.items()))

    def __len__(self) -> int:
        return len(self.values)

    def checkpoint(self) -> list[list[Any]]:
        """A consistent copy of every ``[key, value]`` pair (msgpack-able)."""
        return [[key, value] for key, value in self.values.items()]

    def restore(self, snapshot: list[list[Any]]) -> None:
        """Replace the contents with :meth:`checkpoint`'s data."""
        self.values = {_hashable(key): value for key, value in snapshot}

    @staticmethod
    def partition(snapshot: list[list[Any]], parts: int) -> list[list[list[Any]]]:
        """Split a snapshot by key into ``parts`` (the ``SAME_KEY`` rule: part i goes to instance i)."""
        split: list[list[list[Any]]] = [[] for _ in range(parts)]
        for key, value in snapshot:
            split[partition_of(_hashable(key), parts)].append([key, value])
        return split

    @staticmethod
    def merge(parts: list[list[list[Any]]]) -> list[list[Any]]:
        """Join snapshots of several instances into one."""
        return [pair for part in parts for pair in part]


def _hashable(key: Any) -> Any:
    """msgpack gives tuples back as lists; keys must be hashable again."""
    if isinstance(key, list):
        return tuple(_hashable(item) for item in key)
    return key
