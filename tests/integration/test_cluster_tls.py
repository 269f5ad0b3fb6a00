"""Mutual TLS between the workers of a real cluster (``cluster up``'s default): a cluster CA and a certificate
per worker naming it (0600 files under the state dir's ``tls/``), a job spread over two workers on their own
addresses with exact output, and a worker's data port refusing a plain TCP client and a TLS client whose
certificate another CA signed (each refusal logged and counted, nothing served). ``--no-tls`` runs the data
plane in cleartext, and ``cluster status`` says which."""

from __future__ import annotations

import json
import socket
import ssl
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from streamlet.backends.cluster.local import certificates
from streamlet.backends.cluster.tree import paths
from tests.support.cluster import running_cluster, streamlet, wait_for_node, wait_for_state

SPREAD = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("spread")
    source = topology.add_source("in", [(f"k{i % 13}", 1) for i in range(5000)])
    count = topology.reduce("count", lambda total, one: total + one, parallelism=2, emit="record")
    count.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology
"""


def worker_address(cluster: dict[str, Any], worker: str) -> tuple[str, int]:
    """Where ``worker``'s data port is, as it registered it (``cluster status --json``)."""
    status = json.loads(streamlet("cluster", "status", "--json", cwd=cluster["dir"]).stdout)
    host, port = next(row["address"] for row in status["workers"] if row["id"] == worker).rsplit(":", 1)
    return host, int(port)


def first_read(connection: socket.socket, tls: ssl.SSLContext | None = None) -> bytes:
    """What the server sends first, over ``tls`` if given (``b""``: it closed or reset the connection, or
    refused the handshake)."""
    connection.settimeout(15)  # a safety net: the server's handshake timeout is 5 s
    try:
        if tls is None:
            return connection.recv(64)
        with tls.wrap_socket(connection) as secured:
            return secured.recv(64)
    except (ssl.SSLError, ConnectionResetError):
        return b""


def logged_refusals(cluster: dict[str, Any], worker: str) -> int:
    """The handshakes ``worker`` refused, as its log says."""
    return (cluster["dir"] / ".streamlet" / f"{worker}.log").read_text().count("TLS handshake refused")


def heartbeat_refusals(cluster: dict[str, Any], worker: str, at_least: int = 0) -> int:
    """The handshakes ``worker`` refused, as its heartbeat says, once it says ``at_least`` (a watch)."""
    load = wait_for_node(cluster["dir"], paths.load(worker), lambda load: load["tls_refused"] >= at_least)
    return int(load["tls_refused"])


def test_the_workers_speak_mutual_tls_and_refuse_strangers(tmp_path: Path) -> None:
    with running_cluster(tmp_path, "--workers", "2", "--capacity", "2", "--name", "sealed") as cluster:
        folder = tmp_path / ".streamlet" / "tls"
        for worker in ("worker-0", "worker-1"):
            files = certificates.ProcessFiles.of(folder, worker)
            assert certificates.named(files.cert) == [worker]
            assert stat.S_IMODE(files.key.stat().st_mode) == stat.S_IMODE(files.cert.stat().st_mode) == 0o600
        assert stat.S_IMODE((folder / "ca.key").stat().st_mode) == 0o600
        status = streamlet("cluster", "status", cwd=tmp_path)
        assert "  data plane: mutual TLS (the cluster's CA)" in status.stdout.splitlines(), status.stdout

        job = tmp_path / "spread.py"
        job.write_text(SPREAD, encoding="utf-8")
        results = tmp_path / "spread.json"
        submitted = streamlet("submit", str(job), "--job", "spread", "--results", str(results), cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        collected = json.loads(results.read_text())["out"]
        finals: dict[str, int] = {}
        for key, value, _ts in collected:  # running counts: each key's last is its total
            finals[key] = max(value, finals.get(key, 0))
        assert len(collected) == 5000  # one running count per word: none lost, none twice
        assert finals == dict(Counter(f"k{i % 13}" for i in range(5000)))
        ended = wait_for_state(tmp_path, "spread", {"FINISHED"})
        assert ended["reason"] == "every worker finished (2)"  # both workers ran a part: records crossed over TLS

        address = worker_address(cluster, "worker-0")
        before = heartbeat_refusals(cluster, "worker-0")
        assert logged_refusals(cluster, "worker-0") == before
        with socket.create_connection(address, timeout=10) as plain:  # cleartext: waits for a HELLO, gets nothing
            assert first_read(plain) == b""  # the server gave up on the handshake and dropped the connection
        foreign = tmp_path / "foreign"
        certificates.make_ca(foreign, "another")
        files = certificates.issue(foreign, "worker-1")  # the right name, the wrong CA
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_cert_chain(files.cert, files.key)
        context.load_verify_locations(folder / "ca.pem")  # it trusts the cluster: only its own certificate is off
        context.check_hostname = False
        with socket.create_connection(address, timeout=10) as raw:
            assert first_read(raw, context) == b""  # refused in the handshake, or (TLS 1.3) at the first read
        assert heartbeat_refusals(cluster, "worker-0", before + 2) == before + 2  # counted before the beat ...
        assert logged_refusals(cluster, "worker-0") == before + 2  # ... and logged before the count

        old = (folder / "worker-1.pem").read_bytes()
        rotated = streamlet("cluster", "rotate-certificates", cwd=tmp_path)
        assert rotated.stdout.strip() == "issued new certificates for worker-0, worker-1 (valid 365 days)"
        assert (folder / "worker-1.pem").read_bytes() != old
        again = streamlet("submit", str(job), "--job", "again", "--results", str(results), cwd=tmp_path)
        assert again.returncode == 0, again.stderr  # new connections on the new certificates: nothing restarted
        assert len(json.loads(results.read_text())["out"]) == 5000
        assert heartbeat_refusals(cluster, "worker-0") == before + 2  # nobody refused: the new certificates hold


def test_no_tls_runs_the_data_plane_in_cleartext_and_says_so(tmp_path: Path) -> None:
    with running_cluster(tmp_path, "--workers", "1", "--name", "open", "--no-tls"):
        assert not (tmp_path / ".streamlet" / "tls").exists()
        status = streamlet("cluster", "status", cwd=tmp_path)
        assert "  data plane: cleartext (--no-tls: loopback only)" in status.stdout.splitlines(), status.stdout
        recorded = json.loads((tmp_path / ".streamlet" / "cluster.json").read_text())
        assert recorded["tls"] is False
