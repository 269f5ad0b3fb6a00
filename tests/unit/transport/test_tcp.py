"""TCP channels on loopback: delivery in order, authentication, bad peers, credit, cuts, corruption, frame limit."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from streamlet.core.model.items import Item
from streamlet.core.model.record import CAUGHT_UP, END_OF_STREAM, Barrier, Batch
from streamlet.core.runtime.channel import Inbox
from streamlet.errors import RecordTooLarge, TransportError
from streamlet.transport import auth, tcp_client
from streamlet.transport.codec import (
    DEFAULT_MAX_FRAME,
    HEADER,
    MAGIC,
    MORE,
    VERSION,
    FrameType,
    data_body,
    data_frame,
    frame,
    with_header,
)
from streamlet.transport.tcp import DataServer, read_frame
from streamlet.transport.tcp_client import TcpChannel, TcpClient
from tests.support.exact_values import same_shape
from tests.unit.transport.proxy import CuttingProxy

SECRET = b"cluster secret"
CHANNEL = "job/sink.0@0/source.0"
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def batch(*numbers: int) -> Batch:
    """Elements keyed ``k<n % 7>`` with value ``n`` and event time ``n / 2``."""
    return [(f"k{n % 7}", n, n / 2) for n in numbers]


def header(kind: int, length: int, magic: bytes = MAGIC) -> bytes:
    """A frame header announcing ``length`` body bytes."""
    return HEADER.pack(magic, VERSION, kind, 0, length)


async def until(condition: Callable[[], bool]) -> None:
    """Wait (at most 2 s) until ``condition()`` holds."""
    async with asyncio.timeout(2):
        while not condition():  # noqa: ASYNC110 - the server's counters have no event to wait on
            await asyncio.sleep(0.005)


@dataclass
class Pipe:
    """A TCP channel from a client into channel 0 of an inbox registered with a server."""

    server: DataServer
    client: TcpClient
    inbox: Inbox
    sender: TcpChannel

    async def take(self) -> Item:
        """The next item that arrived, waiting at most 2 s for it."""
        async with asyncio.timeout(2):
            while self.inbox.is_empty(0):
                await self.inbox.wait()
        return self.inbox.pop(0)


@asynccontextmanager
async def opened(
    server: DataServer, *, capacity: int = 8, secret: bytes = SECRET, via: tuple[str, int] | None = None
) -> AsyncIterator[Pipe]:
    """A client with one channel ``CHANNEL`` to ``server`` (through ``via`` when given) and the same frame limit."""
    inbox = Inbox(capacity)
    server.register(CHANNEL, inbox, inbox.add_channel(0))
    async with TcpClient(secret, max_frame=server.max_frame) as client:
        yield Pipe(server, client, inbox, client.channel(via or server.address, CHANNEL))


@asynccontextmanager
async def raw(server: DataServer) -> AsyncIterator[Streams]:
    """A plain socket to ``server``, closed on exit."""
    reader, writer = await asyncio.open_connection(*server.address)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The client side of the HELLO handshake, by hand."""
    kind, (tag, challenge) = await read_frame(reader, auth.HELLO_MAX)
    assert (kind, tag) == (FrameType.HELLO, "challenge")
    mine = auth.nonce()
    writer.write(frame(FrameType.HELLO, ["response", mine, auth.client_proof(SECRET, challenge, mine)]))
    welcome = ["welcome", auth.server_proof(SECRET, challenge, mine)]
    assert await read_frame(reader, auth.HELLO_MAX) == (FrameType.HELLO, welcome)


async def refusal(reader: asyncio.StreamReader) -> str:
    """The reason of the ERROR frame the server sends; the connection must then be closed."""
    kind, body = await read_frame(reader, DEFAULT_MAX_FRAME)
    assert kind is FrameType.ERROR
    assert await reader.read() == b""
    return str(body[0])


