"""A link that hears nothing from its peer within ``peer_timeout`` gives up, naming the link; backpressure does not.

These run on the simulation's loop: virtual time, an in-memory network whose
partitions drop nothing but hold everything (as a silent firewall rule does),
so "ten times the bound went by" is exact and instant.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamlet.core.model import world
from streamlet.core.runtime.channel import Inbox
from streamlet.errors import PeerUnreachable
from streamlet.testing.chaos.harness import SimWorld
from streamlet.testing.chaos.loop import SimLoop
from streamlet.testing.chaos.network import Network
from streamlet.testing.chaos.parties import Party
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient

SECRET = b"s" * 32
BOUND = 6.0  # virtual seconds


def run_on_virtual_time(scenario: Callable[[SimLoop, Network], Awaitable[Any]]) -> Any:
    """Run ``scenario`` on a fresh simulation loop (receiver and sender are its parties)."""
    network = Network(random.Random(1), cut_after=1000.0)  # the link stays cut: no reset helps the sender
    loop = SimLoop(network)
    try:
        with world.using(SimWorld(loop, random.Random(2))):
            return loop.run_until_complete(scenario(loop, network))
    finally:
        loop.close()


def test_a_cut_link_ends_the_send_within_the_bound_naming_the_link() -> None:
    async def scenario(loop: SimLoop, network: Network) -> tuple[float, str]:
        inbox = Inbox(4)
        ready: asyncio.Future[tuple[str, int]] = loop.create_future()
        served = asyncio.Event()

        async def receiver() -> None:
            async with DataServer(SECRET) as server:
                server.register("count[0]<-words[0]", inbox, inbox.add_channel(0))
                ready.set_result(server.address)
                await served.wait()

        async def sender() -> tuple[float, str]:
            address = await ready
            async with TcpClient(SECRET, peer_timeout=BOUND, name="worker-0") as client:
                channel = client.channel(address, "count[0]<-words[0]", peer="worker-1")
                await channel.send([("a", 1, None)])
                await channel.wait_acknowledged()  # the link is up and answering
                network.partition("worker-0", "worker-1")
                cut_at = loop.time()
                with pytest.raises(PeerUnreachable) as raised:  # the inbox holds 4: soon it waits for credit
                    await _send_all(channel, 100)
                served.set()
                return loop.time() - cut_at, str(raised.value)

        loop.start_party(Party("worker-1"), receiver())
        return await loop.start_party(Party("worker-0"), sender())

    waited, message = run_on_virtual_time(scenario)
    assert BOUND <= waited <= BOUND * 1.25 + 0.1  # pinged at a quarter of the bound, given up at the bound
    assert message.startswith("link worker-0 -> worker-1 (")
    assert f"(peer_timeout {BOUND:g} s)" in message


def test_a_receiver_that_is_only_busy_keeps_the_link_for_as_long_as_it_takes() -> None:
    async def scenario(loop: SimLoop, network: Network) -> list[Any]:
        inbox = Inbox(2)
        ready: asyncio.Future[tuple[str, int]] = loop.create_future()
        drain, over = asyncio.Event(), asyncio.Event()
        received: list[Any] = []

        async def receiver() -> None:
            async with DataServer(SECRET) as server:
                server.register("sink[0]<-count[0]", inbox, inbox.add_channel(0))
                ready.set_result(server.address)
                await drain.wait()  # busy elsewhere: nothing consumed, no credit granted, but it answers pings
                while len(received) < 20:
                    while inbox.is_empty(0):
                        await inbox.wait()
                    received.extend(inbox.pop(0))
                await over.wait()  # serving until the sender has its acknowledgements

        async def sender() -> None:
            address = await ready
            async with TcpClient(SECRET, peer_timeout=BOUND, name="count") as client:
                channel = client.channel(address, "sink[0]<-count[0]")
                sending = asyncio.ensure_future(_send_all(channel, 20))
                await asyncio.sleep(BOUND * 10)  # virtual: ten bounds without credit
                assert not sending.done(), "the sender gave up on a receiver that only held back credit"
                drain.set()
                await sending
                await channel.wait_acknowledged()
                over.set()

        done = loop.start_party(Party("receiver"), receiver())
        await loop.start_party(Party("sender"), sender())
        await done
        return received

    received = run_on_virtual_time(scenario)
    assert received == [("k", n, None) for n in range(20)]


async def _send_all(channel: Any, count: int) -> None:
    for n in range(count):
        await channel.send([("k", n, None)])
