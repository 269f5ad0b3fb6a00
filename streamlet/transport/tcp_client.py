"""The sending end of TCP channels: one connection per peer, channels multiplexed over it.

A :class:`TcpChannel` numbers every item it sends (DATA, BARRIER, EOS) and
keeps each frame in its upstream-backup buffer until the receiver
acknowledges it. The buffer is bounded by the channel's credit, which is the
receiving inbox's capacity. When the connection drops, the link reconnects
with backoff, re-authenticates and re-opens its channels. The receiver
answers with the last sequence number it delivered, and the channel resends
what came after it, in order, before anything new. So there is no loss, no
duplicate and no reordering.

A link that has heard nothing from its peer for a quarter of ``peer_timeout``
sends a PING, which the data server answers at once. When the peer has said
nothing for the whole ``peer_timeout`` (a cut that drops packets silently, a
peer that hangs), its channels raise :class:`~streamlet.errors.PeerUnreachable`
naming the link, instead of waiting for ever on a connection TCP would keep
retrying for many minutes; a cluster then ends the attempt, and the job
recovers from its last checkpoint.

A batch whose DATA frame would be over the frame limit goes as several
frames, each an item with its own sequence number and item of credit (the
receiver puts the batch back together). A record too big for a frame on its
own raises :class:`~streamlet.errors.RecordTooLarge` in the sending task.
"""

from __future__ import annotations

import asyncio
import contextlib
import reprlib
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import structlog

from streamlet.core.model import world
from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.items import Item
from streamlet.core.model.record import Barrier, Batch, CaughtUp, EndOfStream, Reconfigure, Watermark
from streamlet.core.runtime.channel import Inbox
from streamlet.errors import AuthenticationError, FrameError, PeerUnreachable, RecordTooLarge, TransportError
from streamlet.transport import auth
from streamlet.transport.arrow_frames import arrow_frames
from streamlet.transport.codec import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_FRAME,
    HEADER,
    MORE,
    FrameType,
    data_body,
    data_frame,
    frame,
    with_header,
)
from streamlet.transport.tcp import DataServer, read_frame
from streamlet.transport.tls import TLS_HANDSHAKE_TIMEOUT, TlsSettings

log = structlog.get_logger("streamlet")
Address = tuple[str, int]
# Seconds a link waits to hear from its peer's data server before its channels give up. Longer than a ZooKeeper
# session (a dead peer's worker is lost first, the usual way); short enough that a cut between two processes
# that both still reach ZooKeeper ends the attempt in seconds, not after TCP's retransmissions (~15 minutes).
PEER_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """Counters of a TCP client."""

    connects: int


