"""A value kept as it is now, to be put back after a failed call changed it (``core.state.undo``, ``reduce``).

Immutable values are kept as they are; anything else is packed with the
state codec (deep-copied when it cannot be encoded), so a list or dict that
the failed call changed in place comes back as it was.

Example:
    >>> counts = [1, 2]
    >>> kept = keep(counts)
    >>> counts.append(3)
    >>> put_back(kept)
    [1, 2]
"""

from __future__ import annotations

import copy
from typing import Any

from streamlet.core.model.encoding import packb, unpackb

IMMUTABLE = frozenset({int, float, str, bytes, bool, complex, type(None)})
"""Types whose values nothing can change in place: kept by reference."""


class _Packed:
    """A value that could change in place, packed (or deep-copied when the codec refuses it)."""

    __slots__ = ("copied", "packed")

    def __init__(self, value: Any) -> None:
        try:
            self.packed: bytes | None = packb(value)
            self.copied: Any = None
        except (TypeError, ValueError, OverflowError):  # not encodable (no checkpoint asked for it)
            self.packed, self.copied = None, copy.deepcopy(value)

    def value(self) -> Any:
        return unpackb(self.packed) if self.packed is not None else copy.deepcopy(self.copied)


def keep(value: Any) -> Any:
    """What to keep of ``value`` to put it back later (itself when it cannot change)."""
    kind = type(value)
    if kind in IMMUTABLE or (kind is tuple and all(type(item) in IMMUTABLE for item in value)):
        return value
    return _Packed(value)


def put_back(kept: Any) -> Any:
    """The value :func:`keep` kept, as it was then."""
    return kept.value() if type(kept) is _Packed else kept


def put_back_into(current: Any, kept: Any) -> Any:
    """The value :func:`keep` kept from ``current``, written back into ``current`` itself where it can be
    (a list's items, a dict's entries, through a tuple's items): a record emitted before the failed call may
    hold that very object, and must not show what the call changed in place. Returns the value to hold."""
    value = put_back(kept)
    _write_back(current, value)
    return current if type(current) in (list, dict, tuple) and type(value) is type(current) else value


def _write_back(current: Any, value: Any) -> None:
    if type(current) is not type(value):
        return
    if type(current) is list:
        current[:] = value
    elif type(current) is dict:
        current.clear()
        current.update(value)
    elif type(current) is tuple and len(current) == len(value):
        for inner, was in zip(current, value, strict=True):
            _write_back(inner, was)
