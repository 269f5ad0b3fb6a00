"""The receiving end of TCP channels: one data server per process.

Channels are multiplexed over connections by channel id. For every channel
registered here the server keeps an *inlet*: the inbox channel it feeds, the
last sequence number delivered (duplicates after a resend are dropped) and
the credit the sender holds. Credit is counted in items: a sender may have
at most the inbox channel's capacity in flight or queued, and gets one item
of credit back each time the receiving instance takes an item, so a slow
receiver slows the sender down and memory stays bounded on both sides.

A batch too big for one frame comes as several DATA frames, each but the
last flagged :data:`~streamlet.transport.codec.MORE`. The inlet keeps the
pieces and puts the whole batch into the inbox with the last one, so the
receiving instance sees the batch the sender made (a loop counts batches in
flight, and a piece counted as a batch would end it early). A piece never
waits in the inbox, so its item of credit goes straight back; what bounds the
memory pieces take is ``max_batch``: the frames of one batch in pieces may
add up to that many bytes, and a peer that sends more is closed like one
sending any bad frame (counted in ``bad_frames``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.items import Item
from streamlet.core.model.record import CAUGHT_UP, END_OF_STREAM, Barrier, Batch, Reconfigure, Watermark
from streamlet.core.runtime.channel import Inbox
from streamlet.errors import FrameError
from streamlet.transport import auth
from streamlet.transport.arrow_frames import columns_from
from streamlet.transport.codec import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_FRAME,
    HEADER,
    MORE,
    FrameType,
    decode_body,
    frame,
    parse_header,
    records_from,
)
from streamlet.transport.tls import TLS_HANDSHAKE_TIMEOUT, TlsSettings

log = structlog.get_logger("streamlet")
HANDSHAKE_TIMEOUT = 15.0  # as TLS_HANDSHAKE_TIMEOUT: the two sides' loops may each be held by user code a while
_GONE = (asyncio.IncompleteReadError, ConnectionError, TimeoutError)
MAX_WAITING_OPENS = 10_000  # channels opened before their receiver registered them, at most, per server


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """Counters of a data server."""

    connections: int
    active: int
    frames: int
    records: int
    duplicates: int
    bad_frames: int
    auth_failures: int
    bytes: int = 0  # frames' bytes received, headers included
    tls_refused: int = 0  # TLS handshakes refused: plain TCP, no certificate or another CA's, too slow


class _Inlet:
    """Receiver-side state of one channel."""

    __slots__ = (
        "channel", "channel_id", "granted", "inbox", "last_seq", "link", "outstanding", "partial", "partial_bytes",
        "window",
    )  # fmt: skip

    def __init__(self, channel_id: str, inbox: Inbox, channel: int) -> None:
        self.channel_id = channel_id
        self.inbox = inbox
        self.channel = channel
        self.window = inbox.capacity(channel)
        self.last_seq = 0
        self.outstanding = 0  # credit the sender holds
        self.granted = 0  # credit given since the last CREDIT frame
        self.link: _Connection | None = None
        self.partial: Batch | None = None  # the pieces so far of a batch sent in several frames
        self.partial_bytes = 0  # the size of their frames

    def assemble(self, flags: int, item: Item, size: int, max_batch: int) -> Item | None:
        """The item to deliver, or ``None`` while more pieces of its batch are to come; a batch whose pieces'
        frames pass ``max_batch`` bytes is a :class:`FrameError`."""
        if type(item) is not list:
            return item
        self.partial_bytes += size
        if self.partial_bytes > max_batch:
            raise FrameError(
                f"channel {self.channel_id!r}: a batch sent in pieces passed {max_batch} bytes "
                f"({self.partial_bytes} so far)"
            )
        if self.partial is not None:
            self.partial.extend(item)
            item = self.partial
        if flags & MORE:
            self.partial = item
            return None
        self.partial, self.partial_bytes = None, 0
        return item


class DataServer:
    """Accepts authenticated connections and delivers their frames into inboxes.

    Example:
        >>> async def serve(inbox):
        ...     async with DataServer(b"cluster secret") as server:
        ...         server.register("job/count.0@0/split.1", inbox, inbox.add_channel(0))
    """

    def __init__(
        self,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_batch: int = DEFAULT_MAX_BATCH,
        tls: TlsSettings | None = None,
        advertise: str | None = None,
    ) -> None:
        self.secret = secret
        self.tls = tls  # None: cleartext (loopback benchmarks, tests of the wire format)
        self.host = host  # listened on (0.0.0.0: every address)
        self.advertised = advertise or host  # what peers connect to: published, and sent for replies
        self.port = port
        self.max_frame = max_frame
        if max_batch < max_frame:
            raise ValueError(f"max_batch ({max_batch}) must be at least max_frame ({max_frame})")
        self.max_batch = max_batch  # bytes of frames one batch sent in pieces may take while it is reassembled
        self._inlets: dict[str, _Inlet] = {}
        self._acceptors: dict[str, Callable[[str], tuple[Inbox, int]]] = {}
        self._server: asyncio.Server | None = None  # cleartext
        self._listener: socket.socket | None = None  # TLS: accepted by hand
        self._accepting: asyncio.Task[None] | None = None
        self._connections: set[_Connection] = set()
        self._handshakes: set[asyncio.Task[None]] = set()  # TLS connections: handshaking, then served
        self._refusal = asyncio.Event()  # set, and replaced, at each refused handshake
        # channels a sender opened before their receiver registered them: credit comes at register()
        self._waiting: dict[str, _Connection] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        self.counts = {
            "connections": 0, "frames": 0, "records": 0, "duplicates": 0, "bad_frames": 0, "auth_failures": 0,
            "bytes": 0, "tls_refused": 0,
        }  # fmt: skip

    async def __aenter__(self) -> DataServer:
        if self.tls is None:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
            self.port = self._server.sockets[0].getsockname()[1]
        else:  # sockets accepted by hand, TLS started on each: every refused handshake is seen (transport.tls)
            self._listener = socket.create_server((self.host, self.port), backlog=128)
            self._listener.setblocking(False)
            self.port = self._listener.getsockname()[1]
            self._accepting = asyncio.get_running_loop().create_task(self._accept())
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop accepting and close every connection."""
        if self._listener is not None:
            await self._stop_accepting()
        elif self._server is None:
            return
        else:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()
        await self._drained.wait()  # the handlers see their closed sockets and finish
        self._server = None

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` senders connect to (the advertised host, when not the one listened on)."""
        return self.advertised, self.port

    def register(self, channel_id: str, inbox: Inbox, channel: int) -> None:
        """Frames for ``channel_id`` go to ``channel`` of ``inbox``; a sender that opened it already (and
        waits, without credit) gets its credit now."""
        inlet = self._inlets[channel_id] = _Inlet(channel_id, inbox, channel)
        inbox.on_pop(channel, lambda: self._consumed(inlet))
        waiting = self._waiting.pop(channel_id, None)
        if waiting is not None and waiting in self._connections:
            inlet.link = waiting
            inlet.outstanding = inlet.granted = max(0, inlet.window - inbox.queued(channel))
            waiting.grant(inlet)

    def accept(self, prefix: str, factory: Callable[[str], tuple[Inbox, int]]) -> None:
        """Channels named ``prefix...`` that nobody registered are made on demand when a sender opens them:
        ``factory(channel_id)`` gives the inbox channel their frames go to (for one-off transfers, e.g. a
        checkpoint replica, whose receiver cannot know the name in advance)."""
        self._acceptors[prefix] = factory

    def unregister(self, channel_id: str) -> None:
        """Forget a channel (its transfer is over); later frames for it are refused."""
        self._inlets.pop(channel_id, None)

    def forget_waiting(self, connection: _Connection) -> None:
        """``connection`` is gone: the opens it left waiting go with it (its sender opens them again)."""
        for channel_id in [cid for cid, waiting in self._waiting.items() if waiting is connection]:
            del self._waiting[channel_id]

    def statistics(self) -> ServerStatistics:
        """A snapshot of the counters."""
        return ServerStatistics(active=len(self._connections), **self.counts)

    def _consumed(self, inlet: _Inlet) -> None:
        # The instance took an item: the sender may send one more.
        if inlet.link is not None and inlet.outstanding + inlet.inbox.queued(inlet.channel) < inlet.window:
            inlet.outstanding += 1
            inlet.granted += 1
            inlet.link.grant(inlet)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(self, reader, writer)
        self._connections.add(connection)
        self._drained.clear()
        self.counts["connections"] += 1
        try:
            await connection.serve()
        finally:
            connection.detach()
            connection.close()
            self._connections.discard(connection)
            if not self._connections:
                self._drained.set()

    async def _accept(self) -> None:
        """Accept connections for ever, each handed to a TLS handshake of its own."""
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        while True:
            connection, _ = await loop.sock_accept(self._listener)
            task = loop.create_task(self._serve_tls(connection))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _stop_accepting(self) -> None:
        assert self._listener is not None
        assert self._accepting is not None
        self._accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._accepting
        for handshake in list(self._handshakes):
            handshake.cancel()
        self._listener.close()
        self._listener = None

    async def _serve_tls(self, accepted: socket.socket) -> None:
        """TLS on an accepted socket (nothing read from it yet), the client's certificate checked against the
        cluster CA; then served as any. A refusal (plain TCP, no certificate, another CA's, a handshake too
        slow) is counted and the connection dropped."""
        assert self.tls is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        peer = accepted.getpeername()
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, accepted, ssl=self.tls.server_context(), ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT
            )
        except (OSError, TimeoutError, EOFError) as exc:  # ssl.SSLError is an OSError
            log.warning("TLS handshake refused", peer=str(peer), reason=f"{type(exc).__name__}: {exc}")
            self.counts["tls_refused"] += 1
            self._refusal.set()  # after the count: a waiter wakes to see it
            self._refusal = asyncio.Event()
            accepted.close()
            return
        await self._serve(reader, asyncio.StreamWriter(transport, protocol, reader, loop))

    async def refused(self, count: int) -> None:
        """Return once ``count`` TLS handshakes in all were refused (the asyncio loop may tell a client of a
        failed handshake before the server's handler sees it: this is when the server has)."""
        while self.counts["tls_refused"] < count:
            await self._refusal.wait()

    # -- called by connections --------------------------------------------------

    def open(self, connection: _Connection, channel_ids: list[Any]) -> list[list[Any]]:
        """A sender (re)attaches channels: their last delivered seq and fresh credit."""
        replies = []
        for channel_id in channel_ids:
            inlet = self._inlets.get(channel_id) if isinstance(channel_id, str) else None
            if inlet is None:
                inlet = self._accepted(channel_id)
            if inlet is None:  # not registered yet (its instance is still restoring): no credit until it is
                self._wait_for(connection, channel_id)
                replies.append([channel_id, 0, 0])
                continue
            inlet.link = connection
            inlet.outstanding = max(0, inlet.window - inlet.inbox.queued(inlet.channel))
            inlet.granted = 0
            replies.append([channel_id, inlet.last_seq, inlet.outstanding])
        return replies

    def _accepted(self, channel_id: Any) -> _Inlet | None:
        if not isinstance(channel_id, str):
            raise FrameError(f"a channel is named by a string, not {channel_id!r}")
        for prefix, factory in self._acceptors.items():
            if channel_id.startswith(prefix):
                self.register(channel_id, *factory(channel_id))
                return self._inlets[channel_id]
        return None

    def _wait_for(self, connection: _Connection, channel_id: str) -> None:
        """Hold a sender's open of a channel nobody registered yet. Closing the connection instead would cut
        every other channel on it, among them the answers a restoring receiver waits for before it can
        register this one."""
        if channel_id not in self._waiting and len(self._waiting) >= MAX_WAITING_OPENS:
            raise FrameError(f"unknown channel {channel_id!r} ({MAX_WAITING_OPENS} opens wait already)")
        self._waiting[channel_id] = connection

    def deliver(self, connection: _Connection, kind: FrameType, body: list[Any], flags: int = 0, size: int = 0) -> None:
        """One DATA, BARRIER, WATERMARK or EOS frame of ``size`` bytes: drop it if seen, else into the inbox (a
        batch once its last piece is in, and only while its pieces stay within ``max_batch`` bytes)."""
        channel_id, seq = body[0], body[2]
        inlet = self._inlets.get(channel_id) if isinstance(channel_id, str) else None
        if inlet is None or inlet.link is not connection:
            raise FrameError(f"frame for a channel not opened on this connection: {channel_id!r}")
        if not isinstance(seq, int) or seq > inlet.last_seq + 1:
            raise FrameError(f"channel {channel_id!r}: sequence {seq!r} after {inlet.last_seq}")
        if seq <= inlet.last_seq:
            self.counts["duplicates"] += 1
            return
        if inlet.outstanding <= 0:
            raise FrameError(f"channel {channel_id!r}: sent without credit")
        if inlet.partial is not None and kind is not FrameType.DATA:
            raise FrameError(f"channel {channel_id!r}: {kind.name} inside a batch sent in pieces")
        item = _item(kind, body, self.max_frame)
        if type(item) is list or type(item) is ColumnBatch:
            self.counts["records"] += len(item)
        inlet.outstanding -= 1
        inlet.last_seq = seq
        whole = inlet.assemble(flags, item, size, self.max_batch)
        if whole is None:
            self._consumed(inlet)  # a piece never waits in the inbox: its credit goes straight back
        else:
            inlet.inbox.put_nowait(inlet.channel, whole)
        connection.acknowledge(inlet)


_DELIVERED = frozenset({
    FrameType.DATA, FrameType.ARROW, FrameType.BARRIER, FrameType.EOS, FrameType.WATERMARK, FrameType.RECONFIGURE,
    FrameType.CAUGHT_UP,
})  # fmt: skip


def _item(kind: FrameType, body: list[Any], max_frame: int) -> Item:
    if kind is FrameType.DATA:
        return records_from(*body[3:])
    if kind is FrameType.ARROW:
        return columns_from(*body[3:], max_frame=max_frame)
    if kind is FrameType.BARRIER:
        if not isinstance(body[3], int):
            raise FrameError("malformed BARRIER body")
        return Barrier(body[3])
    if kind is FrameType.WATERMARK:
        ts, idle = body[3], body[4]
        if type(idle) is not bool or isinstance(ts, bool) or not isinstance(ts, int | float) or ts != ts:
            raise FrameError("malformed WATERMARK body")
        return Watermark(float(ts), idle)
    if kind is FrameType.RECONFIGURE:
        ident, task, senders = body[3], body[4], body[5]
        if type(ident) is not int or type(task) is not str or type(senders) is not int or senders < 1:
            raise FrameError("malformed RECONFIGURE body")
        return Reconfigure(ident, task, senders)
    if kind is FrameType.CAUGHT_UP:
        return CAUGHT_UP
    return END_OF_STREAM


async def read_frame(reader: asyncio.StreamReader, max_length: int) -> tuple[FrameType, list[Any]]:
    """The next frame: the header is checked before the body is read."""
    kind, _flags, body, _size = await read_flagged_frame(reader, max_length)
    return kind, body


async def read_flagged_frame(
    reader: asyncio.StreamReader, max_length: int, counts: dict[str, int] | None = None
) -> tuple[FrameType, int, list[Any], int]:
    """The next frame with the flags of its header and its size: ``(type, flags, body, bytes)``; the size is
    added to ``counts["bytes"]`` when given."""
    kind, flags, length = parse_header(await reader.readexactly(HEADER.size), max_length)
    if counts is not None:
        counts["bytes"] += HEADER.size + length
    body = await reader.readexactly(length) if length else b""
    return kind, flags, decode_body(kind, body), HEADER.size + length


class _Connection:
    """One accepted connection: handshake, then frames until it closes or misbehaves."""

    def __init__(self, server: DataServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self._acks: dict[str, _Inlet] = {}
        self._credits: dict[str, _Inlet] = {}
        self._flush_scheduled = False

    async def serve(self) -> None:
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                authenticated = await self._handshake()
            while authenticated:
                kind, flags, body, size = await read_flagged_frame(
                    self.reader, self.server.max_frame, self.server.counts
                )
                self.server.counts["frames"] += 1
                self._handle(kind, flags, body, size)
        except FrameError as exc:
            self.server.counts["bad_frames"] += 1
            log.warning("closing data connection", reason=exc.reason)
            self._write(frame(FrameType.ERROR, [exc.reason]))
        except _GONE:
            pass  # the peer went away (or stalled in the handshake); a sender reconnects and resends

    async def _handshake(self) -> bool:
        challenge = auth.nonce()
        self._write(frame(FrameType.HELLO, ["challenge", challenge]))
        kind, body = await read_frame(self.reader, auth.HELLO_MAX)
        ok = kind is FrameType.HELLO and len(body) == 3 and body[0] == "response" and isinstance(body[1], bytes)
        if not ok or not auth.matches(auth.client_proof(self.server.secret, challenge, body[1]), body[2]):
            self.server.counts["auth_failures"] += 1
            log.warning("data connection failed authentication")
            self._write(frame(FrameType.ERROR, ["authentication failed"]))
            return False
        self._write(frame(FrameType.HELLO, ["welcome", auth.server_proof(self.server.secret, challenge, body[1])]))
        return True

    def _handle(self, kind: FrameType, flags: int, body: list[Any], size: int) -> None:
        if kind in _DELIVERED:
            self.server.deliver(self, kind, body, flags, size)
        elif kind is FrameType.OPEN:
            self._write(frame(FrameType.OPEN, self.server.open(self, body)))
        elif kind is FrameType.PING:  # the sender checks we are there: answer at once, whatever else waits
            self._write(frame(FrameType.PING, body))
        else:
            raise FrameError(f"unexpected {kind.name} frame from a sender")

    # -- replies, coalesced: one ACK and one CREDIT frame per turn of the event loop ----------

    def acknowledge(self, inlet: _Inlet) -> None:
        self._acks[inlet.channel_id] = inlet
        self._schedule_flush()

    def grant(self, inlet: _Inlet) -> None:
        self._credits[inlet.channel_id] = inlet
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        parts = []
        if self._acks:
            parts.append(frame(FrameType.ACK, [[cid, inlet.last_seq] for cid, inlet in self._acks.items()]))
            self._acks.clear()
        if self._credits:
            parts.append(frame(FrameType.CREDIT, [[cid, inlet.granted] for cid, inlet in self._credits.items()]))
            for inlet in self._credits.values():
                inlet.granted = 0
            self._credits.clear()
        if parts:
            self._write(b"".join(parts))

    def _write(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may already be closing
            self.writer.close()

    def detach(self) -> None:
        for inlet in self.server._inlets.values():
            if inlet.link is self:
                inlet.link = None
        self.server.forget_waiting(self)
