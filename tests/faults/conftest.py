"""Fixtures of the fault matrix: local clusters of real processes on the session's ZooKeeper, stopped by PID.

Each test gets what it breaks: a cluster of its own when it kills or stops processes, a module's shared
one when it only sends bad input. Every cluster is stopped at the end and checked: no PID it (or the test)
started may still run. Figures the tests measure (recovery times, RSS) are printed after the run.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamlet.backends.cluster.local.local_cluster import alive
from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer
from streamlet.testing.nemesis.hosts import unavailable
from tests.support.faults import LocalCluster

# kazoo drops the sockets of its failed TLS reconnects (a ZooKeeper member killed or cut off) unclosed, to the
# garbage collector: its leak, not the code under test's
KAZOO_TLS_LEAK = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <ssl.SSLSocket:pytest.PytestUnraisableExceptionWarning"
)

_names = itertools.count()
FIGURES: list[str] = []


def start_cluster(directory: Path, zk: str | None, **options: Any) -> LocalCluster:
    """A cluster with a name no other test uses (they may share a ZooKeeper)."""
    return LocalCluster.up(directory, f"faults{next(_names)}", zk=zk, **options)


def stop_cluster(cluster: LocalCluster) -> None:
    """Stop every PID of ``cluster``; fail if one is left behind."""
    left = cluster.down()
    assert left == [], f"processes left behind: {left}"
    assert not any(alive(pid) for pid in cluster.every_pid())


@pytest.fixture
def new_cluster(tmp_path: Path, zookeeper: ZooKeeperServer) -> Iterator[Callable[..., LocalCluster]]:
    """``new_cluster(workers=2, masters=1, capacity=3, own_zookeeper=False)``: a cluster for this test only."""
    clusters: list[LocalCluster] = []

    def make(own_zookeeper: bool = False, **options: Any) -> LocalCluster:
        directory = tmp_path / f"cluster{len(clusters)}"
        directory.mkdir()
        cluster = start_cluster(directory, None if own_zookeeper else zookeeper.address, **options)
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            stop_cluster(cluster)


@pytest.fixture
def figures() -> Callable[[str], None]:
    """``figures(line)``: a measured figure, printed in the run's summary."""
    return FIGURES.append


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("fault matrix figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
def test_hosts_possible() -> None:
    """Test hosts (network namespaces) can be made here. Without root the test is skipped, saying so: no install
    step can give a run root. Without ``ip`` or ``nft`` it fails: ``make test`` installs them."""
    if os.geteuid() != 0:
        pytest.skip("test hosts need network namespaces, and 'ip netns add' needs root")
    reason = unavailable()
    assert reason is None, reason
