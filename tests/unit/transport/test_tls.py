"""Mutual TLS on the data plane: certificates of the cluster's own CA on both ends, the server named as the
process the client means; everything else is refused at the handshake, counted, and delivers nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from streamlet.backends.cluster.local import certificates
from streamlet.core.runtime.channel import Inbox
from streamlet.transport import tcp
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient
from streamlet.transport.tls import TlsSettings

SECRET = b"cluster secret"
CHANNEL = "job/sink.0@0/source.0"


def settings(folder: Path, process: str) -> TlsSettings:
    files = certificates.issue(folder, process)
    return TlsSettings(files.ca, files.cert, files.key)


@pytest.fixture
def cluster_ca(tmp_path: Path) -> Path:
    folder = tmp_path / "tls"
    certificates.make_ca(folder, "test")
    return folder


async def until(condition: Callable[[], bool]) -> None:
    """Wait (at most 5 s) until ``condition()`` holds."""
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - the server's counters have no event to wait on
            await asyncio.sleep(0.005)


async def test_items_cross_over_mutual_tls_to_the_process_meant(cluster_ca: Path) -> None:
    """worker-1 sends to worker-0 over TLS, checking that the server is worker-0: every item arrives, in
    order, and no handshake was refused."""
    async with (
        DataServer(SECRET, tls=settings(cluster_ca, "worker-0")) as server,
        TcpClient(SECRET, tls=settings(cluster_ca, "worker-1")) as client,
    ):
        inbox = Inbox(8)
        server.register(CHANNEL, inbox, inbox.add_channel(0))
        sender = client.channel(server.address, CHANNEL, peer="worker-0")
        for n in range(3):
            await sender.send([("k", n, float(n))])
        await sender.wait_acknowledged()
        got = [inbox.pop(0) for _ in range(3)]
    assert got == [[("k", n, float(n))] for n in range(3)]
    assert (server.counts["tls_refused"], client.connects) == (0, 1)


async def test_plain_tcp_another_ca_and_the_wrong_process_are_refused_and_deliver_nothing(
    cluster_ca: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a TLS data port: a cleartext client (it says nothing: the handshake times out), a client whose
    certificate another CA signed, and a client meaning worker-7 (the server is worker-0) never get a link
    up; the server counts each refused handshake."""
    monkeypatch.setattr(tcp, "TLS_HANDSHAKE_TIMEOUT", 0.5)
    foreign = tmp_path / "foreign"
    certificates.make_ca(foreign, "another")
    async with DataServer(SECRET, tls=settings(cluster_ca, "worker-0")) as server:
        inbox = Inbox(8)
        server.register(CHANNEL, inbox, inbox.add_channel(0))
        clients = [
            TcpClient(SECRET, reconnect_delay=5.0),
            TcpClient(SECRET, tls=settings(foreign, "worker-1"), reconnect_delay=5.0),
            TcpClient(SECRET, tls=settings(cluster_ca, "worker-1"), reconnect_delay=5.0),
        ]
        for refused, client in enumerate(clients, 1):
            async with client:
                peer = "worker-7" if client is clients[-1] else None
                client.channel(server.address, CHANNEL, peer=peer)
                await until(lambda refused=refused: server.counts["tls_refused"] >= refused)  # type: ignore[misc]
                assert client.connects == 0
        assert server.counts["tls_refused"] == 3
        assert server.counts["connections"] == 0
        assert inbox.is_empty(0)
