"""Values round-trip exactly: the encoding (core/model/encoding.py), keyed state and checkpoint documents.

Property-based over nested values of every allowed type; ``same_shape`` checks
types at every level, not only equality.
"""

from __future__ import annotations

import collections
import enum
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamlet as sl
from streamlet.core.model.encoding import (
    TUPLE_EXT,
    ExtensionError,
    pack_exact,
    packb,
    unpackb,
)
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.store import decode, encode
from tests.support.exact_values import KEYS, PLAIN_VALUES, VALUES, same_shape

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


def test_same_shape_tells_types_apart() -> None:
    """The helper itself: what == calls equal, same_shape does not when a type differs anywhere."""
    assert same_shape((1, [2, (3,)]), (1, [2, (3,)]))
    assert not same_shape((1, 2), [1, 2])
    assert not same_shape([1, (2,)], [1, [2]])
    assert not same_shape({1: "a"}, {1.0: "a"})
    assert not same_shape({True: "a"}, {1: "a"})
    assert not same_shape({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not same_shape(0.0, -0.0)
    assert same_shape([math.nan], [math.nan])
    assert not same_shape(math.nan, 1.0)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_encoding_round_trips_every_value_exactly(value: Any) -> None:
    """unpackb(packb(v)) has v's types at every level: tuples, lists, dicts with any hashable keys, bytes."""
    assert same_shape(unpackb(packb(value)), value)


@settings(max_examples=200, deadline=None)
@given(PLAIN_VALUES)
def test_a_value_without_tuples_is_plain_msgpack(value: Any) -> None:
    """The fast path: with no tuple anywhere the bytes are exactly what msgpack itself writes."""
    assert packb(value) == msgpack.packb(value, use_bin_type=True)


def test_a_tuple_is_an_array_that_starts_with_the_marker() -> None:
    """The wire form of a tuple: [ExtType(1, b""), *items], nested the same way, as a dict key too."""
    marker = msgpack.ExtType(TUPLE_EXT, b"")
    assert TUPLE_EXT == 1
    assert packb({"k": (1, (2, "b")), "e": ()}) == msgpack.packb({"k": [marker, 1, [marker, 2, "b"]], "e": [marker]})
    assert packb({(1, None): [()]}) == msgpack.packb({(marker, 1, None): [[marker]]})


def test_tuples_as_dict_keys_and_inside_keys_come_back_hashable() -> None:
    """A tuple key (with a tuple inside) is a tuple again, so the dict can be looked up with the original key."""
    value = {("user", (1, 2)): [("a", 1)], 7: {None: (), b"k": 1.5}}
    decoded = unpackb(packb(value))
    assert decoded[("user", (1, 2))] == [("a", 1)]
    assert decoded[7] == {None: (), b"k": 1.5}
    assert same_shape(decoded, value)


def test_subclasses_come_back_as_their_base_types() -> None:
    """As plain msgpack always did: IntEnum -> int, namedtuple -> tuple, defaultdict -> dict, bytearray -> bytes,
    a str subclass -> its characters (not what its __str__ says)."""

    class Color(enum.IntEnum):
        RED = 1

    class Shown(str):
        def __str__(self) -> str:
            return "not the data"

    point = collections.namedtuple("point", "x y")
    value = [Color.RED, point(1, 2), collections.defaultdict(int, a=1), bytearray(b"ab"), memoryview(b"cd")]
    assert same_shape(unpackb(packb([*value, Shown("data")])), [1, (1, 2), {"a": 1}, b"ab", b"cd", "data"])


def test_tuples_nest_as_deep_as_msgpack_allows_lists() -> None:
    """A tuple is one array level, like a list: 200 levels round-trip; past msgpack's own limits it refuses
    (a ValueError to encode, a StackError for crafted bytes 3000 deep), without crashing."""
    deep: Any = ()
    for level in range(199):
        deep = (deep,) if level % 2 else [deep]
    assert same_shape(unpackb(packb(deep)), deep)
    for _ in range(3000):
        deep = (deep,)
    with pytest.raises(ValueError, match=r"^recursion limit exceeded"):
        packb(deep)
    crafted = b"\x92\xc7\x00\x01" * 3000 + b"\xc0"  # [marker, [marker, ... None]]: tuples 3000 deep
    with pytest.raises(msgpack.StackError):
        unpackb(crafted)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (msgpack.packb(msgpack.ExtType(5, b"x")), "msgpack extension type 5 is not allowed"),
        (b"\x81\xa1a\x91\xd4\xfd\x00", "msgpack extension type -3 is not allowed"),  # {"a": [ext -3]}
        (
            msgpack.packb([msgpack.ExtType(TUPLE_EXT, b"x"), 1]),
            "malformed tuple marker (extension type 1 with 1 bytes)",
        ),
        (
            msgpack.packb(msgpack.ExtType(TUPLE_EXT, b"")),
            "a tuple marker (extension type 1) that does not start an array",
        ),
        (
            msgpack.packb([1, msgpack.ExtType(TUPLE_EXT, b"")]),
            "a tuple marker (extension type 1) that does not start an array",
        ),
        (
            msgpack.packb({"k": msgpack.ExtType(TUPLE_EXT, b"")}),
            "a tuple marker (extension type 1) that does not start an array",
        ),
        (
            msgpack.packb([[msgpack.ExtType(TUPLE_EXT, b""), msgpack.ExtType(TUPLE_EXT, b"")]]),
            "a tuple marker (extension type 1) that does not start an array",
        ),
        (
            msgpack.packb([msgpack.ExtType(TUPLE_EXT, b""), msgpack.ExtType(3, b"")]),
            "msgpack extension type 3 is not allowed",
        ),
    ],
    ids=[
        "top",
        "nested",
        "marker-with-payload",
        "marker-alone",
        "marker-second",
        "marker-as-value",
        "two-markers",
        "tuple-then-ext",
    ],
)
def test_unknown_extension_types_are_refused(data: bytes, message: str) -> None:
    """Decoding never returns an ExtType or the marker: another code, or a marker out of place, raises."""
    with pytest.raises(ExtensionError) as caught:
        unpackb(data)
    assert str(caught.value) == message


