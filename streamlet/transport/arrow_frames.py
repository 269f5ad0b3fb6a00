"""ARROW frames: a columnar batch over TCP as Arrow IPC, no step per row.

Body (msgpack, like every frame): ``[channel, epoch, seq, key, value, ts,
ipc]`` where ``key``/``value``/``ts`` name the batch's role columns (a
string or ``None``) and ``ipc`` is one record batch in the Arrow IPC stream
format (a schema message, one batch message, the end marker). The frame
limit bounds ``ipc`` before anything is read; decoding accepts exactly one
batch, validates it in full (offsets and lengths within its buffers: Arrow
IPC from an untrusted peer must not reach ``pyarrow.compute`` unchecked),
and checks that the role columns exist. Anything else is a
:class:`~streamlet.errors.FrameError`: the connection is closed and counted
as a bad frame. A batch too big for one frame goes as several smaller
batches (rows in order), each a frame of its own.
"""

from __future__ import annotations

import reprlib
from typing import Any

from streamlet.core.model.columns import ColumnBatch, import_pyarrow
from streamlet.core.model.encoding import packb
from streamlet.errors import FrameError, RecordTooLarge
from streamlet.transport.codec import FrameType, with_header


def arrow_body(channel: str, epoch: int, seq: int, batch: ColumnBatch) -> bytes:
    """The packed body of an ARROW frame for ``batch``."""
    pa = import_pyarrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.data.schema) as writer:
        writer.write_batch(batch.data)
    return packb([channel, epoch, seq, batch.key, batch.value, batch.ts, sink.getvalue().to_pybytes()])


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


def columns_from(key: Any, value: Any, ts: Any, payload: Any) -> ColumnBatch:
    """The columnar batch of an ARROW frame's body, checked (see the module docstring)."""
    if not all(role is None or type(role) is str for role in (key, value, ts)) or type(payload) is not bytes:
        raise FrameError("malformed ARROW body")
    pa = import_pyarrow()
    try:
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
    names = data.schema.names
    if any(role is not None and role not in names for role in (key, value, ts)):
        raise FrameError("ARROW roles naming columns the batch has not")
    return ColumnBatch(data, key, value, ts)
