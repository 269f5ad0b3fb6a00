"""ARROW frames: columnar batches over TCP as Arrow IPC, cut to the frame limit, and refused when malformed."""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import pytest

from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.encoding import packb
from streamlet.core.runtime.channel import Inbox
from streamlet.errors import FrameError, RecordTooLarge
from streamlet.transport.arrow_frames import _compressed, arrow_body, arrow_frames, columns_from
from streamlet.transport.codec import DEFAULT_MAX_FRAME, FrameType, decode_body, frame, with_header
from streamlet.transport.tcp import DataServer, read_frame
from tests.unit.transport.test_tcp import CHANNEL, SECRET, authenticate, batch, opened, raw, until

LIMIT = 64 * 1024


def sensors(rows: int, pad: int = 0) -> ColumnBatch:
    data = pa.record_batch({
        "sensor": [f"s{i % 5}" for i in range(rows)], "celsius": [i / 4 for i in range(rows)],
        "note": ["x" * pad] * rows, "at": list(range(rows)),
    })  # fmt: skip
    return ColumnBatch(data, key="sensor", value="celsius", ts="at")


def ipc(data: pa.RecordBatch, compression: str | None = None) -> bytes:
    """``data`` as an Arrow IPC stream, compressed as asked (which streamlet's sender never does)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_batch(data)
    return bytes(sink.getvalue().to_pybytes())


def fired(rows: int) -> ColumnBatch:
    """A fired columnar window's results: per key a count, the result time and int window bounds."""
    data = pa.record_batch({
        "key": [f"w{i}" for i in range(rows)], "value": list(range(rows)), "ts": [9.999] * rows,
        "window_start": [0] * rows, "window_end": [10] * rows,
    })  # fmt: skip
    return ColumnBatch(data, "key", "value", "ts", window_start="window_start", window_end="window_end")


ZEROS = pa.record_batch({"x": pa.array([0] * (1 << 20), pa.int64())})  # 8 MiB decoded; a few kB compressed
DUPLICATE = pa.RecordBatch.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["x", "x"])


def same(received: Any, sent: ColumnBatch) -> bool:
    return type(received) is ColumnBatch and received.data.equals(sent.data) and received.roles() == sent.roles()


def test_a_body_decodes_to_the_same_batch() -> None:
    """arrow_body then columns_from gives the same rows, schema and roles."""
    sent = sensors(10)
    body = arrow_body(CHANNEL, 0, 1, sent)
    assert same(columns_from(*decode_body(FrameType.ARROW, body)[3:]), sent)


def test_window_bounds_travel_as_two_more_roles() -> None:
    """A batch with window bounds has the long body (two more roles) and decodes to the same window records;
    one without them keeps the short body."""
    sent = fired(3)
    body = decode_body(FrameType.ARROW, arrow_body(CHANNEL, 0, 1, sent))
    assert (len(body), body[7:]) == (9, ["window_start", "window_end"])
    received = columns_from(*body[3:])
    assert same(received, sent)
    assert received.elements() == [
        ("w0", 0, 9.999, 0, (0, 10), "on_time"), ("w1", 1, 9.999, 0, (0, 10), "on_time"),
        ("w2", 2, 9.999, 0, (0, 10), "on_time"),
    ]  # fmt: skip
    assert len(decode_body(FrameType.ARROW, arrow_body(CHANNEL, 0, 1, sensors(2)))) == 7


def test_a_window_batch_cut_to_the_frame_limit_keeps_its_bounds_in_every_frame() -> None:
    """Cut in row ranges to fit the limit, every frame carries the window roles; the rows come back in order."""
    sent = fired(2000)
    frames = arrow_frames(CHANNEL, 0, 1, sent, 8 * 1024)
    assert len(frames) > 1
    parts = [columns_from(*decode_body(FrameType.ARROW, frame[9:])[3:]) for frame in frames]
    assert {part.roles() for part in parts} == {sent.roles()}
    assert pa.Table.from_batches([part.data for part in parts]).equals(pa.Table.from_batches([sent.data]))


async def test_a_columnar_batch_crosses_as_arrow_between_batches_and_markers() -> None:
    """A columnar batch arrives as one, in order with element batches; its rows are counted."""
    sent = sensors(100)
    async with DataServer(SECRET) as server, opened(server) as pipe:
        await pipe.sender.send(batch(1))
        await pipe.sender.send(sent)
        await pipe.sender.send(batch(2))
        first, second, third = [await pipe.take() for _ in range(3)]
        assert (first, third) == (batch(1), batch(2))
        assert same(second, sent)
        stats = server.statistics()
        assert (stats.records, stats.bad_frames) == (102, 0)


async def test_a_batch_over_the_frame_limit_arrives_in_row_ranges_in_order() -> None:
    """A 300 KiB columnar batch with a 64 KiB limit arrives as several batches holding its rows in order, once."""
    sent = sensors(600, pad=500)
    async with DataServer(SECRET, max_frame=LIMIT) as server, opened(server, capacity=2) as pipe:

        async def send() -> None:  # each range is an item of its own: the receiver takes while it goes on
            await pipe.sender.send(sent)
            await pipe.sender.send(batch(1))

        sending = asyncio.create_task(send())
        parts: list[Any] = []
        while type(item := await pipe.take()) is not list:
            parts.append(item)
        await sending
        assert item == batch(1)
        assert len(parts) > 4
        assert all(type(part) is ColumnBatch for part in parts)
        assert pa.Table.from_batches([part.data for part in parts]).equals(pa.Table.from_batches([sent.data]))
        assert server.statistics().records == 601