def test_an_int_past_64_bits_is_its_own_extension_type() -> None:
    """Past msgpack's integers (below -2^63, from 2^64) an int is extension type 2, its two's complement
    big-endian in as few bytes as hold it; inside that range it stays msgpack's own integer."""
    assert packb(2**64) == msgpack.packb(msgpack.ExtType(2, b"\x01" + bytes(8)))
    assert packb(-(2**63) - 1) == msgpack.packb(msgpack.ExtType(2, b"\xff\x7f" + b"\xff" * 7))
    assert packb([2**64 - 1, -(2**63)]) == msgpack.packb([2**64 - 1, -(2**63)])
    for number in (2**64, -(2**63) - 1, 2**200, -(2**200), 2**72 - 1):
        assert same_shape(unpackb(packb({(number,): [number]})), {(number,): [number]})


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "malformed big int (extension type 2 with 0 bytes)"),
        (b"\x05", "malformed big int (extension type 2 with 1 bytes)"),  # fits msgpack's own integers
        (b"\x00\x01" + bytes(8), "malformed big int (extension type 2 with 10 bytes)"),  # a byte too many
    ],
    ids=["empty", "in-range", "padded"],
)
def test_a_big_int_no_encoder_writes_is_refused(payload: bytes, message: str) -> None:
    """Every int has one encoding (partitioning hashes the bytes): any other payload of type 2 is refused."""
    for data in (msgpack.packb(msgpack.ExtType(2, payload)), msgpack.packb([(1,), msgpack.ExtType(2, payload)])):
        with pytest.raises(ExtensionError) as caught:
            unpackb(data)
        assert str(caught.value) == message


def test_an_unencodable_part_is_named() -> None:
    """pack_exact names the bad part, inside a tuple too."""
    with pytest.raises(sl.EncodingError) as caught:
        pack_exact({"k": (1, {2: object()})}, "keyed state")
    assert str(caught.value) == (
        "keyed state: the value at ['k'][1][2] cannot be encoded: object is not encodable "
        "(use None, bool, int, float, str, bytes, list, tuple and dict)"
    )


# -- (a) keyed state -----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=6))
def test_keyed_state_restores_keys_and_values_exactly(values: dict[Any, Any]) -> None:
    """checkpoint() then restore() gives back every key and value with its types, in order."""
    state = KeyedState()
    for key, value in values.items():
        state.put(key, value)
    restored = KeyedState()
    restored.restore(state.checkpoint())
    assert same_shape(restored.values, values)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=6), st.integers(1, 4))
def test_keyed_state_split_and_merged_keeps_types(values: dict[Any, Any], parts: int) -> None:
    """partition() and merge() (a restore at another parallelism) keep keys' and values' types too."""
    merged = KeyedState()
    merged.restore(KeyedState.merge(KeyedState.partition(KeyedState(values).checkpoint(), parts)))
    assert len(merged.values) == len(values)
    for key, value in values.items():
        (found,) = [candidate for candidate in merged.values if candidate == key]
        assert same_shape(found, key)
        assert same_shape(merged.values[key], value)


# -- (b) checkpoint documents ---------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(VALUES, st.lists(st.tuples(KEYS, VALUES), max_size=4))
def test_checkpoint_documents_round_trip_exactly(window: Any, buffered: list[tuple[Any, Any]]) -> None:
    """decode(encode(document)) keeps the types of window snapshots and buffered records' keys and values."""
    state = KeyedState({key: value for key, value in buffered}).checkpoint()
    document = {
        "epoch": 4,
        "job": "exact",
        "finished": False,
        "attempt": "a1",
        "sources": {"in": [17]},
        "tasks": {"t": [{"state": state, "window": window, "finished": False}], "w": [[0, buffered]]},
    }
    decoded = decode(encode(document))
    assert same_shape(decoded, document)
    restored = KeyedState()
    restored.restore(decoded["tasks"]["t"][0]["state"])
    assert same_shape(restored.values, {key: value for key, value in buffered})
