"""How values are encoded: exactly (state, checkpoints, frames), and what cannot be.

Keyed state, checkpoints and batches between processes are msgpack, through
:func:`packb` and :func:`unpackb`, under which a value comes back with the
types it had (never pickle):

* ``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``, ``bytes``,
  ``list`` and ``dict`` are msgpack's own types;
* a ``tuple`` is the extension type :data:`TUPLE_EXT`, its payload the
  items as a msgpack array encoded the same way, so tuples stay tuples also
  nested, inside lists and as (parts of) dict keys;
* a dict key may be any of these that is hashable (``int``, ``float``,
  ``tuple``, ``str``, ``bytes``, ``None``, ``bool``);
* subclasses are encoded as their base type (an ``IntEnum`` as an ``int``,
  a ``namedtuple`` as a tuple, a ``defaultdict`` as a dict), ``bytearray``
  and ``memoryview`` as ``bytes``, as msgpack always did.

Decoding refuses an extension type other than :data:`TUPLE_EXT` with
:class:`ExtensionError`.

Speed: msgpack hands a tuple to Python (its ``default``) only under
``strict_types``, and doing that for every tuple costs a few microseconds
each. So :func:`packb` first packs in C with a ``default`` that stops at the
first tuple: a value without tuples (the common case) is packed once, at
msgpack's own speed, into the same bytes plain msgpack gives. Only a value
that holds a tuple is packed again, with each tuple encoded in Python
(about 1 µs per tuple here).

A value of another type fails deep inside the packer with "can not
serialize 'X' object"; :func:`encoding_error` finds that value again (on the
failure path only, so the happy path pays nothing) and says where it sits.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

from streamlet.errors import EncodingError

ENCODABLE = "None, bool, int (64-bit), float, str, bytes, list, tuple and dict"

MAX_TUPLE_DEPTH = 32
"""How deep tuples may nest inside tuples (through any containers).

Each level is a nested decode in msgpack's C code with a ~40 KB context on
the C stack: unbounded, a crafted frame of a few kilobytes would overflow the
stack and crash the process. Encoding refuses what decoding would.
"""

_SCALARS = (type(None), bool, float, str, bytes, bytearray)


def first_unencodable(value: Any, path: str = "", tuples: int = 0) -> tuple[str, Any] | None:
    """``(path, value)`` of the first part of ``value`` that cannot be encoded, or ``None`` when it all can.

    ``tuples`` is how many tuples ``value`` sits in (see :data:`MAX_TUPLE_DEPTH`).
    """
    if isinstance(value, _SCALARS):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else (path, value)
    if isinstance(value, list | tuple):
        if isinstance(value, tuple):
            tuples += 1
            if tuples > MAX_TUPLE_DEPTH:
                return path, value
        for index, item in enumerate(value):
            found = first_unencodable(item, f"{path}[{index}]", tuples)
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_unencodable(key, f"{path} key {key!r}", tuples) or first_unencodable(
                item, f"{path}[{key!r}]", tuples
            )
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
    if isinstance(bad, int):
        detail = f"the int {bad} does not fit in 64 bits"
    elif isinstance(bad, tuple):
        detail = f"tuples nest more than {MAX_TUPLE_DEPTH} deep"
    else:
        detail = f"{kind} is not encodable"
    return EncodingError(f"{where}: the {what}{at} cannot be encoded: {detail} (use {ENCODABLE})", value_type=kind)


def pack(value: Any, where: str, what: str = "value") -> bytes:
    """``value`` as plain msgpack bytes (a tuple as an array), or an :class:`EncodingError` naming the bad part.

    Not for data that is decoded again (use :func:`pack_exact`): partitioning
    hashes these bytes, where a tuple and a list must hash the same.
    """
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise encoding_error(value, where, what) from exc
    return packed


# -- exact round trips -----------------------------------------------------------

TUPLE_EXT = 1
"""The msgpack extension type code of a tuple; its payload is the tuple's items as an array."""


class ExtensionError(ValueError):
    """Encoded data holds a msgpack extension type that is not :data:`TUPLE_EXT`, or a malformed tuple."""


