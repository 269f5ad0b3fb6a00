"""A sender opening a channel its receiver has not registered yet: the open waits, without credit, while the
other channels of the connection keep flowing; registering it grants the credit and its items arrive once, in
order. A closed connection forgets its waiting opens; too many waiting opens close the connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from streamlet.core.model.items import Item
from streamlet.core.model.record import END_OF_STREAM, Barrier, Batch
from streamlet.core.runtime.channel import Inbox
from streamlet.transport import auth, tcp
from streamlet.transport.codec import DEFAULT_MAX_FRAME, FrameType, frame
from streamlet.transport.tcp import DataServer, read_frame
from streamlet.transport.tcp_client import TcpClient

SECRET = b"cluster secret"
READY = "job/sink.0@0/source.0"  # registered before anything is sent
LATE = "job/sink.0@0/source.1"  # registered only after its sender opened it
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def batch(*numbers: int) -> Batch:
    """Elements keyed ``k<n % 7>`` with value ``n`` and event time ``n / 2``."""
    return [(f"k{n % 7}", n, n / 2) for n in numbers]


async def take(inbox: Inbox, channel: int) -> Item:
    """The next item of ``channel``, waiting (at most 2 s) for it to arrive."""
    with anyio.fail_after(2):
        while inbox.is_empty(channel):
            await inbox.wait()
    return inbox.pop(channel)


async def queued(inbox: Inbox, channel: int, count: int) -> None:
    """Wait (at most 2 s) until ``count`` items wait in ``channel``, taking none."""
    with anyio.fail_after(2):
        while inbox.queued(channel) < count:
            await inbox.wait()


@asynccontextmanager
async def raw(server: DataServer) -> AsyncIterator[Streams]:
    """A plain socket to ``server``, authenticated by hand, closed on exit."""
    reader, writer = await asyncio.open_connection(*server.address)
    try:
        kind, (tag, challenge) = await read_frame(reader, auth.HELLO_MAX)
        assert (kind, tag) == (FrameType.HELLO, "challenge")
        mine = auth.nonce()
        writer.write(frame(FrameType.HELLO, ["response", mine, auth.client_proof(SECRET, challenge, mine)]))
        assert (await read_frame(reader, auth.HELLO_MAX))[0] is FrameType.HELLO
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def open_raw(streams: Streams, *channel_ids: str) -> list[Any]:
    """Send one OPEN frame for ``channel_ids``; the server's reply."""
    reader, writer = streams
    writer.write(frame(FrameType.OPEN, list(channel_ids)))
    with anyio.fail_after(2):
        kind, body = await read_frame(reader, DEFAULT_MAX_FRAME)
    assert kind is FrameType.OPEN, body
    return body


async def refusal(reader: asyncio.StreamReader) -> str:
    """The reason of the ERROR frame the server sends, then the connection must be closed."""
    with anyio.fail_after(2):
        kind, body = await read_frame(reader, DEFAULT_MAX_FRAME)
        assert kind is FrameType.ERROR, body
        assert await reader.read() == b""
    return str(body[0])


async def test_an_open_before_register_waits_while_the_connection_serves_other_channels() -> None:
    """LATE is opened first, before anyone registered it: the connection stays up, READY's batches arrive
    meanwhile and LATE's sender holds no credit; register(LATE) grants it, and LATE's items arrive once, in
    order, over the same connection."""
    late_items: list[Item] = [batch(1, 2), Barrier(1), batch(3), END_OF_STREAM]
    with anyio.fail_after(5):  # a connection closed over LATE's open would leave READY's sends waiting
        async with DataServer(SECRET) as server, TcpClient(SECRET) as client:
            inbox = Inbox(8)
            ready, late = inbox.add_channel(0), inbox.add_channel(1)
            server.register(READY, inbox, ready)
            waiting = client.channel(server.address, LATE)  # first: its OPEN reaches the server before READY's
            flowing = client.channel(server.address, READY)

            async def send_late() -> None:
                for item in late_items:
                    await waiting.send(item)

            async with anyio.create_task_group() as group:
                group.start_soon(send_late)
                await flowing.send(batch(10, 11))
                assert await take(inbox, ready) == batch(10, 11)
                await flowing.wait_acknowledged()  # the ACK comes after the reply to LATE's OPEN: that is in too
                assert (waiting.opened, waiting.credit, waiting.seq) == (True, 0, 0)  # open, no credit, nothing sent
                assert inbox.is_empty(late)
                await flowing.send(batch(12))  # the connection keeps serving READY while LATE waits
                assert await take(inbox, ready) == batch(12)
                stats = server.statistics()
                assert (stats.connections, stats.active, stats.bad_frames) == (1, 1, 0)

                server.register(LATE, inbox, late)
                received = [await take(inbox, late) for _ in late_items]
            assert received == late_items
            await waiting.wait_acknowledged()
            assert list(waiting.backup) == []  # every item acknowledged
            assert inbox.is_empty(late)
            await flowing.send(batch(13))
            assert await take(inbox, ready) == batch(13)
            stats = server.statistics()
            assert (stats.connections, stats.active, stats.bad_frames, stats.duplicates) == (1, 1, 0, 0)
            assert stats.records == 2 + 1 + 3 + 1  # READY's 10, 11, 12, 13 and LATE's 1, 2, 3: each once
            assert client.statistics().connects == 1