async def test_a_row_over_the_frame_limit_fails_the_send_and_sends_nothing() -> None:
    """One row that alone needs more than the limit: RecordTooLarge naming its key; nothing was sent."""
    async with DataServer(SECRET, max_frame=LIMIT) as server, opened(server) as pipe:
        with pytest.raises(RecordTooLarge, match=rf"^channel '{CHANNEL}' cannot send the row with key 's0': "):
            await pipe.sender.send(sensors(3, pad=LIMIT))
        await pipe.sender.send(batch(1))
        assert await pipe.take() == batch(1)
        assert pipe.sender.seq == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([CHANNEL, 0, 1, "sensor", None, None, b"not arrow at all"], "undecodable ARROW batch: ArrowInvalid"),
        ([CHANNEL, 0, 1, 7, None, None, b""], "malformed ARROW body"),
        (None, "ARROW roles naming columns the batch has not"),
        ([CHANNEL, 0, 1, "x", None, None, ipc(ZEROS[:1]), "x", None], "malformed ARROW window roles"),
        ([CHANNEL, 0, 1, "x", None, None, ipc(ZEROS[:1]), "x", "end"], "ARROW roles naming columns the batch has not"),
        ([CHANNEL, 0, 1, "x", None, None, ipc(ZEROS, compression="zstd")], "ARROW batch with a compressed body"),
        ([CHANNEL, 0, 1, "x", None, None, ipc(DUPLICATE)], "ARROW batch with duplicate column names"),
    ],
    ids=[
        "garbage",
        "role-not-a-name",
        "role-not-a-column",
        "window-role-none",
        "window-role-not-a-column",
        "compressed",
        "duplicate-names",
    ],
)
async def test_a_bad_arrow_frame_closes_that_connection_only(body: list[Any] | None, reason: str) -> None:
    """Garbage IPC, a role that is not a name, or a role naming no column: ERROR, closed, counted; others go on."""
    if body is None:
        good = arrow_body(CHANNEL, 0, 1, sensors(2))
        body = decode_body(FrameType.ARROW, good)
        body[3] = "missing"
    async with DataServer(SECRET) as server, opened(server) as good_pipe:
        await good_pipe.sender.send(batch(1))
        assert await good_pipe.take() == batch(1)
        inbox = Inbox(8)
        server.register(CHANNEL + "-raw", inbox, inbox.add_channel(0))
        async with raw(server) as (reader, writer):
            await authenticate(reader, writer)
            writer.write(frame(FrameType.OPEN, [CHANNEL + "-raw"]))
            body[0] = CHANNEL + "-raw"
            writer.write(with_header(FrameType.ARROW, packb(body)))
            replies: list[tuple[FrameType, list[Any]]] = []
            while not replies or replies[-1][0] is not FrameType.ERROR:
                replies.append(await read_frame(reader, DEFAULT_MAX_FRAME))
            assert replies[-1][1] == [reason]
        await until(lambda: server.statistics().active == 1)
        await good_pipe.sender.send(batch(2))
        assert await good_pipe.take() == batch(2)
        assert (server.statistics().bad_frames, inbox.queued(0)) == (1, 0)


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_compressed_batch_is_refused_before_it_is_decoded(compression: str) -> None:
    """A compressed body (record batch, or the dictionary batch of a dictionary column) is refused, however
    small: its decoded size is not bounded by the frame's."""
    words = pa.record_batch({"w": pa.array(["a", "b"] * 8).dictionary_encode()})
    for data in (ZEROS, words):
        payload = ipc(data, compression=compression)
        if data is ZEROS:
            assert len(payload) < LIMIT < data.nbytes  # fits a small frame, decodes to far more
        with pytest.raises(FrameError, match=r"^ARROW batch with a compressed body$"):
            columns_from(None, None, None, payload)
    plain = columns_from("w", None, None, ipc(words))
    assert plain.data.equals(words)


def test_a_decoded_batch_over_the_frame_limit_is_refused() -> None:
    """Decoded, a batch may not hold more than max_frame bytes; at the limit it is taken."""
    payload = ipc(ZEROS)
    with pytest.raises(FrameError, match=rf"^ARROW batch of {ZEROS.nbytes} bytes decoded, over the limit of 1000$"):
        columns_from("x", None, None, payload, max_frame=1000)
    assert columns_from("x", None, None, payload, max_frame=ZEROS.nbytes).data.equals(ZEROS)


def test_metadata_pointing_outside_itself_is_a_frame_error() -> None:
    """Flatbuffer offsets out of the message metadata: a FrameError, not an IndexError or struct.error."""
    with pytest.raises(FrameError, match=r"^undecodable ARROW batch: bad message metadata$"):
        _compressed(b"\xff\xff\xff\x7f" + bytes(12))
    with pytest.raises(FrameError, match=r"^undecodable ARROW batch: bad message metadata$"):
        _compressed(b"\x08\x00\x00\x00" + bytes(4) + b"\xf0\xff\xff\x7f")