async def test_channel_delivers_batches_and_markers_in_order() -> None:
    """Batches, a Barrier, CaughtUp and EndOfStream arrive in order as equal Records and markers."""
    async with DataServer(SECRET) as server, opened(server) as pipe:
        items: list[Item] = [batch(1, 2), [(("user", 7), {"n": [1, 2]}, None)], Barrier(3), CAUGHT_UP, batch(3)]
        for item in [*items, END_OF_STREAM]:
            await pipe.sender.send(item)
        assert [await pipe.take() for _ in range(6)] == [*items, END_OF_STREAM]
        stats = server.statistics()
        assert (stats.connections, stats.frames, stats.duplicates, stats.bad_frames) == (1, 7, 0, 0)


async def test_values_cross_with_their_types() -> None:
    """A tuple value, an int-keyed dict value, a tuple key and a list key arrive identical, types and all."""
    sent = [
        (("user", 7), (1, (2.5, "x")), 1.0),
        (3, {1: "one", 2: (None, b"b"), -5: {(1, 2): [()]}}, None),
        ([1, (2,)], [(3, 4), [5]], 2.5),
    ]
    async with DataServer(SECRET) as server, opened(server) as pipe:
        await pipe.sender.send(sent)
        received = await pipe.take()
    assert received == sent
    assert isinstance(received, list)
    assert [type(element) for element in received] == [tuple, tuple, tuple]
    for got, want in zip(received, sent, strict=True):
        assert same_shape(got, want)


async def test_wrong_secret_fails_the_send() -> None:
    """A client with the wrong secret gets a TransportError; the server counts one auth failure."""
    async with DataServer(SECRET) as server, opened(server, secret=b"not the secret") as pipe:
        message = rf"^data server 127\.0\.0\.1:{server.port} refused us: \['authentication failed'\]$"
        with pytest.raises(TransportError, match=message):
            async with asyncio.timeout(2):
                await pipe.sender.send(batch(1))
        stats = server.statistics()
        assert (stats.connections, stats.auth_failures, stats.bad_frames, stats.frames) == (1, 1, 0, 0)
        assert pipe.inbox.queued(0) == 0


EXT = b"\xd4\x05x"  # msgpack ExtType(5, b"x")
ABUSES = {
    "bad-magic": (False, header(FrameType.HELLO, 0, magic=b"XX"), "bad magic b'XX'", (1, 0)),
    "oversized-hello": (
        False,
        header(FrameType.HELLO, 1025),
        "frame of 1025 bytes exceeds the maximum of 1024",
        (1, 0),
    ),
    "data-before-auth": (False, data_frame(CHANNEL, 0, 1, batch(9)), "authentication failed", (0, 1)),
    "oversized-data": (
        True,
        header(FrameType.DATA, DEFAULT_MAX_FRAME + 1),
        f"frame of {DEFAULT_MAX_FRAME + 1} bytes exceeds the maximum of {DEFAULT_MAX_FRAME}",
        (1, 0),
    ),
    "ext-type": (True, header(FrameType.DATA, len(EXT)) + EXT, "msgpack extension type 5 is not allowed", (1, 0)),
}


@pytest.mark.parametrize(("authenticated", "garbage", "reason", "counts"), ABUSES.values(), ids=ABUSES.keys())
async def test_bad_peer_is_closed_and_others_keep_working(
    authenticated: bool, garbage: bytes, reason: str, counts: tuple[int, int]
) -> None:
    """A socket sending garbage gets an ERROR and is closed; a good client is served before, during and after."""
    async with DataServer(SECRET) as server, opened(server) as good:
        await good.sender.send(batch(1))
        assert await good.take() == batch(1)
        async with raw(server) as (reader, writer):
            if authenticated:
                await authenticate(reader, writer)
            else:
                await read_frame(reader, auth.HELLO_MAX)  # the challenge
            await good.sender.send(batch(2))
            assert await good.take() == batch(2)
            writer.write(garbage)
            assert await refusal(reader) == reason
        await until(lambda: server.statistics().active == 1)
        await good.sender.send(batch(3))
        assert await good.take() == batch(3)
        stats = server.statistics()
        assert (stats.bad_frames, stats.auth_failures) == counts
        assert (stats.connections, stats.frames, stats.duplicates, good.inbox.queued(0)) == (2, 4, 0, 0)