async def test_the_credit_granted_at_register_is_the_room_left_in_the_inbox_channel() -> None:
    """LATE's channel holds 3 and already has one item queued locally when it is registered: the waiting
    sender gets 2 items of credit, sends two of its three batches, and the third once one is taken."""
    with anyio.fail_after(5):
        async with DataServer(SECRET) as server, TcpClient(SECRET) as client:
            inbox = Inbox(3)
            ready, late = inbox.add_channel(0), inbox.add_channel(1)
            server.register(READY, inbox, ready)
            waiting = client.channel(server.address, LATE)
            flowing = client.channel(server.address, READY)
            await flowing.send(batch(0))
            await flowing.wait_acknowledged()  # LATE's OPEN has been answered: no credit
            assert (waiting.opened, waiting.credit) == (True, 0)
            inbox.put_nowait(late, Barrier(7))  # something already waits in the channel

            async def send_late() -> None:
                for n in (1, 2, 3):
                    await waiting.send(batch(n))

            async with anyio.create_task_group() as group:
                group.start_soon(send_late)
                server.register(LATE, inbox, late)
                await queued(inbox, late, 3)  # the local Barrier and two batches
                # the sender writes while it holds credit, without waiting: with more than 2 it had sent all three
                assert (waiting.seq, waiting.credit) == (2, 0)
                assert inbox.pop(late) == Barrier(7)  # room for one more: its credit goes to the sender
                await queued(inbox, late, 3)
            assert [inbox.pop(late) for _ in range(3)] == [batch(1), batch(2), batch(3)]
            assert (waiting.seq, server.statistics().bad_frames, server.statistics().duplicates) == (3, 0, 0)


async def test_a_closed_connection_forgets_its_waiting_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one waiting open, a connection that left one waiting and closed frees it: another
    connection's open of a different unregistered channel waits too, instead of being refused."""
    monkeypatch.setattr(tcp, "MAX_WAITING_OPENS", 1)
    async with DataServer(SECRET) as server:
        async with raw(server) as first:
            assert await open_raw(first, "job/a") == [["job/a", 0, 0]]
        with anyio.fail_after(2):
            await server._drained.wait()  # the server saw the first connection go (no connection is left)
        async with raw(server) as second:
            assert await open_raw(second, "job/b") == [["job/b", 0, 0]]
            stats = server.statistics()
            assert (stats.connections, stats.active, stats.bad_frames) == (2, 1, 0)
            inbox = Inbox(4)  # the forgotten channel, registered now: a fresh open of it is credited at once
            server.register("job/a", inbox, inbox.add_channel(0))
            assert await open_raw(second, "job/a") == [["job/a", 0, 4]]


async def test_too_many_waiting_opens_close_the_connection_and_free_their_places(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_WAITING_OPENS the open is a bad frame: ERROR, the connection closes, and the opens it left
    waiting are forgotten (a new connection may open as many again). Re-opening a waiting channel takes no
    second place, and a registered channel's open is answered with credit on the same connection."""
    monkeypatch.setattr(tcp, "MAX_WAITING_OPENS", 2)
    async with DataServer(SECRET) as server:
        inbox = Inbox(5)
        server.register(READY, inbox, inbox.add_channel(0))
        async with raw(server) as greedy:
            assert await open_raw(greedy, "job/a", "job/b") == [["job/a", 0, 0], ["job/b", 0, 0]]
            assert await open_raw(greedy, "job/a", READY) == [["job/a", 0, 0], [READY, 0, 5]]
            greedy[1].write(frame(FrameType.OPEN, ["job/c"]))
            assert await refusal(greedy[0]) == "unknown channel 'job/c' (2 opens wait already)"
        assert server.statistics().bad_frames == 1
        async with raw(server) as later:  # the refused connection's two places are free again
            assert await open_raw(later, "job/c", "job/d") == [["job/c", 0, 0], ["job/d", 0, 0]]
        stats = server.statistics()
        assert (stats.connections, stats.bad_frames) == (2, 1)
