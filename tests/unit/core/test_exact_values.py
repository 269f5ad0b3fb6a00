"""Values round-trip exactly: the encoding (core/model/encoding.py), keyed state and checkpoint documents.

Property-based over nested values of every allowed type; ``same_shape`` checks
types at every level, not only equality.
"""

from __future__ import annotations

import collections
import enum
import math
import threading
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamlet as sl
from streamlet.core.model.encoding import (
    MAX_TUPLE_DEPTH,
    TUPLE_EXT,
    ExtensionError,
    pack_exact,
    packb,
    unpackb,
)
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.store import decode, encode
from tests.support.exact_values import KEYS, PLAIN_VALUES, VALUES, same_shape


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


def test_a_tuple_is_extension_type_1_around_its_items() -> None:
    """The wire form of a tuple: ExtType(1, items as an array), nested the same way."""
    inner = msgpack.ExtType(TUPLE_EXT, msgpack.packb([2, "b"]))
    outer = msgpack.ExtType(TUPLE_EXT, msgpack.packb([1, inner]))
    assert TUPLE_EXT == 1
    assert packb({"k": (1, (2, "b"))}) == msgpack.packb({"k": outer})


def test_tuples_as_dict_keys_and_inside_keys_come_back_hashable() -> None:
    """A tuple key (with a tuple inside) is a tuple again, so the dict can be looked up with the original key."""
    value = {("user", (1, 2)): [("a", 1)], 7: {None: (), b"k": 1.5}}
    decoded = unpackb(packb(value))
    assert decoded[("user", (1, 2))] == [("a", 1)]
    assert decoded[7] == {None: (), b"k": 1.5}
    assert same_shape(decoded, value)


def test_subclasses_come_back_as_their_base_types() -> None:
    """As plain msgpack always did: IntEnum -> int, namedtuple -> tuple, defaultdict -> dict, bytearray -> bytes."""

    class Color(enum.IntEnum):
        RED = 1

    point = collections.namedtuple("point", "x y")
    value = [Color.RED, point(1, 2), collections.defaultdict(int, a=1), bytearray(b"ab"), memoryview(b"cd")]
    assert same_shape(unpackb(packb(value)), [1, (1, 2), {"a": 1}, b"ab", b"cd"])


def test_tuples_nest_up_to_the_limit() -> None:
    """MAX_TUPLE_DEPTH tuples inside each other round-trip, also decoded in another thread."""
    deep: Any = ()
    for _ in range(MAX_TUPLE_DEPTH - 1):
        deep = ([deep],)
    data = packb(deep)
    assert same_shape(unpackb(data), deep)
    decoded: list[Any] = []
    worker = threading.Thread(target=lambda: decoded.append(unpackb(data)))
    worker.start()
    worker.join()
    assert same_shape(decoded[0], deep)


def test_tuples_nested_deeper_are_refused_both_ways() -> None:
    """One level more is an EncodingError naming where, and crafted bytes nesting 3000 deep do not crash."""
    deep: Any = ()
    for _ in range(MAX_TUPLE_DEPTH):
        deep = (deep,)
    with pytest.raises(sl.EncodingError, match=r"cannot be encoded: tuples nest more than 32 deep \(use "):
        pack_exact({"k": deep}, "keyed state")
    crafted = msgpack.packb([])
    for _ in range(3000):
        crafted = msgpack.packb([msgpack.ExtType(TUPLE_EXT, crafted)])
    with pytest.raises(ExtensionError, match=r"^tuples nest more than 32 deep$"):
        unpackb(crafted)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (msgpack.packb(msgpack.ExtType(5, b"x")), "msgpack extension type 5 is not allowed"),
        (b"\x81\xa1a\x91\xd4\xfd\x00", "msgpack extension type -3 is not allowed"),  # {"a": [ext -3]}
        (msgpack.packb(msgpack.ExtType(TUPLE_EXT, msgpack.packb({"a": 1}))), "malformed tuple (extension type 1)"),
    ],
    ids=["top", "nested", "tuple-of-a-map"],
)
def test_unknown_extension_types_are_refused(data: bytes, message: str) -> None:
    """Decoding never returns an ExtType: another code, or a tuple whose payload is not an array, raises."""
    with pytest.raises(ExtensionError) as caught:
        unpackb(data)
    assert str(caught.value) == message


def test_an_unencodable_part_is_named() -> None:
    """pack_exact names the bad part, inside a tuple too."""
    with pytest.raises(sl.EncodingError) as caught:
        pack_exact({"k": (1, {2: object()})}, "keyed state")
    assert str(caught.value) == (
        "keyed state: the value at ['k'][1][2] cannot be encoded: object is not encodable "
        "(use None, bool, int (64-bit), float, str, bytes, list, tuple and dict)"
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
