"""The control channel between the parent and one worker process, and how records cross it.

Each worker process shares a Unix socket pair with the parent, made before
the fork: nobody else can reach it, so it needs no handshake. A message is a
4-byte big-endian length and a msgpack map, through the project's exact
encoding (:func:`~streamlet.core.model.encoding.packb` /
:func:`~streamlet.core.model.encoding.unpackb`, as frames and checkpoints
use); nothing is ever pickled. Records (what a ``CollectSink`` kept, dead
letters) travel as the body of the data plane's own DATA frame
(:func:`~streamlet.transport.codec.data_body`, read back with
:func:`~streamlet.transport.codec.records_from`), so they come back as the
same record types with the same keys, values, event times and window bounds.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from typing import Any

from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.model.record import Record, Records, elements_of, records_of
from streamlet.errors import JobError
from streamlet.transport.codec import DEFAULT_MAX_FRAME, FrameType, data_body, decode_body, records_from

LENGTH = struct.Struct(">I")
MAX_MESSAGE = 4 * DEFAULT_MAX_FRAME  # a message carries at most one frame body of records, and a little more
CHUNK = 10_000  # records per message; a chunk whose body is too big is halved


class Control:
    """One end of a control channel: whole messages in, whole messages out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, message: dict[str, Any]) -> None:
        """Send ``message`` (a map of encodable values) and wait until the socket took it."""
        body = packb(message)
        if len(body) > MAX_MESSAGE:
            raise JobError(f"a {message['kind']!r} message of {len(body)} bytes is over the limit of {MAX_MESSAGE}")
        self.writer.write(LENGTH.pack(len(body)) + body)
        await self.writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        """The next message; ``None`` once the other end has closed (its process ended)."""
        try:
            header = await self.reader.readexactly(LENGTH.size)
            (length,) = LENGTH.unpack(header)
            if length > MAX_MESSAGE:
                raise JobError(f"control message of {length} bytes, over the limit of {MAX_MESSAGE}")
            body = await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        try:
            message = unpackb(body)
        except Exception as exc:  # noqa: BLE001 - msgpack raises many types for malformed input
            raise JobError(f"undecodable control message: {type(exc).__name__}: {exc}") from None
        if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
            raise JobError(f"malformed control message: {message!r:.200}")
        return message

    def close(self) -> None:
        """Close this end."""
        self.writer.close()


def record_chunks(records: Sequence[Record], where: str) -> list[bytes]:
    """``records`` as DATA frame bodies of at most :data:`CHUNK` records and one frame's size each;
    a record that cannot be encoded is an :class:`~streamlet.errors.EncodingError` naming ``where``."""
    elements = elements_of(list(records))
    todo = [elements[start : start + CHUNK] for start in range(0, len(elements), CHUNK)]
    bodies: list[bytes] = []
    while todo:
        part = todo.pop(0)
        body = data_body(where, 0, 0, part)
        if len(body) <= DEFAULT_MAX_FRAME or len(part) == 1:
            bodies.append(body)
        else:
            todo[:0] = [part[: len(part) // 2], part[len(part) // 2 :]]
    return bodies


def records_in(body: bytes) -> Records:
    """The records of a body made by :func:`record_chunks`."""
    return records_of(records_from(*decode_body(FrameType.DATA, body)[3:]))