class _TupleFound(Exception):
    """Raised by the first packing attempt at the first tuple: pack again, the exact way."""


def _base_type(value: Any) -> Any:
    """A subclass instance as its base type (msgpack's ``strict_types`` hands them to ``default``)."""
    if isinstance(value, int):  # bool cannot be subclassed: msgpack packs every bool itself
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def _stop_at_tuples(value: Any) -> Any:
    if isinstance(value, tuple):
        raise _TupleFound
    return _base_type(value)


class _TuplePacker:
    """A ``default`` that encodes tuples as :data:`TUPLE_EXT`, for one :func:`packb` call.

    A tuple's payload is packed by a packer of its nesting depth: a packer
    is busy while its ``default`` runs, so a nested tuple needs another one,
    and reusing them per depth saves making a packer per tuple (a third of
    the cost). One instance per call, so threads never share one.
    """

    __slots__ = ("depth", "packers")

    def __init__(self) -> None:
        self.packers: list[msgpack.Packer] = []
        self.depth = 0

    def default(self, value: Any) -> Any:
        if not isinstance(value, tuple):
            return _base_type(value)
        depth = self.depth
        if depth == MAX_TUPLE_DEPTH:
            raise ValueError(f"tuples nest more than {MAX_TUPLE_DEPTH} deep")
        if depth == len(self.packers):
            self.packers.append(msgpack.Packer(use_bin_type=True, strict_types=True, default=self.default))
        self.depth = depth + 1
        try:
            return msgpack.ExtType(TUPLE_EXT, self.packers[depth].pack(list(value)))
        finally:
            self.depth = depth


def packb(value: Any) -> bytes:
    """``value`` as msgpack bytes that :func:`unpackb` turns back into an equal value of the same types.

    Raises what msgpack raises (``TypeError``, ``ValueError``,
    ``OverflowError``) for a value it cannot encode; :func:`pack_exact`
    names the part instead.
    """
    try:
        fast: bytes = msgpack.packb(value, use_bin_type=True, strict_types=True, default=_stop_at_tuples)
    except _TupleFound:
        pass
    else:
        return fast
    exact: bytes = msgpack.packb(value, use_bin_type=True, strict_types=True, default=_TuplePacker().default)
    return exact


def pack_exact(value: Any, where: str, what: str = "value") -> bytes:
    """:func:`packb`, or an :class:`EncodingError` naming the part of ``value`` that cannot be encoded."""
    try:
        return packb(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise encoding_error(value, where, what) from exc


_nesting = threading.local()  # how many tuples this thread is decoding inside each other


def _ext_hook(code: int, data: bytes) -> tuple[Any, ...]:
    if code != TUPLE_EXT:
        raise ExtensionError(f"msgpack extension type {code} is not allowed")
    depth: int = getattr(_nesting, "depth", 0)
    if depth == MAX_TUPLE_DEPTH:
        raise ExtensionError(f"tuples nest more than {MAX_TUPLE_DEPTH} deep")
    _nesting.depth = depth + 1
    try:
        items = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True, ext_hook=_ext_hook)
    finally:
        _nesting.depth = depth
    if type(items) is not list:
        raise ExtensionError(f"malformed tuple (extension type {TUPLE_EXT})")
    return tuple(items)


def unpackb(data: bytes) -> Any:
    """Bytes from :func:`packb` back to the value, types and all.

    Map keys may be any hashable type :func:`packb` writes (an array as a
    key is refused: msgpack makes it a list, which is not hashable). Sizes
    are bounded by the data's length, as msgpack does by default, and tuples
    nest at most :data:`MAX_TUPLE_DEPTH` deep. Raises :class:`ExtensionError`
    for an extension type other than a tuple, for tuples nested deeper and
    msgpack's errors (``ValueError`` and its subclasses, ``TypeError``) for
    malformed data; nothing is ever unpickled.
    """
    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True, ext_hook=_ext_hook)


def hashable(key: Any) -> Any:
    """A key read back from plain msgpack (lists where it had tuples) made hashable again.

    What :func:`unpackb` gives needs none of this (it is then a no-op).
    """
    if isinstance(key, list):
        return tuple(hashable(item) for item in key)
    return key
