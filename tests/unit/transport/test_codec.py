"""Frames: round trips of every kind, and strict refusal of anything that breaks the protocol."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamlet as sl
from streamlet.core.model.record import elements_of, records_of
from streamlet.transport.codec import (
    DEFAULT_MAX_FRAME,
    HEADER,
    MAGIC,
    VERSION,
    FrameError,
    FrameType,
    data_body,
    data_frame,
    decode_body,
    frame,
    parse_header,
    records_from,
)
from tests.support.exact_values import KEYS, VALUES, same_shape


def decode(data: bytes) -> tuple[FrameType, int, list[Any]]:
    """``(type, flags, body)`` of one whole frame, read the way the server reads it."""
    kind, flags, length = parse_header(data[: HEADER.size])
    assert length == len(data) - HEADER.size
    return kind, flags, decode_body(kind, data[HEADER.size :])


def header(kind: int = FrameType.DATA, length: int = 0, magic: bytes = MAGIC, version: int = VERSION) -> bytes:
    """A 9-byte header with the given fields (flags 0)."""
    return HEADER.pack(magic, version, kind, 0, length)


def test_data_frame_round_trips_records() -> None:
    """A DATA frame gives back channel, epoch, seq and equal records; tuple keys come back as tuples."""
    batch = [
        sl.Record("a", 1, 1.5),
        sl.Record(("user", 42), {"items": [1, [2, 3]], "name": "x"}, None),
        sl.Record(("outer", ("inner", 1)), b"raw", 2.0),
        sl.Record(None, None, None),
    ]
    kind, flags, body = decode(data_frame("job/count.0", 3, 7, elements_of(batch)))
    assert (kind, flags, body[:3]) == (FrameType.DATA, 0, ["job/count.0", 3, 7])
    records = records_of(records_from(*body[3:]))
    assert records == batch
    assert [type(record.key) for record in records] == [str, tuple, tuple, type(None)]
    assert records[2].key == ("outer", ("inner", 1))


def test_data_frame_values_keep_their_types() -> None:
    """Tuple values (nested too), lists, dicts with int, float, tuple, None and bool keys, and list keys arrive
    as they were sent."""
    batch = [
        sl.Record("pair", (1, 2), 1.0),
        sl.Record(("k", 1), [(1, "a"), [2, (3.5, b"x")]], None),
        sl.Record(3, {1: "one", 2.5: (None,), ("a", 1): {None: True, False: [()]}}, 2.0),
        sl.Record([1, 2], {"list": [1], "tuple": (1,)}, None),
    ]
    _kind, _flags, body = decode(data_frame("c", 0, 1, elements_of(batch)))
    records = records_of(records_from(*body[3:]))
    assert records == batch
    for got, sent in zip(records, batch, strict=True):
        assert same_shape(got.key, sent.key)
        assert same_shape(got.value, sent.value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(KEYS, VALUES, st.none() | st.floats(allow_nan=False)), max_size=5))
def test_data_body_round_trips_keys_and_values_exactly(rows: list[tuple[Any, Any, float | None]]) -> None:
    """data_body, decode_body and records_from give back every key and value with its types at every level."""
    batch = [sl.Record(key, value, ts) for key, value, ts in rows]
    decoded = decode_body(FrameType.DATA, data_body("job/t.0", 2, 9, elements_of(batch)))
    assert decoded[:3] == ["job/t.0", 2, 9]
    records = records_of(records_from(*decoded[3:]))
    assert [type(record) for record in records] == [sl.Record] * len(batch)
    for got, sent in zip(records, batch, strict=True):
        assert same_shape(got.key, sent.key)
        assert same_shape(got.value, sent.value)
        assert same_shape(got.ts, sent.ts)


@pytest.mark.parametrize(
    "value",
    [{1: "a"}, {2.5: "v"}, {-7: {None: b"x"}}, {True: 1, b"k": 2}, {(1, "t"): 3}],
    ids=["int", "float", "nested-int-and-none", "bool-and-bytes", "tuple"],
)
def test_decode_body_accepts_hashable_map_keys_of_every_encodable_type(value: dict[Any, Any]) -> None:
    """Not only str keys: ints, floats, None, bool, bytes and tuples as map keys come through unchanged."""
    decoded = decode_body(FrameType.DATA, data_body("c", 0, 1, [("k", value, None)]))
    assert same_shape(decoded[4], [value])


def test_tuples_nested_too_deep_are_refused() -> None:
    """Crafted tuples nested 3000 deep in a few kB hit msgpack's nesting limit: a FrameError."""
    crafted = b"\x92\xc7\x00\x01" * 3000 + b"\xc0"  # [marker, [marker, ... None]]: 3000 deep
    body = b"\x96\xa1c\x00\x01\x91\xa1k\x91" + crafted + b"\x91\xc0"  # ["c", 0, 1, ["k"], [crafted], [None]]
    with pytest.raises(FrameError, match=r"^undecodable DATA body: StackError$"):
        decode_body(FrameType.DATA, body)