async def test_credit_blocks_the_sender_until_the_receiver_takes() -> None:
    """With capacity 2 and nothing taken, a third send waits; taking one item lets it through."""
    async with DataServer(SECRET) as server, opened(server, capacity=2) as pipe:
        await pipe.sender.send(batch(1))
        await pipe.sender.send(batch(2))
        third = asyncio.create_task(pipe.sender.send(batch(3)))
        await until(lambda: pipe.inbox.queued(0) == 2)
        await asyncio.sleep(0.05)
        assert third.done() is False
        assert len(pipe.sender.backup) <= 2
        assert (pipe.sender.credit, pipe.inbox.queued(0)) == (0, 2)
        assert pipe.inbox.pop(0) == batch(1)
        async with asyncio.timeout(2):
            await third
        await until(lambda: pipe.inbox.queued(0) == 2)
        assert [pipe.inbox.pop(0), pipe.inbox.pop(0)] == [batch(2), batch(3)]
        assert server.statistics().duplicates == 0


def frames_of(count: int) -> list[Batch]:
    """``count`` batches of 10 records numbered 0, 1, ... in order."""
    return [batch(*range(10 * index, 10 * index + 10)) for index in range(count)]


def bytes_before(batches: list[Batch], index: int) -> int:
    """Bytes a client sends before DATA frame ``index`` (0-based): HELLO response, OPEN, the DATA frames before it."""
    hello = frame(FrameType.HELLO, ["response", bytes(auth.NONCE_BYTES), bytes(32)])
    opening = frame(FrameType.OPEN, [CHANNEL])
    data = [data_frame(CHANNEL, 0, seq, item) for seq, item in enumerate(batches[:index], start=1)]
    return len(hello) + len(opening) + sum(map(len, data))


async def send_through(proxy: CuttingProxy, server: DataServer, batches: list[Batch]) -> Batch:
    """Send ``batches`` via ``proxy`` while a consumer takes them; every record received, in order."""
    async with opened(server, capacity=4, via=proxy.address) as pipe:
        received: Batch = []

        async def consume() -> None:
            while len(received) < 10 * len(batches):
                item = await pipe.take()
                assert type(item) is list
                received.extend(item)

        consumer = asyncio.create_task(consume())
        try:
            for item in batches:
                await pipe.sender.send(item)
            async with asyncio.timeout(4):
                await consumer
        finally:
            consumer.cancel()
        assert pipe.client.statistics().connects >= 2
        return received


async def test_cut_mid_frame_loses_nothing_and_duplicates_nothing() -> None:
    """A connection cut inside a DATA frame: the client reconnects and resends; every record arrives once, in order."""
    batches = frames_of(200)
    middle = bytes_before(batches, 100) + len(data_frame(CHANNEL, 0, 101, batches[100])) // 2
    async with DataServer(SECRET) as server, CuttingProxy(server.address, middle) as proxy:
        assert await send_through(proxy, server, batches) == [record for item in batches for record in item]
        stats = server.statistics()
        assert (proxy.cuts, proxy.connections, stats.frames, stats.duplicates, stats.bad_frames) == (1, 2, 202, 0, 0)


async def test_garbage_in_transit_makes_the_client_reconnect() -> None:
    """Bytes corrupted between frames: the server refuses the connection, the client reconnects and resends."""
    batches = frames_of(200)
    garbage = header(FrameType.DATA, 0, magic=b"XX")
    async with DataServer(SECRET) as server, CuttingProxy(server.address, bytes_before(batches, 100), garbage) as proxy:
        assert await send_through(proxy, server, batches) == [record for item in batches for record in item]
        stats = server.statistics()
        assert (proxy.cuts, proxy.connections, stats.frames, stats.duplicates, stats.bad_frames) == (1, 2, 202, 0, 1)


