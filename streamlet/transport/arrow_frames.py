"""ARROW frames: a columnar batch over TCP as Arrow IPC, no step per row.

Body (msgpack, like every frame): ``[channel, epoch, seq, key, value, ts,
ipc]``, or ``[channel, epoch, seq, key, value, ts, ipc, window_start,
window_end]`` for a batch with window bounds (a columnar window's results),
where ``key``/``value``/``ts`` and ``window_start``/``window_end`` name the
batch's role columns (a string or ``None``; both window roles or neither:
a window role is never ``None`` in the longer body) and ``ipc`` is one record batch in the Arrow IPC stream
format (a schema message, one batch message, the end marker), never
compressed. The frame limit bounds ``ipc`` before anything is read, and so
the decoded batch: a record batch or dictionary batch whose message says its
body is compressed is refused before it is decoded (a few kB of ZSTD could
decode to gigabytes), and a decoded batch of more than ``max_frame`` bytes
is refused too. Decoding accepts exactly one batch, validates it in full
(offsets and lengths within its buffers: Arrow IPC from an untrusted peer
must not reach ``pyarrow.compute`` unchecked), and checks that the column
names are distinct and the role columns exist. Anything else is a
:class:`~streamlet.errors.FrameError`: the connection is closed and counted
as a bad frame. A batch too big for one frame goes as several smaller
batches (rows in order), each a frame of its own.
"""

from __future__ import annotations

import reprlib
import struct
from typing import Any

from streamlet.core.model.columns import ColumnBatch, import_pyarrow
from streamlet.core.model.encoding import packb
from streamlet.errors import FrameError, RecordTooLarge
from streamlet.transport.codec import DEFAULT_MAX_FRAME, FrameType, with_header

# Arrow's Message.fbs: the slots of the tables read to find a body's compression.
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER = 1, 2
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3  # MessageHeader union members
_DICTIONARY_BATCH_DATA = 1  # DictionaryBatch.data: a RecordBatch
_RECORD_BATCH_COMPRESSION = 3  # RecordBatch.compression: a BodyCompression, absent when uncompressed


def arrow_body(channel: str, epoch: int, seq: int, batch: ColumnBatch) -> bytes:
    """The packed body of an ARROW frame for ``batch``."""
    pa = import_pyarrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.data.schema) as writer:
        writer.write_batch(batch.data)
    body = [channel, epoch, seq, batch.key, batch.value, batch.ts, sink.getvalue().to_pybytes()]
    if batch.window_start is not None:  # the short body otherwise: what a peer without window roles reads
        body += [batch.window_start, batch.window_end]
    return packb(body)


def arrow_frames(channel: str, epoch: int, seq: int, batch: ColumnBatch, max_frame: int) -> list[bytes]:
    """ARROW frames of ``batch`` within ``max_frame``, numbered from ``seq``: one, or the batch cut in row
    ranges (halved until each fits). ``RecordTooLarge`` when a single row does not fit."""
    parts = [batch]
    bodies: list[bytes] = []
    while parts:
        part = parts.pop(0)
        body = arrow_body(channel, epoch, seq + len(bodies), part)
        if len(body) <= max_frame:
            bodies.append(body)
        elif len(part) > 1:
            half = len(part) // 2
            parts[:0] = [part.with_data(part.data.slice(0, half)), part.with_data(part.data.slice(half))]
        else:
            key = part.column(part.key)[0] if part.key is not None else None
            raise RecordTooLarge(
                f"channel '{channel}' cannot send the row with key {reprlib.repr(key)}: alone it needs a frame "
                f"of {len(body)} bytes, over the limit of {max_frame} (max_frame)"
            )
    return [with_header(FrameType.ARROW, body) for body in bodies]


def columns_from(
    key: Any, value: Any, ts: Any, payload: Any, *window: Any, max_frame: int = DEFAULT_MAX_FRAME
) -> ColumnBatch:
    """The columnar batch of an ARROW frame's body (from its key role on; ``window``: the window roles of the
    long body), checked (see the module docstring)."""
    if not all(role is None or type(role) is str for role in (key, value, ts)) or type(payload) is not bytes:
        raise FrameError("malformed ARROW body")
    if window and (len(window) != 2 or not all(type(role) is str for role in window)):
        raise FrameError("malformed ARROW window roles")
    start, end = window or (None, None)
    pa = import_pyarrow()
    try:
        for message in pa.ipc.MessageReader.open_stream(payload):
            if _compressed(message.metadata.to_pybytes()):
                raise FrameError("ARROW batch with a compressed body")
        reader = pa.ipc.open_stream(payload)
        data = reader.read_next_batch()
        try:
            reader.read_next_batch()
        except StopIteration:
            pass
        else:
            raise FrameError("ARROW body with more than one record batch")
        data.validate(full=True)
    except FrameError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for malformed input; all are the peer's fault
        raise FrameError(f"undecodable ARROW batch: {type(exc).__name__}") from None
    if data.nbytes > max_frame:
        raise FrameError(f"ARROW batch of {data.nbytes} bytes decoded, over the limit of {max_frame}")
    names = data.schema.names
    if len(set(names)) != len(names):
        raise FrameError("ARROW batch with duplicate column names")
    if any(role is not None and role not in names for role in (key, value, ts, start, end)):
        raise FrameError("ARROW roles naming columns the batch has not")
    return ColumnBatch(data, key, value, ts, window_start=start, window_end=end)


def _compressed(metadata: bytes) -> bool:
    """Whether an IPC message's flatbuffer metadata gives its (record or dictionary) batch a compressed body;
    a ``FrameError`` when the metadata points outside itself."""
    try:
        message = _table(metadata, 0)
        kind = _field(metadata, message, _MESSAGE_HEADER_TYPE)
        header = _field(metadata, message, _MESSAGE_HEADER)
        if kind is None or header is None:
            return False
        batch = _table(metadata, header)
        kind_number = metadata[kind]
        if kind_number == _DICTIONARY_BATCH:
            data = _field(metadata, batch, _DICTIONARY_BATCH_DATA)
            if data is None:
                return False
            batch = _table(metadata, data)
        elif kind_number != _RECORD_BATCH:
            return False
        return _field(metadata, batch, _RECORD_BATCH_COMPRESSION) is not None
    except (struct.error, IndexError):
        raise FrameError("undecodable ARROW batch: bad message metadata") from None


def _table(buffer: bytes, at: int) -> int:
    """The position of the flatbuffer table the offset at ``at`` points to."""
    (offset,) = struct.unpack_from("<I", buffer, _within(buffer, at, 4))
    return _within(buffer, at + offset, 4)


def _field(buffer: bytes, table: int, slot: int) -> int | None:
    """The position of field ``slot`` of the flatbuffer table at ``table``, ``None`` when absent."""
    (back,) = struct.unpack_from("<i", buffer, table)
    vtable = _within(buffer, table - back, 4)
    size, _ = struct.unpack_from("<HH", buffer, vtable)
    entry = 4 + 2 * slot
    if entry + 2 > size:
        return None
    (offset,) = struct.unpack_from("<H", buffer, _within(buffer, vtable + entry, 2))
    return None if offset == 0 else _within(buffer, table + offset, 1)


def _within(buffer: bytes, at: int, width: int) -> int:
    if not 0 <= at <= len(buffer) - width:
        raise IndexError(at)
    return at
