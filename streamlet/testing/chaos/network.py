"""In-memory links between the parties of a simulation, behaving like TCP.

A link delivers bytes in order, each chunk after a delay drawn from the
network's seeded generator. It can **stall** (a partition between its two
parties: nothing moves until it heals; a partition that outlasts
``cut_after`` seconds resets the link, as TCP's retransmission timeout
would) or be **cut** (an end closed, its process killed): the other end sees
what was already on its way, then the end of the stream. It never drops a
chunk and carries on.

A party that listens gets a server object like asyncio's; a party that
connects to an address nobody listens on is refused; one that connects across
a partition waits (its own connect timeout decides when it gives up).
Callbacks into a party run in that party's context, so the loop drops them
when the party is dead and holds them while it is paused.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamlet.testing.chaos.parties import PARTY, Party

STORE = "store"  # the name the coordination store goes by in partitions and delays
_EOF = object()


def _party_of(context: contextvars.Context) -> Party | None:
    return context.get(PARTY)


@dataclass
class Network:
    """Every link between the parties, with seeded delays, partitions and slow parties."""

    rng: random.Random
    delay: tuple[float, float] = (0.0002, 0.002)  # seconds a chunk takes: uniform between the two
    cut_after: float = 10.0  # seconds a stalled link lasts before it resets
    loop: asyncio.AbstractEventLoop | None = None
    servers: dict[tuple[str, int], _Server] = field(default_factory=dict)
    links: list[_Link] = field(default_factory=list)
    partitions: set[frozenset[str]] = field(default_factory=set)
    slow: dict[str, float] = field(default_factory=dict)  # party name -> factor on its links' delays
    next_port: int = 20_000
    note: Callable[[str], None] = lambda line: None  # connects, closes, resets: to the run's trace

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the links schedule their deliveries on."""
        self.loop = loop

    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self.loop is not None, "the network is not attached to a loop"
        return self.loop

    # -- faults -----------------------------------------------------------------------------------

    def blocked(self, one: str, other: str) -> bool:
        """Whether a partition separates the two parties (or a party from the ``STORE``)."""
        return frozenset((one, other)) in self.partitions

    def partition(self, one: str, other: str) -> None:
        """Stall everything between ``one`` and ``other``; links still stalled after ``cut_after`` reset."""
        pair = frozenset((one, other))
        self.partitions.add(pair)
        loop = self._loop()
        for link in self._between(one, other):
            loop.call_at(loop.time() + self.cut_after, self._reset_if_still_cut, link, pair)

    def heal(self, one: str, other: str) -> None:
        """Let what was held between the two move again."""
        self.partitions.discard(frozenset((one, other)))
        for link in self._between(one, other):
            link.kick()

    def set_slow(self, party: str, factor: float) -> None:
        """Multiply the delays of every link of ``party`` by ``factor`` (1: normal again)."""
        if factor == 1:
            self.slow.pop(party, None)
        else:
            self.slow[party] = factor

    def cut_party(self, party: str) -> None:
        """The party's process is gone: each of its links ends, the other side seeing what was on its way."""
        for link in [link for link in self.links if party in link.names]:
            link.close_from(link.names.index(party))
        for address, server in list(self.servers.items()):
            if server.party is not None and server.party.name == party:
                del self.servers[address]

    def _between(self, one: str, other: str) -> list[_Link]:
        return [link for link in self.links if set(link.names) == {one, other}]

    def _reset_if_still_cut(self, link: _Link, pair: frozenset[str]) -> None:
        if pair in self.partitions and not link.closed:
            self.note(f"reset {link.names[0]}->{link.names[1]} (partitioned)")
            link.close_from(0, reset=True, both=True)

    def chunk_delay(self, one: str, other: str) -> float:
        """Seconds the next chunk between the two takes (a slow party's factor applied)."""
        low, high = self.delay
        factor = max(self.slow.get(one, 1.0), self.slow.get(other, 1.0))
        return (low + (high - low) * self.rng.random()) * factor

    # -- listening and connecting -------------------------------------------------------------------

    def listen(self, factory: Callable[[], asyncio.Protocol], host: str, port: int) -> _Server:
        """A server for ``factory`` at (host, port): port 0 takes the next free one."""
        if port == 0:
            port, self.next_port = self.next_port, self.next_port + 1
        if (host, port) in self.servers:
            raise OSError(98, f"address already in use: {host}:{port}")
        server = _Server(self, (host, port), factory, contextvars.copy_context())
        self.servers[host, port] = server
        return server

    async def connect(self, factory: Callable[[], asyncio.Protocol], host: str, port: int) -> tuple[Any, Any]:
        """Connect to (host, port) as the calling party; returns (transport, protocol) as asyncio does."""
        client_context = contextvars.copy_context()
        me = _name(_party_of(client_context))
        server = self.servers.get((host, port))
        if server is None:
            raise ConnectionRefusedError(111, f"connection refused: {host}:{port}")
        peer = _name(server.party)
        await asyncio.sleep(self.chunk_delay(me, peer) * 2)  # the handshake's round trip
        while self.blocked(me, peer):  # noqa: ASYNC110 - no answer across a partition: the caller's timeout decides
            await asyncio.sleep(self.delay[1] * 50)
        if self.servers.get((host, port)) is not server:
            raise ConnectionRefusedError(111, f"connection refused: {host}:{port}")
        link = _Link(self, (me, peer))
        self.links.append(link)
        self.note(f"connect {me}->{peer}:{port}")
        client = link.end(0, factory(), client_context, (host, port))
        server_protocol = server.context.run(server.factory)
        link.end(1, server_protocol, server.context, ("10.0.0.1", 40_000 + len(self.links)))
        self._loop().call_soon(server_protocol.connection_made, link.transports[1], context=server.context)
        client.protocol.connection_made(client)
        return client, client.protocol


