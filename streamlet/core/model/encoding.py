"""How values are encoded: exactly (state, checkpoints, frames), and what cannot be.

Keyed state, checkpoints and batches between processes are msgpack, through
:func:`packb` and :func:`unpackb`, under which a value comes back with the
types it had (never pickle):

* ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list`` and
  ``dict`` are msgpack's own types, but for an ``int`` past 64 bits (past
  what msgpack's integers hold: below -2^63 or from 2^64): that is extension
  type :data:`BIG_INT_EXT`, its payload the int's two's-complement bytes,
  big-endian, as few as hold it. A sum or a product of Python ints passes
  64 bits without a word, so state, checkpoints and frames keep it exactly;
* a ``tuple`` is an array whose first item is the *tuple marker*, extension
  type :data:`TUPLE_EXT` with an empty payload, followed by the tuple's
  items: ``(1, "a")`` is ``[ExtType(1, b""), 1, "a"]``. So tuples stay
  tuples also nested, inside lists and as (parts of) dict keys;
* a dict key may be any of these that is hashable (``int``, ``float``,
  ``tuple``, ``str``, ``bytes``, ``None``, ``bool``);
* subclasses are encoded as their base type (an ``IntEnum`` as an ``int``,
  a ``namedtuple`` as a tuple, a ``defaultdict`` as a dict), ``bytearray``
  and ``memoryview`` as ``bytes``, as msgpack always did.

Decoding refuses, with :class:`ExtensionError`, every other extension type,
a tuple marker anywhere but first in an array, and a big int's payload that
is empty or holds an int msgpack's own integers hold (so every int has one
encoding, and partitioning hashes equal keys alike).

Why a marker and not an extension whose payload is the packed items: that
payload would be packed and unpacked by a nested msgpack call per tuple,
which costs 2-4 times as much here, and each nested decode holds a ~40 KB
context on the C stack, so a crafted frame of tuples nested a few thousand
deep would crash the process. With the marker a tuple is an ordinary array
to msgpack, under its own nesting limit.

Speed: msgpack hands a tuple to Python (its ``default``) only under
``strict_types``; doing that for every value would cost microseconds per
record. So :func:`packb` first packs in C with a ``default`` that stops at
the first tuple: a value without tuples (the common case) is packed once,
at msgpack's own speed, into the same bytes plain msgpack gives. Only a
value that holds a tuple is packed again, each tuple turned into its
marked list in Python (~0.3 µs a tuple here). Decoding likewise: a first
pass stops at the first tuple marker, and only data holding tuples is
decoded again with a hook on every array (~0.4 µs a tuple).

A value of another type fails deep inside the packer with "can not
serialize 'X' object"; :func:`encoding_error` finds that value again (on the
failure path only, so the happy path pays nothing) and says where it sits.
"""

from __future__ import annotations

from typing import Any

import msgpack

from streamlet.errors import EncodingError

ENCODABLE = "None, bool, int, float, str, bytes, list, tuple and dict"

_SCALARS = (type(None), bool, int, float, str, bytes, bytearray)


def first_unencodable(value: Any, path: str = "") -> tuple[str, Any] | None:
    """``(path, value)`` of the first part of ``value`` msgpack cannot encode, or ``None`` when it all can."""
    if isinstance(value, _SCALARS):
        return None
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
    return EncodingError(
        f"{where}: the {what}{at} cannot be encoded: {kind} is not encodable (use {ENCODABLE})", value_type=kind
    )


def pack(value: Any, where: str, what: str = "value") -> bytes:
    """``value`` as plain msgpack bytes (a tuple as an array), or an :class:`EncodingError` naming the bad part.

    Not for data that is decoded again (use :func:`pack_exact`): partitioning
    hashes these bytes, where a tuple and a list must hash the same.
    """
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True, default=_big_int)
    except (TypeError, ValueError, OverflowError) as exc:
        raise encoding_error(value, where, what) from exc
    return packed


# -- exact round trips -----------------------------------------------------------

TUPLE_EXT = 1
"""The msgpack extension type code of the tuple marker (its payload is empty)."""

BIG_INT_EXT = 2
"""The msgpack extension type code of an int past 64 bits (its payload: two's complement, big-endian)."""

_MARKER = msgpack.ExtType(TUPLE_EXT, b"")
_INT_RANGE = range(-(2**63), 2**64)  # what msgpack's own integers hold