class TcpChannel:
    """A :class:`~streamlet.core.runtime.channel.Channel` to an instance in another process.

    One task sends on a channel (the sending instance): the pieces of a split
    batch are numbered before the first is sent.
    """

    def __init__(self, link: _Link, channel_id: str, *, transfer: bool = False) -> None:
        self.link = link
        self.channel_id = channel_id
        self.transfer = transfer  # a one-off transfer: it gives up when the peer's process is gone
        self.max_frame = link.client.max_frame  # the body limit, as the data server checks it
        self.seq = 0
        self.epoch = 0
        self.credit = 0
        self.opened = False
        self.backup: deque[tuple[int, bytes]] = deque()  # sent, not yet acknowledged
        self._resend: deque[tuple[int, bytes]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Event | None = None

    async def wait_acknowledged(self) -> None:
        """Return once the receiver has acknowledged everything sent so far."""
        while self.backup:
            self.link.raise_if_failed()
            self._raise_if_refused()
            self._drained = asyncio.Event()
            await self._drained.wait()

    async def send(self, item: Item) -> None:
        """Send a batch or marker in order; waits for credit (and for the link after a cut).

        Raises :class:`~streamlet.errors.RecordTooLarge` (and sends nothing of
        the batch) when one record of a batch does not fit in a frame.
        """
        if not self._can_send():
            await self._credit()
        elif self.link.silent is not None:  # credit left from before the cut: do not queue more behind it
            raise self.link.silent
        if isinstance(item, ColumnBatch):  # Arrow IPC; cut in row ranges when over the limit
            frames = arrow_frames(self.channel_id, self.epoch, self.seq + 1, item, self.max_frame)
            await self._send_pieces(frames)
            return
        data = self._encode(item, self.seq + 1)  # first: an item that cannot be sent spends nothing
        if len(data) - HEADER.size > self.max_frame:  # the length is known anyway: only a big batch pays more
            assert type(item) is list  # markers are a few bytes
            await self._send_pieces(self._pieces(item, len(data)))
        else:
            self._put(data)
        if isinstance(item, Barrier):
            self.epoch = item.epoch

    async def _credit(self) -> None:
        while not self._can_send():
            self.link.raise_if_failed()
            self._raise_if_refused()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _put(self, data: bytes) -> None:
        self.credit -= 1
        self.seq += 1
        self.backup.append((self.seq, data))
        self.link.write(data)

    async def _send_pieces(self, pieces: list[bytes]) -> None:
        self._put(pieces[0])  # send() has waited for its credit
        for data in pieces[1:]:
            await self._credit()
            self._put(data)

    def _pieces(self, batch: Batch, size: int) -> list[bytes]:
        """DATA frames of ``batch`` within the limit, numbered on from ``seq``; all but the last flagged MORE."""
        # aim at 3/4 of the limit, so that records of uneven size seldom need a second cut
        step = max(1, len(batch) * self.max_frame * 3 // (4 * size))
        todo = deque(batch[start : start + step] for start in range(0, len(batch), step))
        bodies: list[bytes] = []
        while todo:
            part = todo.popleft()
            body = data_body(self.channel_id, self.epoch, self.seq + len(bodies) + 1, part)
            if len(body) <= self.max_frame:
                bodies.append(body)
            elif len(part) > 1:
                todo.extendleft((part[len(part) // 2 :], part[: len(part) // 2]))
            else:
                raise RecordTooLarge(
                    f"channel '{self.channel_id}' cannot send the record with key {reprlib.repr(part[0][0])}: "
                    f"alone it needs a frame of {len(body)} bytes, over the limit of {self.max_frame} (max_frame)"
                )
        total = sum(HEADER.size + len(body) for body in bodies)
        if total > DEFAULT_MAX_BATCH:  # the receiver would close the connection on it: say why here, once
            raise RecordTooLarge(
                f"channel '{self.channel_id}' cannot send a batch of {len(batch)} records: its pieces take "
                f"{total} bytes, over the {DEFAULT_MAX_BATCH} a receiver reassembles (make batches smaller)"
            )
        last = len(bodies) - 1
        return [with_header(FrameType.DATA, body, 0 if index == last else MORE) for index, body in enumerate(bodies)]

    async def aclose(self) -> None:
        """Nothing to release: the link belongs to the client."""

    def abandon(self) -> None:
        """Give the channel up (its transfer failed): its link no longer reopens or resends it."""
        self.link.channels.pop(self.channel_id, None)

    async def release(self) -> None:
        """Wait until everything sent is acknowledged, then drop the channel from its link (a one-off
        transfer is over: the link no longer reopens it after a reconnect)."""
        await self.wait_acknowledged()
        self.abandon()

    def _raise_if_refused(self) -> None:
        """A transfer does not wait for a peer that refuses connections: nobody listens at its address (its
        process is gone; a restarted one knows nothing of the transfer). A stream channel waits for it."""
        if self.transfer and self.link.refused is not None:
            raise ConnectionRefusedError(f"{self.link.peer} refuses connections: {self.link.refused}")

    def _can_send(self) -> bool:
        return self.opened and self.link.up and not self._resend and self.credit > 0

    def _encode(self, item: Item, seq: int) -> bytes:
        if type(item) is list:
            return data_frame(self.channel_id, self.epoch, seq, item)
        if isinstance(item, Barrier):
            return frame(FrameType.BARRIER, [self.channel_id, self.epoch, seq, item.epoch])
        if isinstance(item, EndOfStream):
            return frame(FrameType.EOS, [self.channel_id, self.epoch, seq])
        if isinstance(item, CaughtUp):
            return frame(FrameType.CAUGHT_UP, [self.channel_id, self.epoch, seq])
        if isinstance(item, Watermark):
            return frame(FrameType.WATERMARK, [self.channel_id, self.epoch, seq, item.ts, item.idle])
        if isinstance(item, Reconfigure):
            return frame(FrameType.RECONFIGURE, [self.channel_id, self.epoch, seq, item.id, item.task, item.senders])
        raise TransportError(f"channel {self.channel_id!r} cannot send {item!r} over TCP")

    # -- driven by the link ---------------------------------------------------------

    def reopened(self, last_seq: int, credit: int) -> None:
        """The receiver has everything up to ``last_seq`` and room for ``credit`` items."""
        self.acknowledged(last_seq)
        self.credit = credit
        self.opened = True
        self._resend = deque(self.backup)
        self._pump_resend()
        self._wake()

    def acknowledged(self, seq: int) -> None:
        """Drop backed-up frames the receiver has."""
        while self.backup and self.backup[0][0] <= seq:
            self.backup.popleft()
        if not self.backup and self._drained is not None:
            self._drained.set()

    def granted(self, items: int) -> None:
        """The receiver has room for ``items`` more."""
        self.credit += items
        self._pump_resend()
        self._wake()

    def disconnected(self) -> None:
        """The link dropped: frames in flight are lost until the channel is reopened."""
        self.opened = False
        self._resend.clear()

    def _pump_resend(self) -> None:
        while self._resend and self.credit > 0:
            _seq, data = self._resend.popleft()
            self.credit -= 1
            self.link.write(data)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Link:
    """One authenticated connection to a peer's data server, kept up until the client closes."""

    def __init__(self, client: TcpClient, address: Address, peer: str | None = None) -> None:
        self.client = client
        self.address = address
        self.expected = peer  # the process the server must be (its certificate names it), when known
        self.channels: dict[str, TcpChannel] = {}
        self.up = False
        self.failure: TransportError | None = None
        self.refused: ConnectionRefusedError | None = None  # the last connect was refused (until one succeeds)
        # when the peer last said anything (or the link began), on the loop's clock: time this process spent in
        # a long call of user code, the peer's answers waiting unread, is not the peer's silence
        self.heard = world.loop_time()
        self.silent: PeerUnreachable | None = None  # the peer has been silent too long (until it answers again)
        self._writer: asyncio.StreamWriter | None = None

    def add(self, channel: TcpChannel) -> None:
        self.channels[channel.channel_id] = channel
        self.write(frame(FrameType.OPEN, [channel.channel_id]))

    def write(self, data: bytes) -> None:
        if self.up and self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.silent is not None:
            raise self.silent

    async def run(self) -> None:
        delay = self.client.reconnect_delay
        down = False  # log an outage once, not every retry
        while True:
            try:
                await self._session()
                delay = self.client.reconnect_delay
            except AuthenticationError as exc:  # a wrong secret does not get better by retrying
                self.failure = exc
                self._fail_all()
                return
            except (OSError, asyncio.IncompleteReadError, FrameError, TimeoutError) as exc:
                if isinstance(exc, ConnectionRefusedError):
                    self.refused = exc
                    self._fail_all()  # transfers give up; streams wait on
                if not down:
                    log.warning("data link down, reconnecting", peer=self.peer, reason=str(exc))
                down = self.client.connects == 0 or not self.up
            self._give_up_if_silent()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.client.max_reconnect_delay)

    @property
    def peer(self) -> str:
        """``host:port`` of the data server."""
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def name(self) -> str:
        """``worker-0 -> worker-1 (198.18.0.3:7000)``: the link, as far as this side knows it."""
        here = f"{self.client.name} -> " if self.client.name else ""
        return f"{here}{self.expected or 'data server'} ({self.peer})"

    def _give_up_if_silent(self) -> None:
        """Past the bound without a word from the peer: every channel on the link raises, naming it."""
        quiet = world.loop_time() - self.heard
        if self.silent is None and quiet >= self.client.peer_timeout:
            self.silent = PeerUnreachable(
                f"link {self.name}: no answer for {quiet:.1f} s (peer_timeout {self.client.peer_timeout:g} s); "
                "the network between the two is cut, or the peer hangs"
            )
            log.warning("data link silent, giving up", link=self.name, seconds=round(quiet, 1))
            self._fail_all()

    async def _keep_alive(self, writer: asyncio.StreamWriter) -> None:
        """PING a quiet peer; past the bound, cut the connection (the read ends) and give up on the peer."""
        quarter = self.client.peer_timeout / 4
        while True:
            await asyncio.sleep(quarter)
            quiet = world.loop_time() - self.heard
            if quiet >= self.client.peer_timeout:
                self._give_up_if_silent()
                writer.transport.abort()
                return
            if quiet >= quarter:
                writer.write(frame(FrameType.PING, [0]))

    async def _session(self) -> None:
        async with asyncio.timeout(self.client.connect_timeout):
            reader, writer = await asyncio.open_connection(*self.address, **self._tls())
        try:
            async with asyncio.timeout(self.client.connect_timeout):
                await self._handshake(reader, writer)
            self._writer, self.up, self.refused = writer, True, None
            self.heard, self.silent = world.loop_time(), None
            self.client.connects += 1
            if self.channels:
                writer.write(frame(FrameType.OPEN, list(self.channels)))
            keep_alive = asyncio.ensure_future(self._keep_alive(writer))
            try:
                await self._read_replies(reader)
            finally:
                keep_alive.cancel()
        finally:
            self.up = False
            self._writer = None
            for channel in self.channels.values():
                channel.disconnected()
            with contextlib.suppress(RuntimeError):
                writer.close()

    def _tls(self) -> dict[str, Any]:
        """``open_connection``'s TLS options: none in cleartext; else this process's certificate, and the
        name the server's certificate must carry (the process meant), when known."""
        tls = self.client.tls
        if tls is None:
            return {}
        context = tls.client_context(check_name=self.expected is not None)
        return {"ssl": context, "server_hostname": self.expected, "ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT}

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        secret = self.client.secret
        kind, body = await read_frame(reader, auth.HELLO_MAX)
        if kind is not FrameType.HELLO or len(body) != 2 or body[0] != "challenge" or not isinstance(body[1], bytes):
            raise FrameError("expected a HELLO challenge")
        mine = auth.nonce()
        writer.write(frame(FrameType.HELLO, ["response", mine, auth.client_proof(secret, body[1], mine)]))
        kind, reply = await read_frame(reader, auth.HELLO_MAX)
        if kind is FrameType.ERROR or len(reply) != 2 or reply[0] != "welcome":
            raise AuthenticationError(f"data server {self.peer} refused us: {reply}")
        if not auth.matches(auth.server_proof(secret, body[1], mine), reply[1]):
            raise AuthenticationError(f"data server {self.peer} does not know the secret")

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        while True:
            kind, body = await read_frame(reader, self.client.max_frame)
            self.heard = world.loop_time()
            try:
                self._on_reply(kind, body)
            except (KeyError, TypeError, ValueError) as exc:
                raise FrameError(f"malformed {kind.name} reply from the data server: {exc!r}") from None

    def _on_reply(self, kind: FrameType, body: list[Any]) -> None:
        if kind is FrameType.ACK:
            for channel_id, seq in body:
                if channel_id in self.channels:  # else released: its transfer is over
                    self.channels[channel_id].acknowledged(seq)
        elif kind is FrameType.CREDIT:
            for channel_id, items in body:
                if channel_id in self.channels:
                    self.channels[channel_id].granted(items)
        elif kind is FrameType.OPEN:
            for channel_id, last_seq, credit in body:
                self.channels[channel_id].reopened(last_seq, credit)
        elif kind is FrameType.PING:
            pass  # its answer: heard, which is all it says
        elif kind is FrameType.ERROR:
            raise FrameError(f"the data server closed the connection: {body[0]}")
        else:
            raise FrameError(f"unexpected {kind.name} frame from a data server")

    def _fail_all(self) -> None:
        """Wake every channel waiting on the link, to see why it failed."""
        for channel in self.channels.values():
            channel._wake()
            if channel._drained is not None:
                channel._drained.set()


class TcpClient:
    """Opens channels to data servers; one connection per peer, kept up and re-established.

    ``max_frame`` is the largest frame body it sends (bigger batches go in
    pieces) or reads; give the data servers it talks to the same.
    ``peer_timeout``: seconds without a word from a peer before its channels
    raise :class:`~streamlet.errors.PeerUnreachable`; ``name``: this process,
    as the message names the link.
    """

    def __init__(
        self,
        secret: bytes,
        *,
        reconnect_delay: float = 0.02,
        max_reconnect_delay: float = 1.0,
        connect_timeout: float = 15.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        tls: TlsSettings | None = None,
        peer_timeout: float = PEER_TIMEOUT,
        name: str | None = None,
    ) -> None:
        self.secret = secret
        self.name = name
        self.peer_timeout = peer_timeout
        self.tls = tls  # None: cleartext
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self.connect_timeout = connect_timeout
        self.max_frame = max_frame
        self.connects = 0
        self._links: dict[tuple[Address, str | None], _Link] = {}
        self._group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> TcpClient:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every link."""
        if self._group is not None:
            self._group.cancel_scope.cancel()
            await self._group.__aexit__(None, None, None)
            self._group = None

    def channel(
        self, address: Address, channel_id: str, *, transfer: bool = False, peer: str | None = None
    ) -> TcpChannel:
        """A channel to ``channel_id`` registered at the data server on ``address`` (``transfer``: a one-off
        transfer, which fails with ``ConnectionRefusedError`` when the server refuses connections instead of
        waiting for it to come back, as a stream does; ``peer``: the process serving there, which its TLS
        certificate must name)."""
        link = self._links.get((address, peer))
        if link is None:
            if self._group is None:
                raise TransportError("open the TcpClient (async with) before making channels")
            link = self._links[address, peer] = _Link(self, address, peer)
            self._group.start_soon(link.run)
        channel = TcpChannel(link, channel_id, transfer=transfer)
        link.add(channel)
        return channel

    def statistics(self) -> ClientStatistics:
        """A snapshot of the counters."""
        return ClientStatistics(self.connects)


class LoopbackTransport:
    """Every channel of a job over TCP through one data server in this process (tests, benchmarks)."""

    def __init__(self, server: DataServer, client: TcpClient) -> None:
        self.server = server
        self.client = client
        self._count = 0

    def channel_factory(self, inbox: Inbox, channel: int) -> TcpChannel:
        """Register ``channel`` of ``inbox`` with the server and open a TCP channel to it."""
        self._count += 1
        channel_id = f"c{self._count}"
        self.server.register(channel_id, inbox, channel)
        return self.client.channel(self.server.address, channel_id)


@asynccontextmanager
async def open_loopback_transport(
    secret: bytes = b"loopback", max_frame: int = DEFAULT_MAX_FRAME
) -> AsyncIterator[LoopbackTransport]:
    """A data server and a client on 127.0.0.1, for running a job with every channel over TCP."""
    async with DataServer(secret, max_frame=max_frame) as server, TcpClient(secret, max_frame=max_frame) as client:
        yield LoopbackTransport(server, client)