def test_data_carries_window_bounds_when_there_are_any() -> None:
    """Window results keep their bounds across the wire; plain records in the same batch stay plain."""
    batch = [sl.WindowRecord("k", 1, 60.0, (0.0, 60.0)), sl.Record("j", 2, None)]
    decoded = decode_body(FrameType.DATA, data_frame("c", 0, 1, elements_of(batch))[HEADER.size :])
    assert [
        (type(r).__name__, r.key, r.value, r.ts, r.window_start, r.window_end)
        for r in records_of(records_from(*decoded[3:]))
    ] == [
        ("WindowRecord", "k", 1, 60.0, 0.0, 60.0),
        ("Record", "j", 2, None, None, None),
    ]


@pytest.mark.parametrize(
    ("starts", "ends", "reason"),
    [
        ([0.0], [1.0, 2.0], "malformed DATA window bounds"),
        (["0"], [1.0], "DATA window bounds of a type that is not allowed"),
        ([0.0], [None], "DATA window bounds with one end missing"),
    ],
)
def test_malformed_window_bounds_are_refused(starts: list[Any], ends: list[Any], reason: str) -> None:
    """Bounds columns of the wrong length or type, or with one end missing, break the protocol."""
    with pytest.raises(FrameError, match=rf"^{reason}$"):
        records_from(["k"], [1], [1.0], None, starts, ends)


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (FrameType.BARRIER, ["job/a", 1, 5, 2]),
        (FrameType.EOS, ["job/a", 2, 9]),
        (FrameType.ACK, [["job/a", 4], ["job/b", 9]]),
        (FrameType.CREDIT, [["job/a", 2], ["job/b", 1]]),
    ],
    ids=["barrier", "eos", "ack", "credit"],
)
def test_control_frames_round_trip(kind: FrameType, body: list[Any]) -> None:
    """BARRIER, EOS, ACK and CREDIT frames decode to the type and body they were built from."""
    assert decode(frame(kind, body)) == (kind, 0, body)


def test_flags_round_trip() -> None:
    """The flags byte is carried through the header unchanged."""
    assert decode(frame(FrameType.EOS, ["c", 0, 1], flags=5))[1] == 5


def test_length_equal_to_the_maximum_is_accepted() -> None:
    """A body of exactly ``max_length`` bytes passes the header check."""
    assert parse_header(header(length=1024), max_length=1024) == (FrameType.DATA, 0, 1024)


