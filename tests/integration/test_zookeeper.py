"""The local ZooKeeper launcher and the coordinator, against a real server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamlet.backends.cluster.child_process import stop_child
from streamlet.backends.cluster.local_cluster import alive, stop_pid
from streamlet.backends.cluster.zk import ZkStore
from streamlet.backends.cluster.zookeeper import ZooKeeperServer, find_classpath, four_letter_word
from streamlet.errors import VersionConflict
from tests.integration.conftest import TEST_SECRET
from tests.support.cluster import wait_for_exit

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_launcher_starts_a_server_and_stops_it_by_pid(tmp_path: Path) -> None:
    """A server answers 'imok'; after stop() its process is gone."""
    server = ZooKeeperServer(data_dir=tmp_path).start()
    assert server.process is not None
    pid = server.process.pid
    try:
        assert four_letter_word("127.0.0.1", server.port) == "imok"
        assert (tmp_path / "zoo.cfg").read_text(encoding="utf-8").splitlines()[:3] == [
            "tickTime=500",
            f"dataDir={tmp_path / 'data'}",
            f"clientPort={server.port}",
        ]
    finally:
        server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


STARTER = """
import sys, time
from pathlib import Path
from streamlet.backends.cluster.zookeeper import ZooKeeperServer

server = ZooKeeperServer(data_dir=Path(sys.argv[1]), die_with_parent=True).start()
print(server.process.pid, flush=True)
time.sleep(60)
"""


def test_a_server_started_with_die_with_parent_ends_when_its_starter_is_killed(tmp_path: Path) -> None:
    """The test fixture's guarantee: SIGKILL the process that started the server, and the server ends too."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    server_pid = 0
    try:
        assert starter.stdout is not None
        server_pid = int(starter.stdout.readline())
        assert alive(server_pid)
        starter.kill()
        starter.wait(timeout=10)
        assert wait_for_exit(server_pid, seconds=15), "the server outlived the process that started it"
    finally:
        stop_child(starter)
        if starter.stdout is not None:
            starter.stdout.close()
        if server_pid and alive(server_pid):
            stop_pid(server_pid)


def test_missing_installation_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no ZooKeeper anywhere, the error names the package to install."""
    from streamlet.backends.cluster import zookeeper

    monkeypatch.delenv("ZOOKEEPER_HOME", raising=False)
    monkeypatch.setattr(zookeeper, "DEBIAN_JAR", Path("/nonexistent/zookeeper.jar"))
    monkeypatch.setattr(zookeeper.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        zookeeper.ZooKeeperError,
        match=r"^no ZooKeeper server found: install one \(Debian: 'apt-get install -y zookeeper'\)",
    ):
        find_classpath()


async def test_nodes_hold_json_and_versioned_writes_detect_conflicts(zk: ZkStore) -> None:
    """set(version=...) succeeds only from the version read; a stale write raises VersionConflict."""
    await zk.create("/jobs/wc/spec", {"module": "examples.wordcount", "parallelism": {"count": 2}})
    data, version = await zk.get("/jobs/wc/spec") or (None, -1)
    assert data == {"module": "examples.wordcount", "parallelism": {"count": 2}}
    new_version = await zk.set("/jobs/wc/spec", {"module": "x"}, version=version)
    assert new_version == version + 1
    with pytest.raises(VersionConflict):
        await zk.set("/jobs/wc/spec", {"module": "y"}, version=version)
    assert await zk.children("/jobs") == ["wc"]
    assert await zk.get("/jobs/missing") is None


async def test_wait_changed_returns_a_node_created_between_its_read_and_its_watch(
    zk: ZkStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node appears after the read found none but before the watch is set: it is returned, not waited past
    (the watch would only fire at its next change, which may never come)."""
    import kazoo.exceptions

    client: Any = zk._client
    read = client.get

    def appear_after_missing(path: str, watch: Any = None) -> Any:
        monkeypatch.setattr(client, "get", read)  # only the first read misses
        client.create(path, b'{"round": 1}', makepath=True)  # as another session would, just then
        raise kazoo.exceptions.NoNodeError

    monkeypatch.setattr(client, "get", appear_after_missing)
    found = await asyncio.wait_for(zk.wait_changed("/loops/counters/w0", None), timeout=5)
    assert found == ({"round": 1}, 0)


async def test_ephemeral_nodes_vanish_with_their_session(zookeeper: ZooKeeperServer, cluster_name: str) -> None:
    """A closed session takes its ephemeral node with it; wait_gone returns then."""
    async with ZkStore(zookeeper.address, cluster_name, session_timeout=2.0, secret=TEST_SECRET) as watcher:
        owner = ZkStore(zookeeper.address, cluster_name, session_timeout=2.0, secret=TEST_SECRET)
        await owner.start()
        await owner.create("/workers/w1", {"host": "127.0.0.1"}, ephemeral=True)
        waiting = asyncio.ensure_future(watcher.wait_gone("/workers/w1"))
        await owner.aclose()
        await asyncio.wait_for(waiting, timeout=5)
        assert await watcher.get("/workers/w1") is None


async def test_unreachable_zookeeper_is_a_clear_error() -> None:
    """A coordinator pointed at a port nobody serves fails with the address in the message."""
    from streamlet.backends.cluster.zookeeper import free_port
    from streamlet.errors import CoordinationError

    address = f"127.0.0.1:{free_port()}"
    coordinator = ZkStore(address, "nowhere", session_timeout=1.0)
    with pytest.raises(CoordinationError, match=rf"^cannot reach ZooKeeper at {address}: "):
        await coordinator.start()
    await coordinator.aclose()
