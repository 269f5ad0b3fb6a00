"""Bytes of any size over a channel of their own: a one-off transfer on the data plane.

The bytes are cut into records of at most :data:`CHUNK` bytes (each frame
stays under the frame limit), then end-of-stream; the TCP channel's sequence
numbers, acknowledgements and credit make them arrive once, whole and in
order, across reconnects. Used for the state a live change hands over and
for checkpoint replicas.
"""

from __future__ import annotations

from streamlet.core.model.record import END_OF_STREAM
from streamlet.core.runtime.channel import Inbox
from streamlet.errors import TransportError
from streamlet.transport.tcp_client import TcpChannel

CHUNK = 1 << 20


async def send_blob(channel: TcpChannel, data: bytes) -> None:
    """``data`` in chunks, then the end of the stream."""
    for start in range(0, len(data), CHUNK):
        await channel.send([(start, data[start : start + CHUNK], None)])
    await channel.send(END_OF_STREAM)


async def receive_blob(inbox: Inbox, channel: int) -> bytes:
    """Everything sent on ``channel`` of ``inbox`` up to its end, joined."""
    chunks: list[bytes] = []
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
            chunks.append(chunk)