@pytest.mark.parametrize(
    ("data", "max_length", "message"),
    [
        (b"SL\x01", DEFAULT_MAX_FRAME, r"truncated header \(3 of 9 bytes\)"),
        (header() + b"x", DEFAULT_MAX_FRAME, r"truncated header \(10 of 9 bytes\)"),
        (header(magic=b"XY"), DEFAULT_MAX_FRAME, r"bad magic b'XY'"),
        (header(version=1), DEFAULT_MAX_FRAME, r"unsupported protocol version 1"),
        (header(version=3), DEFAULT_MAX_FRAME, r"unsupported protocol version 3"),
        (header(kind=0), DEFAULT_MAX_FRAME, r"unknown frame type 0"),
        (header(kind=99), DEFAULT_MAX_FRAME, r"unknown frame type 99"),
        (header(length=1025), 1024, r"frame of 1025 bytes exceeds the maximum of 1024"),
        (
            header(length=DEFAULT_MAX_FRAME + 1),
            DEFAULT_MAX_FRAME,
            r"frame of 16777217 bytes exceeds the maximum of 16777216",
        ),
    ],
    ids=[
        "short",
        "long",
        "magic",
        "version-1",
        "version-3",
        "type-0",
        "type-99",
        "over-custom-max",
        "over-default-max",
    ],
)
def test_parse_header_rejects(data: bytes, max_length: int, message: str) -> None:
    """A header that is truncated, foreign, of another version (1 sent tuples as lists), of unknown type
    or too long raises FrameError."""
    with pytest.raises(FrameError, match=rf"^{message}$") as caught:
        parse_header(data, max_length)
    assert caught.value.reason == str(caught.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xc1", r"undecodable DATA body: FormatError"),
        (b"\x94\x01", r"undecodable DATA body: ValueError"),
        (b"\x90\x01", r"undecodable DATA body: ExtraData"),
        (b"", r"undecodable DATA body: ValueError"),
        (msgpack.packb(msgpack.ExtType(5, b"x")), r"msgpack extension type 5 is not allowed"),
        (msgpack.packb(["c", 0, 1, [["k", msgpack.ExtType(7, b"")]]]), r"msgpack extension type 7 is not allowed"),
        (
            msgpack.packb([[msgpack.ExtType(1, b""), msgpack.ExtType(3, b"")]]),
            r"msgpack extension type 3 is not allowed",
        ),
        (msgpack.packb([msgpack.ExtType(1, b"\x03"), 1]), r"malformed tuple marker \(extension type 1 with 1 bytes\)"),
        (
            msgpack.packb(["c", 0, 1, [{msgpack.ExtType(1, b""): 1}], [1], [None]]),
            r"a tuple marker \(extension type 1\) that does not start an array",
        ),
        (b"\x81\x91\x01\x02", r"undecodable DATA body: TypeError"),
    ],
    ids=[
        "format",
        "truncated",
        "extra",
        "empty",
        "ext",
        "nested-ext",
        "ext-in-tuple",
        "marker-with-payload",
        "marker-as-a-key",
        "array-map-key",
    ],
)
def test_decode_body_rejects_bad_msgpack(body: bytes, message: str) -> None:
    """Garbage, truncated or trailing bytes, extension types other than the tuple marker, a marker with a
    payload or out of place, and arrays (not tuples) as map keys raise FrameError."""
    with pytest.raises(FrameError, match=rf"^{message}$"):
        decode_body(FrameType.DATA, body)


def test_data_columns_refuse_the_timestamp_extension_type() -> None:
    """msgpack decodes its Timestamp (type -1) past the ext hook; DATA columns refuse it all the same."""
    body = msgpack.packb(["c", 0, 1, ["k"], [msgpack.Timestamp(1, 0)], [None]])
    decoded = decode_body(FrameType.DATA, body)
    with pytest.raises(FrameError, match=r"^msgpack extension type -1 is not allowed$"):
        records_from(*decoded[3:])


def test_data_columns_refuse_unhashable_keys_and_odd_event_times() -> None:
    """A map as a key, or a string as an event time, is refused."""
    message = r"^DATA keys or event times of a type that is not allowed$"
    with pytest.raises(FrameError, match=message):
        records_from([{"a": 1}], [1], [None])
    with pytest.raises(FrameError, match=message):
        records_from(["k"], [1], ["yesterday"])