async def test_refused_item_leaves_the_channel_usable() -> None:
    """Sending what TCP cannot carry raises TransportError; the next batch still arrives."""
    async with DataServer(SECRET) as server, opened(server) as pipe:
        with pytest.raises(TransportError, match=rf"^channel '{CHANNEL}' cannot send 42 over TCP$"):
            await pipe.sender.send(42)  # type: ignore[arg-type]
        await pipe.sender.send(batch(1))
        await until(lambda: pipe.inbox.queued(0) + server.statistics().bad_frames > 0)
        assert (server.statistics().bad_frames, pipe.inbox.queued(0)) == (0, 1)
        assert pipe.inbox.pop(0) == batch(1)


ABUSE_CYCLE = [header(FrameType.HELLO, 0, magic=b"XX"), header(FrameType.HELLO, 5000), ABUSES["data-before-auth"][1]]


async def abuse(server: DataServer, number: int) -> None:
    """One bad connection: garbage (kind ``number % 4``) after the challenge; the last kind hangs up mid-header."""
    async with raw(server) as (reader, writer):
        await read_frame(reader, auth.HELLO_MAX)
        if number % 4 == 3:
            writer.write(b"SL\x01")
            return
        writer.write(ABUSE_CYCLE[number % 4])
        await refusal(reader)


async def test_stream_of_bad_connections_leaves_nothing_behind() -> None:
    """200 abusive connections, one after another: all closed, counted exactly, and a good client is served."""
    async with DataServer(SECRET) as server:
        for number in range(200):
            await abuse(server, number)
        await until(lambda: server.statistics().active == 0)
        stats = server.statistics()
        assert (stats.connections, stats.bad_frames, stats.auth_failures, stats.frames) == (200, 100, 50, 0)
        async with opened(server) as good:
            await good.sender.send(batch(1))
            assert await good.take() == batch(1)
        assert server.statistics().connections == 201


LIMIT = 64 * 1024


def big_batch(count: int, size: int = 1024) -> Batch:
    """``count`` records of ``size`` bytes each, keyed and numbered in order."""
    return [(f"k{n}", bytes([n % 251]) * size, float(n)) for n in range(count)]


async def test_batch_over_the_frame_limit_arrives_whole_in_order_once() -> None:
    """A 300 KiB batch with a 64 KiB limit goes in several frames and arrives as one batch, then the next item."""
    records = big_batch(300)
    assert len(data_frame(CHANNEL, 0, 1, records)) > 4 * LIMIT
    async with DataServer(SECRET, max_frame=LIMIT) as server, opened(server, capacity=2) as pipe:
        await pipe.sender.send(records)
        await pipe.sender.send(batch(1))
        assert [await pipe.take(), await pipe.take()] == [records, batch(1)]
        stats = server.statistics()
        assert (stats.bad_frames, stats.duplicates, stats.records) == (0, 0, 301)
        assert stats.frames == 1 + pipe.sender.seq  # OPEN, then one frame per item sent
        assert pipe.sender.seq > 5
        await until(lambda: pipe.sender.credit == 2)  # every piece's credit came back
        assert pipe.inbox.queued(0) == 0


async def test_record_over_the_frame_limit_fails_the_send() -> None:
    """A record that alone needs a frame over the limit: RecordTooLarge naming channel, key, size and limit."""
    big = ("big", b"x" * LIMIT, None)
    size = len(data_body(CHANNEL, 0, 1, [big]))
    async with DataServer(SECRET, max_frame=LIMIT) as server, opened(server) as pipe:
        message = (
            rf"^channel '{CHANNEL}' cannot send the record with key 'big': "
            rf"alone it needs a frame of {size} bytes, over the limit of {LIMIT} \(max_frame\)$"
        )
        with pytest.raises(RecordTooLarge, match=message):
            await pipe.sender.send([big])


