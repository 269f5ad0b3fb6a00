"""Bytes of any size over a channel of their own: a one-off transfer on the data plane.

The bytes are cut into records of at most :data:`CHUNK` bytes (each frame
stays under the frame limit), then end-of-stream; the TCP channel's sequence
numbers, acknowledgements and credit make them arrive once, whole and in
order, across reconnects. Used for the state a live change hands over and
for checkpoint replicas. A receiver takes at most ``max_bytes`` (by default
:data:`DEFAULT_MAX_BLOB`): past that it stops with :class:`BlobTooLarge`
and drops what it had, so a peer cannot grow its memory without bound.
"""

from __future__ import annotations

from streamlet.core.model.record import END_OF_STREAM
from streamlet.core.runtime.channel import Inbox
from streamlet.errors import BlobTooLarge, TransportError
from streamlet.transport.tcp_client import TcpChannel

CHUNK = 1 << 20
DEFAULT_MAX_BLOB = 4 << 30
"""The most bytes :func:`receive_blob` joins unless told otherwise (a checkpoint part, a state handover)."""


async def send_blob(channel: TcpChannel, data: bytes) -> None:
    """``data`` in chunks, then the end of the stream."""
    for start in range(0, len(data), CHUNK):
        await channel.send([(start, data[start : start + CHUNK], None)])
    await channel.send(END_OF_STREAM)


async def receive_blob(inbox: Inbox, channel: int, max_bytes: int = DEFAULT_MAX_BLOB) -> bytes:
    """Everything sent on ``channel`` of ``inbox`` up to its end, joined; :class:`BlobTooLarge` once it
    passes ``max_bytes``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        while inbox.is_empty(channel):
            await inbox.wait()
        item = inbox.pop(channel)
        if type(item) is not list:
            return b"".join(chunks)  # end of stream: the blob is whole
        for element in item:
            chunk = element[1]
            if not isinstance(chunk, bytes):
                raise TransportError(f"a blob chunk of {type(chunk).__name__}, not bytes")
            size += len(chunk)
            if size > max_bytes:
                chunks.clear()
                raise BlobTooLarge(f"a blob passed the {max_bytes} bytes its receiver takes ({size} so far)")
            chunks.append(chunk)