def test_data_carries_loop_iterations_when_there_are_any() -> None:
    """Records from inside a cycle keep their iteration count across the wire."""
    from streamlet.core.model.record import LoopRecord

    batch: list[sl.Record] = [LoopRecord("k", 1, 2.0, 3), LoopRecord("j", 2, None, 1)]
    decoded = decode_body(FrameType.DATA, data_frame("c", 0, 1, elements_of(batch))[HEADER.size :])
    assert [(type(r).__name__, r.key, r.value, r.ts, r.iteration) for r in records_of(records_from(*decoded[3:]))] == [
        ("LoopRecord", "k", 1, 2.0, 3),
        ("LoopRecord", "j", 2, None, 1),
    ]


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (FrameType.DATA, {"channel": "c"}),
        (FrameType.DATA, ["c", 0, 1]),
        (FrameType.DATA, ["c", 0, 1, [], [], [], [], "extra"]),
        (FrameType.BARRIER, ["c", 0, 1]),
        (FrameType.EOS, ["c", 0, 1, 2]),
        (FrameType.ERROR, ["reason", "more"]),
        (FrameType.ACK, "c"),
        (FrameType.CREDIT, 3),
        (FrameType.HELLO, None),
    ],
    ids=[
        "data-map",
        "data-short",
        "data-long",
        "barrier-short",
        "eos-long",
        "error-long",
        "ack-str",
        "credit-int",
        "hello-nil",
    ],
)
def test_decode_body_rejects_wrong_shapes(kind: FrameType, body: Any) -> None:
    """A body that is not a list, or a list of the wrong length for its type, raises FrameError."""
    with pytest.raises(FrameError, match=rf"^malformed {kind.name} body$"):
        decode_body(kind, msgpack.packb(body))


@pytest.mark.parametrize(
    "columns",
    [("k", [1], [None]), (["k"], {"v": 1}, [None]), (["k"], [1], None), (None, None, None)],
    ids=["keys-str", "values-map", "stamps-nil", "all-nil"],
)
def test_records_from_rejects_columns_that_are_not_lists(columns: tuple[Any, Any, Any]) -> None:
    """Keys, values and timestamps of a DATA frame must each be a list."""
    with pytest.raises(FrameError, match=r"^malformed DATA columns$"):
        records_from(*columns)


@pytest.mark.parametrize(
    "columns",
    [(["a", "b"], [1], [None, None]), (["a"], [1, 2], [None]), (["a"], [1], []), ([], [], [None])],
    ids=["short-values", "long-values", "short-stamps", "long-stamps"],
)
def test_records_from_rejects_columns_of_different_lengths(columns: tuple[Any, Any, Any]) -> None:
    """One record per position: columns of different lengths raise FrameError."""
    with pytest.raises(FrameError, match=r"^DATA columns of different lengths$"):
        records_from(*columns)


def test_records_from_of_empty_columns_is_an_empty_batch() -> None:
    """Three empty columns are an empty batch."""
    assert records_from([], [], []) == []


_INTS = st.integers(-(2**63), 2**64 - 1) | st.integers(min_value=2**64) | st.integers(max_value=-(2**63) - 1)
_VALUES = st.recursive(
    st.none() | st.booleans() | _INTS | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text() | _INTS, inner, max_size=4),
    max_leaves=12,
)
_FRAMES = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda kind, length, tail: header(kind, length) + tail,
        st.integers(0, 255),
        st.integers(0, 2**32 - 1) | st.integers(0, 40),
        st.binary(max_size=64),
    ),
    st.builds(
        lambda keys, values, stamps: frame(FrameType.DATA, ["c", 0, 1, keys, values, stamps]),
        st.lists(_VALUES, max_size=3),
        st.lists(_VALUES, max_size=3) | _VALUES,
        st.lists(st.none() | st.floats(), max_size=3),
    ),
    st.builds(
        lambda kind, body, cut: frame(FrameType(kind), body)[: cut or None],
        st.sampled_from(list(FrameType)),
        _VALUES | st.lists(_VALUES, min_size=3, max_size=6),
        st.integers(0, 40),
    ),
)


@settings(max_examples=300, deadline=None)
@given(_FRAMES)
def test_arbitrary_bytes_raise_only_frame_error(data: bytes) -> None:
    """Header, then a body of the stated length if there is one: decoding raises FrameError or nothing."""
    try:
        kind, _flags, length = parse_header(data[: HEADER.size])
        body = data[HEADER.size : HEADER.size + length]
        if len(body) == length:
            decoded = decode_body(kind, body)
            if kind is FrameType.DATA:
                records_from(*decoded[3:])
    except FrameError:
        pass