async def test_batch_with_a_record_over_the_limit_sends_none_of_it() -> None:
    """The batch around a too-big record is not sent at all; the channel goes on with the next batch."""
    records = [*big_batch(100), ("big", b"x" * LIMIT, None), *big_batch(100)]
    async with DataServer(SECRET, max_frame=LIMIT) as server, opened(server) as pipe:
        with pytest.raises(RecordTooLarge):
            await pipe.sender.send(records)
        await pipe.sender.send(batch(1))
        assert await pipe.take() == batch(1)
        stats = server.statistics()
        assert (stats.frames, stats.records, stats.bad_frames, pipe.sender.seq) == (2, 1, 0, 1)  # OPEN and batch(1)


async def test_cut_between_pieces_of_a_batch_loses_nothing() -> None:
    """A cut after some pieces of a split batch: the client resends the rest; the batch arrives whole, once."""
    records = big_batch(300)
    cut = bytes_before([], 0) + 5 * LIMIT // 2
    async with (
        DataServer(SECRET, max_frame=LIMIT) as server,
        CuttingProxy(server.address, cut) as proxy,
        opened(server, capacity=2, via=proxy.address) as pipe,
    ):
        await pipe.sender.send(records)
        await pipe.sender.send(batch(1))
        assert [await pipe.take(), await pipe.take()] == [records, batch(1)]
        stats = server.statistics()
        assert (proxy.cuts, proxy.connections, stats.bad_frames, stats.records) == (1, 2, 0, 301)


@asynccontextmanager
async def sending(server: DataServer, frames: list[bytes]) -> AsyncIterator[tuple[Inbox, asyncio.StreamReader]]:
    """A plain socket that registers ``CHANNEL``, authenticates, opens the channel and writes ``frames``."""
    async with raw(server) as (reader, writer):
        inbox = Inbox(8)
        server.register(CHANNEL, inbox, inbox.add_channel(0))
        await authenticate(reader, writer)
        writer.write(frame(FrameType.OPEN, [CHANNEL]))
        for data in frames:
            writer.write(data)
        yield inbox, reader


async def error_reply(reader: asyncio.StreamReader) -> list[Any]:
    """The body of the ERROR frame among the server's replies (OPEN, ACK and CREDIT frames come first)."""
    while True:
        kind, body = await read_frame(reader, DEFAULT_MAX_FRAME)
        if kind is FrameType.ERROR:
            return body


async def test_marker_inside_a_split_batch_is_a_bad_frame() -> None:
    """A BARRIER between a MORE piece and the batch's last piece breaks the protocol: ERROR, connection closed."""
    frames = [
        with_header(FrameType.DATA, data_body(CHANNEL, 0, 1, batch(1)), MORE),
        frame(FrameType.BARRIER, [CHANNEL, 0, 2, 1]),
    ]
    async with DataServer(SECRET) as server, sending(server, frames) as (inbox, reader):
        assert await error_reply(reader) == [f"channel '{CHANNEL}': BARRIER inside a batch sent in pieces"]
        assert (server.statistics().bad_frames, inbox.queued(0)) == (1, 0)


async def test_a_batch_in_pieces_past_max_batch_bytes_is_a_bad_frame() -> None:
    """An authenticated peer that keeps sending MORE pieces (each given its credit back at once) is closed
    once their frames pass max_batch bytes: the reassembly buffer stays bounded, nothing reaches the inbox."""
    pieces = [with_header(FrameType.DATA, data_body(CHANNEL, 0, seq, batch(*range(200))), MORE) for seq in (1, 2, 3)]
    limit = 2 * len(pieces[0])  # two pieces fit, the third passes it
    reason = f"channel '{CHANNEL}': a batch sent in pieces passed {limit} bytes ({3 * len(pieces[0])} so far)"
    server = DataServer(SECRET, max_frame=len(pieces[0]), max_batch=limit)
    async with server, sending(server, pieces) as (inbox, reader):
        assert await error_reply(reader) == [reason]
        assert (server.statistics().bad_frames, inbox.queued(0)) == (1, 0)


