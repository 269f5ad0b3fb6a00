"""Mutual TLS on the data plane: certificates of the cluster's own CA on both ends, the server named as the
process the client means; everything else is refused at the handshake, counted, and delivers nothing."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
import uvloop
from structlog.testing import capture_logs

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
                async with asyncio.timeout(5):  # a safety net
                    await server.refused(refused)
                assert client.connects == 0
        assert server.counts["tls_refused"] == 3
        assert server.counts["connections"] == 0
        assert inbox.is_empty(0)


async def test_a_rotated_certificate_serves_the_next_connection_while_the_link_up_stays_up(cluster_ca: Path) -> None:
    """worker-0's certificate is issued again (a new key) while worker-1 has a link to it: that link goes on
    carrying items, and a new client sees the new certificate, with nothing restarted."""
    server_tls = settings(cluster_ca, "worker-0")
    async with (
        DataServer(SECRET, tls=server_tls) as server,
        TcpClient(SECRET, tls=settings(cluster_ca, "worker-1")) as old,
    ):
        inbox = Inbox(8)
        server.register(CHANNEL, inbox, inbox.add_channel(0))
        sender = old.channel(server.address, CHANNEL, peer="worker-0")
        await sender.send([("k", 1, 1.0)])
        await sender.wait_acknowledged()
        before = server_tls.cert.read_bytes()
        certificates.issue(cluster_ca, "worker-0")  # the files replaced in place, as an operator rotates them
        assert server_tls.cert.read_bytes() != before
        await sender.send([("k", 2, 2.0)])
        await sender.wait_acknowledged()
        context = ssl.create_default_context(cafile=str(cluster_ca / "ca.pem"))
        client = certificates.ProcessFiles.of(cluster_ca, "worker-1")
        context.load_cert_chain(client.cert, client.key)
        _, writer = await asyncio.open_connection(*server.address, ssl=context, server_hostname="worker-0")
        presented = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
    assert [inbox.pop(0), inbox.pop(0)] == [[("k", 1, 1.0)], [("k", 2, 2.0)]]
    assert presented == ssl.PEM_cert_to_DER_cert(server_tls.cert.read_text())
    assert server.counts["tls_refused"] == 0


def test_a_certificate_close_to_its_end_is_warned_about(cluster_ca: Path) -> None:
    """process_tls (what a worker starts with) issues the worker's certificate from the local CA when it has
    none, and warns when the one it finds ends within WARN_DAYS."""
    with capture_logs() as logs:
        fresh = certificates.process_tls(cluster_ca, "worker-3")
    assert certificates.named(fresh.cert) == ["worker-3"]
    assert [entry for entry in logs if entry["event"] == "TLS certificate expires soon"] == []
    certificates.issue(cluster_ca, "worker-3", days=10)
    with capture_logs() as logs:
        certificates.process_tls(cluster_ca, "worker-3")
    (warning,) = [entry for entry in logs if entry["event"] == "TLS certificate expires soon"]
    assert (warning["process"], warning["log_level"]) == ("worker-3", "warning")
    assert 9.9 < warning["days_left"] <= 10.0


def test_the_same_on_uvloop_the_workers_loop(cluster_ca: Path) -> None:
    """Workers run on uvloop, whose accepted transports read from the start: the handshake must still see the
    client's first message (the server accepts sockets itself and starts TLS on them)."""
    uvloop.run(test_items_cross_over_mutual_tls_to_the_process_meant(cluster_ca))