def _name(party: Party | None) -> str:
    return "harness" if party is None else party.name


class _Socket:
    """What ``server.sockets[0]`` answers for (DataServer reads its port there)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address

    def getsockname(self) -> tuple[str, int]:
        return self.address


class _Server(asyncio.AbstractServer):
    def __init__(
        self,
        network: Network,
        address: tuple[str, int],
        factory: Callable[[], asyncio.Protocol],
        context: contextvars.Context,
    ) -> None:
        self.network = network
        self.address = address
        self.factory = factory
        self.context = context
        self.party = _party_of(context)
        self.sockets = [_Socket(address)]

    def close(self) -> None:
        if self.network.servers.get(self.address) is self:
            del self.network.servers[self.address]

    async def wait_closed(self) -> None:
        return None

    def is_serving(self) -> bool:
        return self.network.servers.get(self.address) is self

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.network._loop()

    async def start_serving(self) -> None:
        return None

    async def serve_forever(self) -> None:
        await asyncio.Event().wait()


class _Link:
    """Two ends, each with a queue of (due, chunk) to deliver in order."""

    def __init__(self, network: Network, names: tuple[str, str]) -> None:
        self.network = network
        self.names = names
        self.transports: list[MemoryTransport] = []
        self.queues: list[collections.deque[tuple[float, Any]]] = [collections.deque(), collections.deque()]
        self.pumping = [False, False]
        self.last_due = [0.0, 0.0]
        self.closed = False

    def end(
        self, index: int, protocol: asyncio.Protocol, context: contextvars.Context, peer: tuple[str, int]
    ) -> MemoryTransport:
        transport = MemoryTransport(self, index, protocol, context, peer)
        self.transports.append(transport)
        return transport

    def send(self, sender: int, chunk: Any) -> None:
        """Queue ``chunk`` for the other end, after the ones before it."""
        receiver = 1 - sender
        loop = self.network._loop()
        due = max(self.last_due[receiver], loop.time() + self.network.chunk_delay(*self.names))
        self.last_due[receiver] = due
        self.queues[receiver].append((due, chunk))
        self._schedule(receiver)

    def kick(self) -> None:
        """Look at both queues again (a partition healed, reading resumed)."""
        for receiver in (0, 1):
            self._schedule(receiver)

    def _schedule(self, receiver: int) -> None:
        if self.pumping[receiver] or not self.queues[receiver] or len(self.transports) < 2:
            return
        if self.transports[receiver].lost:  # that end is gone: nothing more reaches it
            self.queues[receiver].clear()
            return
        self.pumping[receiver] = True
        transport = self.transports[receiver]
        due = self.queues[receiver][0][0]
        self.network._loop().call_at(due, self._pump, receiver, context=transport.context)

    def _pump(self, receiver: int) -> None:
        """Deliver what is due to ``receiver``, in order, unless the link is stalled or the reader paused."""
        self.pumping[receiver] = False
        transport = self.transports[receiver]
        queue = self.queues[receiver]
        now = self.network._loop().time()
        while queue and queue[0][0] <= now and not transport.lost:
            chunk = queue[0][1]
            if isinstance(chunk, Exception):  # a reset: it needs no data to get through
                queue.popleft()
                transport.lose(chunk)
                return
            if self.network.blocked(*self.names) or not transport.reading:
                return  # heal() or resume_reading() kicks it again
            queue.popleft()
            if chunk is _EOF:
                transport.peer_closed()
            else:
                transport.protocol.data_received(chunk)  # type: ignore[attr-defined]
        self._schedule(receiver)

    def close_from(self, closer: int, *, reset: bool = False, both: bool = False) -> None:
        """End ``closer``'s side. Closed: the other end gets what is on its way, then the end of the stream.
        Reset: what was on its way is lost and the other end (``both``: each end) hears a reset."""
        if self.closed:
            return
        self.closed = True
        self.network.note(f"{'reset' if reset else 'close'} {self.names[closer]}|{self.names[1 - closer]}")
        if len(self.transports) < 2:
            return
        now = self.network._loop().time()
        other = 1 - closer
        if reset:
            for index in (other, closer) if both else (other,):
                self.queues[index].clear()
                self.queues[index].append((now, ConnectionResetError(104, "connection reset by peer")))
                self._schedule(index)
        else:
            self.queues[other].append((max(self.last_due[other], now), _EOF))
            self._schedule(other)
        if not both:
            transport = self.transports[closer]
            self.network._loop().call_soon(transport.lose, None, context=transport.context)


class MemoryTransport(asyncio.Transport):
    """One end of a :class:`_Link`, as asyncio's streams see a socket transport."""

    def __init__(
        self,
        link: _Link,
        index: int,
        protocol: asyncio.BaseProtocol,
        context: contextvars.Context,
        peer: tuple[str, int],
    ) -> None:
        super().__init__()
        self.link = link
        self.index = index
        self.protocol = protocol
        self.context = context
        self.peer = peer
        self.reading = True
        self.closing = False
        self.lost = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer, "sockname": ("127.0.0.1", 0)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing or self.lost

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.link.close_from(self.index)

    def abort(self) -> None:
        self.closing = True
        self.link.close_from(self.index, reset=True)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            self.link.kick()

    def write(self, data: Any) -> None:
        if not self.closing and not self.lost and not self.link.closed:
            self.link.send(self.index, bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def write_eof(self) -> None:
        self.close()

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return 0, 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def peer_closed(self) -> None:
        """The other end closed: end of stream, then the connection is gone."""
        if self.lost:
            return
        keep_open = getattr(self.protocol, "eof_received", lambda: None)()
        if not keep_open:
            self.lose(None)

    def lose(self, error: Exception | None) -> None:
        """The connection is gone (``error``: reset) — the protocol hears it once."""
        if self.lost:
            return
        self.lost = True
        self.closing = True
        self.protocol.connection_lost(error)