async def test_a_batch_in_pieces_within_max_batch_arrives_whole() -> None:
    """Pieces that stay within max_batch make one batch, and the count starts again for the next one."""
    pieces = [with_header(FrameType.DATA, data_body(CHANNEL, 0, seq, batch(seq)), MORE if seq % 2 else 0)
              for seq in (1, 2, 3, 4)]  # fmt: skip
    limit = max(map(len, pieces)) * 2
    async with DataServer(SECRET, max_frame=limit, max_batch=limit) as server, sending(server, pieces) as (inbox, _):
        async with asyncio.timeout(2):
            while inbox.queued(0) < 2:
                await inbox.wait()
        assert [inbox.pop(0), inbox.pop(0)] == [batch(1, 2), batch(3, 4)]
        assert server.statistics().bad_frames == 0


def test_max_batch_below_max_frame_is_refused() -> None:
    """A server whose max_batch could not hold one frame is a mistake: refused at once."""
    with pytest.raises(ValueError, match=r"^max_batch \(10\) must be at least max_frame \(20\)$"):
        DataServer(SECRET, max_frame=20, max_batch=10)


async def test_a_sender_refuses_a_batch_no_receiver_would_reassemble(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose pieces would pass the receivers' max_batch fails at the sender, naming the channel,
    instead of a receiver closing the connection on it again and again."""
    monkeypatch.setattr(tcp_client, "DEFAULT_MAX_BATCH", 4 * LIMIT)
    records = [(f"k{n}", b"x" * (LIMIT // 4), None) for n in range(40)]
    async with DataServer(SECRET, max_frame=LIMIT) as server, opened(server) as pipe:
        with pytest.raises(
            RecordTooLarge, match=rf"^channel '{CHANNEL}' cannot send a batch of 40 records: its pieces"
        ):
            await pipe.sender.send(records)
        assert pipe.inbox.queued(0) == 0


def free_port() -> int:
    """A port nobody listens on (taken and let go)."""
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_transfer_gives_up_on_a_peer_that_refuses_connections_while_a_stream_waits_for_it() -> None:
    """Nobody listens at the address (the peer's process is gone): a one-off transfer channel fails with
    ConnectionRefusedError instead of waiting out its caller's timeout; a stream channel to the same address
    keeps waiting, and once a server listens there its items arrive, once and in order."""
    address = ("127.0.0.1", free_port())
    async with TcpClient(SECRET, reconnect_delay=0.01, max_reconnect_delay=0.05) as client:
        stream = client.channel(address, CHANNEL)
        transfer = client.channel(address, "job/replica-push", transfer=True)
        with pytest.raises(ConnectionRefusedError, match=f"127.0.0.1:{address[1]} refuses connections"):
            async with asyncio.timeout(5):  # a safety net: refusal comes at the first connect
                await transfer.send(batch(1))
        sending = asyncio.create_task(stream.send(batch(2, 3)))
        async with DataServer(SECRET, port=address[1]) as server:
            inbox = Inbox(8)
            server.register(CHANNEL, inbox, inbox.add_channel(0))
            async with asyncio.timeout(5):
                await sending
                while inbox.is_empty(0):
                    await inbox.wait()
            assert inbox.pop(0) == batch(2, 3)
            assert inbox.is_empty(0)


async def test_a_server_on_every_address_gives_senders_the_one_it_advertises() -> None:
    """``--host 0.0.0.0 --advertise ADDRESS``: peers are told ADDRESS (what the worker publishes and asks
    replies at), never the wildcard it listens on."""
    async with DataServer(SECRET, host="0.0.0.0", advertise="127.0.0.1") as server:
        assert server.address == ("127.0.0.1", server.port)
        async with opened(server) as pipe:
            await pipe.sender.send(batch(1))
            assert await pipe.take() == batch(1)