def _big_int(value: Any) -> Any:
    """``default`` for an int msgpack's integers do not hold (msgpack hands it over on overflow)."""
    if isinstance(value, int) and value not in _INT_RANGE:
        return msgpack.ExtType(BIG_INT_EXT, value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True))
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def _read_big_int(data: bytes) -> int:
    """A big int's payload back to the int; an :class:`ExtensionError` for one no encoder writes."""
    value = int.from_bytes(data, "big", signed=True)
    if not data or value in _INT_RANGE or len(data) != value.bit_length() // 8 + 1:
        raise ExtensionError(f"malformed big int (extension type {BIG_INT_EXT} with {len(data)} bytes)")
    return value


class ExtensionError(ValueError):
    """Encoded data holds a msgpack extension type that is not the tuple marker, or a marker out of place."""


class _TupleFound(Exception):
    """Raised by a first pass at the first tuple (or tuple marker): do it again, the exact way."""


def _base_type(value: Any) -> Any:
    """A subclass instance as its base type (msgpack's ``strict_types`` hands them to ``default``)."""
    # The base type's own method copies the data, as msgpack packs it; int(value) would call an override.
    if isinstance(value, int):  # bool cannot be subclassed: msgpack packs every bool itself
        number = int.__int__(value)
        return number if number in _INT_RANGE else _big_int(number)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
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


def _marked(value: Any) -> Any:
    """``default`` of the second pass: a tuple as its marked list (msgpack then packs its items itself)."""
    if isinstance(value, tuple):
        return [_MARKER, *value]
    return _base_type(value)


def packb(value: Any) -> bytes:
    """``value`` as msgpack bytes that :func:`unpackb` turns back into an equal value of the same types.

    Raises what msgpack raises (``TypeError``, ``ValueError``) for a value
    it cannot encode; :func:`pack_exact`
    names the part instead.
    """
    try:
        fast: bytes = msgpack.packb(value, use_bin_type=True, strict_types=True, default=_stop_at_tuples)
    except _TupleFound:
        pass
    else:
        return fast
    exact: bytes = msgpack.packb(value, use_bin_type=True, strict_types=True, default=_marked)
    return exact


def pack_exact(value: Any, where: str, what: str = "value") -> bytes:
    """:func:`packb`, or an :class:`EncodingError` naming the part of ``value`` that cannot be encoded."""
    try:
        return packb(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise encoding_error(value, where, what) from exc


def _unknown(code: int, data: bytes) -> ExtensionError:
    if code == TUPLE_EXT:
        return ExtensionError(f"malformed tuple marker (extension type {TUPLE_EXT} with {len(data)} bytes)")
    return ExtensionError(f"msgpack extension type {code} is not allowed")


def _first_pass_ext(code: int, data: bytes) -> Any:
    if code == TUPLE_EXT and not data:
        raise _TupleFound
    if code == BIG_INT_EXT:
        return _read_big_int(data)
    raise _unknown(code, data)


class _TupleReader:
    """Hooks of the second pass: markers become a sentinel, arrays that start with it tuples.

    Counting both tells a marker that sat anywhere but first in an array
    (which no tuple consumed) from a well-formed one.
    """

    __slots__ = ("markers", "tuples")

    _SENTINEL: Any = object()

    def __init__(self) -> None:
        self.markers = 0
        self.tuples = 0

    def ext(self, code: int, data: bytes) -> Any:
        if code == TUPLE_EXT and not data:
            self.markers += 1
            return self._SENTINEL
        if code == BIG_INT_EXT:
            return _read_big_int(data)
        raise _unknown(code, data)

    def array(self, items: list[Any]) -> Any:
        if items and items[0] is self._SENTINEL:
            self.tuples += 1
            return tuple(items[1:])
        return items


def unpackb(data: bytes) -> Any:
    """Bytes from :func:`packb` back to the value, types and all.

    Map keys may be any hashable type :func:`packb` writes (an array that
    is no tuple as a key is refused: it is a list, which is not hashable).
    Sizes and nesting are bounded as msgpack bounds them by default (by the
    data's length, 1024 levels). Raises :class:`ExtensionError` for an
    extension type other than the tuple marker and a big int, a marker out of
    place or a malformed big int, and
    msgpack's errors (``ValueError`` and its subclasses, ``TypeError``) for
    malformed data; nothing is ever unpickled.
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True, ext_hook=_first_pass_ext)
    except _TupleFound:
        pass
    reader = _TupleReader()
    value = msgpack.unpackb(
        data, raw=False, strict_map_key=False, use_list=True, ext_hook=reader.ext, list_hook=reader.array
    )
    if reader.markers != reader.tuples:
        raise ExtensionError(f"a tuple marker (extension type {TUPLE_EXT}) that does not start an array")
    return value


def hashable(key: Any) -> Any:
    """A key read back from plain msgpack (lists where it had tuples) made hashable again.

    What :func:`unpackb` gives needs none of this (it is then a no-op).
    """
    if isinstance(key, list):
        return tuple(hashable(item) for item in key)
    return key
