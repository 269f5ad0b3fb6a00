"""Keyed state owned by the runtime, not by task attributes.

A task reaches it as ``self.state``. Because the runtime owns it, a task
restarted under ``on_error="restart"`` gets its state back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


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
