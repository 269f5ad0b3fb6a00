"""What msgpack can encode, and an error that names what it cannot.

Checkpoints, keyed state and batches between processes are msgpack. A value
of another type fails deep inside the packer with "can not serialize 'X'
object"; these helpers find that value again (on the failure path only, so
the happy path pays nothing) and say where it sits.
"""

from __future__ import annotations

from typing import Any

import msgpack

from streamlet.errors import EncodingError

ENCODABLE = "None, bool, int (64-bit), float, str, bytes, list, tuple and dict"

_SCALARS = (type(None), bool, float, str, bytes, bytearray)


def first_unencodable(value: Any, path: str = "") -> tuple[str, Any] | None:
    """``(path, value)`` of the first part of ``value`` msgpack cannot encode, or ``None`` when it all can."""
    if isinstance(value, _SCALARS):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else (path, value)
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = first_unencodable(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_unencodable(key, f"{path} key {key!r}") or first_unencodable(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    return path, value


def encoding_error(value: Any, where: str, what: str = "value") -> EncodingError:
    """The error for ``value`` (or a part of it) that cannot be encoded; ``where`` says what it belonged to."""
    found = first_unencodable(value)
    path, bad = found if found is not None else ("", value)
    at = f" at {path.strip()}" if path else ""
    kind = type(bad).__name__
    detail = f"the int {bad} does not fit in 64 bits" if isinstance(bad, int) else f"{kind} is not encodable"
    return EncodingError(f"{where}: the {what}{at} cannot be encoded: {detail} (use {ENCODABLE})", value_type=kind)


def pack(value: Any, where: str, what: str = "value") -> bytes:
    """``value`` as msgpack bytes, or an :class:`EncodingError` naming the part that cannot be encoded."""
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise encoding_error(value, where, what) from exc
    return packed


def hashable(key: Any) -> Any:
    """msgpack gives tuples back as lists; keys must be hashable again."""
    if isinstance(key, list):
        return tuple(hashable(item) for item in key)
    return key
