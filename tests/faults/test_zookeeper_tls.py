"""ZooKeeper on test hosts of its own serves other hosts over TLS only: its TLS client port wants a client
certificate of the cluster CA, its plain port listens on the member's own 127.0.0.1, the members talk TLS to
each other, and every master, worker and client of the cluster reaches it with its certificate."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from streamlet.backends.cluster.local import certificates
from streamlet.backends.cluster.local.local_cluster import ClusterState
from streamlet.backends.cluster.tree import paths
from streamlet.testing.nemesis.cluster import CLIENT_PORT, SECURE_PORT, HostCluster
from streamlet.testing.nemesis.hosts import HostNetwork
from tests.faults.conftest import KAZOO_TLS_LEAK
from tests.support.faults import streamlet_process

pytestmark = [
    pytest.mark.faults,
    pytest.mark.integration,
    KAZOO_TLS_LEAK,  # refusing handshakes is what these tests ask of ZooKeeper
]


@pytest.fixture
def cluster(tmp_path: Path, test_hosts_possible: None) -> Iterator[HostCluster]:
    with HostNetwork() as network:
        started = HostCluster(network, tmp_path / ".streamlet", masters=1, workers=1)
        started.start()
        try:
            yield started
        finally:
            assert started.stop() == []


def session(address: str, **tls: str) -> list[str]:
    """The root's children seen by a client of ``address`` (``tls``: kazoo's TLS options), or a timeout."""
    client = KazooClient(hosts=address, timeout=2, **tls)  # type: ignore[arg-type]
    try:
        client.start(timeout=4)
        return sorted(client.get_children("/"))
    finally:
        client.stop()
        client.close()


def test_other_hosts_reach_zookeeper_over_tls_with_a_certificate_of_the_cluster_ca(
    cluster: HostCluster, tmp_path: Path
) -> None:
    member = cluster.members[0]
    assert cluster.zk == ",".join(f"{m.host}:{SECURE_PORT}" for m in cluster.members)
    own = cluster.client_tls()
    assert "streamlet" in session(member.address, use_ssl=True, ca=str(own.ca), certfile=str(own.cert),
                                  keyfile=str(own.key))  # fmt: skip
    with pytest.raises(KazooTimeoutError):  # plain bytes on the TLS port: no session
        session(member.address)
    with pytest.raises(KazooTimeoutError):  # TLS without a client certificate
        session(member.address, use_ssl=True, ca=str(own.ca))
    foreign = tmp_path / "foreign"
    certificates.make_ca(foreign, "intruders")
    stranger = certificates.issue(foreign, "client")
    with pytest.raises(KazooTimeoutError):  # a certificate of another CA
        session(member.address, use_ssl=True, ca=str(own.ca), certfile=str(stranger.cert), keyfile=str(stranger.key))
    with pytest.raises(ConnectionRefusedError):  # the plain port serves the member's own 127.0.0.1 only
        socket.create_connection((member.host, CLIENT_PORT), timeout=2).close()


def test_the_members_talk_tls_and_every_process_uses_its_certificate(cluster: HostCluster) -> None:
    for member in cluster.members:
        config = (member.folder / "zoo.cfg").read_text()
        assert "sslQuorum=true" in config
        assert "ssl.quorum.clientAuth=need" in config
        assert "clientPortAddress=127.0.0.1\n" in config
        assert f"secureClientPortAddress={member.host}\n" in config
    with cluster.watch() as zk:  # registered and leading: the processes' TLS sessions work
        assert zk.children(paths.WORKERS) == ["worker-0"]
        assert zk.data(paths.LEADER)["name"] == "master-0"
    for process in ("master-0", "worker-0"):
        assert "zk-tls = true" in (cluster.state_dir / f"{process}.toml").read_text()
    assert ClusterState.load(cluster.state_dir).zk_tls
    status = streamlet_process("cluster", "status", "--json", cwd=cluster.state_dir.parent)
    out, err = status.communicate(timeout=60)
    assert status.returncode == 0, err
    assert '"mode": "leader"' in out
    assert out.count('"mode": "follower"') == 2
