"""The local ZooKeeper launcher and the coordinator, against a real server."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from streamlet.backends.cluster.local.child_process import stop_child
from streamlet.backends.cluster.local.local_cluster import alive, stop_pid
from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer, find_classpath, four_letter_word
from streamlet.backends.cluster.tree.store import ClusterStore, MemoryClusterStore, MemoryTree, Version
from streamlet.backends.cluster.tree.zk import ZkStore
from streamlet.errors import CoordinationError, VersionConflict
from tests.integration.conftest import TEST_SECRET
from tests.support.cluster import wait_for_exit

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


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
from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer

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
    from streamlet.backends.cluster.local import zookeeper_server as zookeeper

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
    from streamlet.backends.cluster.local.zookeeper_server import free_port
    from streamlet.errors import CoordinationError

    address = f"127.0.0.1:{free_port()}"
    coordinator = ZkStore(address, "nowhere", session_timeout=1.0)
    with pytest.raises(CoordinationError, match=rf"^cannot reach ZooKeeper at {address}: "):
        await coordinator.start()
    await coordinator.aclose()


# -- watches see every change ------------------------------------------------------------------------------------------


async def test_a_waiter_wakes_when_the_node_it_saw_is_deleted_and_created_again(
    zk: ZkStore, zookeeper: ZooKeeperServer, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleted and created again (version 0 again) before the waiter looks: the waiter returns the new node."""
    async with ZkStore(zookeeper.address, cluster_name, session_timeout=2.0, secret=TEST_SECRET) as writer:
        await writer.create("/trigger", {"epoch": 1})
        seen = await zk.get("/trigger")
        assert seen is not None
        loop, client = asyncio.get_running_loop(), zk._client
        read, looks = client.get, []
        watching, recreated = asyncio.Event(), threading.Event()

        def look_once_recreated(path: str, watch: Any = None) -> Any:
            # kazoo's thread. The first look sets the watch; the next (woken by the deletion) waits until the node
            # is back, as a loaded waiter would: what ZooKeeper's one-shot watch then shows is the node at version 0
            looks.append(path)
            if len(looks) > 1:
                assert recreated.wait(10), "the node was not re-created"
            found = read(path, watch=watch)
            loop.call_soon_threadsafe(watching.set)
            return found

        monkeypatch.setattr(client, "get", look_once_recreated)
        waiter = asyncio.ensure_future(zk.wait_changed("/trigger", seen[1]))
        await asyncio.wait_for(watching.wait(), timeout=10)
        await writer.delete("/trigger")
        await writer.create("/trigger", {"epoch": 2})
        recreated.set()
        data, version = await asyncio.wait_for(waiter, timeout=10)
        now = await writer.get("/trigger")
    assert (data, version) == ({"epoch": 2}, 0)
    assert now is not None
    assert isinstance(version, Version)
    assert (version.mzxid == now[1].mzxid, version.mzxid > seen[1].mzxid, len(looks)) == (True, True, 2)


NODES = ("/n0", "/n1")
WRITES = st.tuples(st.sampled_from(("create", "set", "delete")), st.sampled_from(NODES), st.integers(0, 1))
_examples = itertools.count()


class CountedZkStore(ZkStore):
    """A session that knows when none of its calls to ZooKeeper (a waiter's look included) is under way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.under_way = 0
        self.idle = asyncio.Event()

    async def _call(self, fn: Callable[[], Any], reading: str | None = None) -> Any:
        self.under_way += 1
        self.idle.clear()
        try:
            return await super()._call(fn, reading)
        finally:
            self.under_way -= 1
            if not self.under_way:
                self.idle.set()

    async def settled(self) -> None:
        """Return once every task woken so far has run and none of them is waiting for ZooKeeper's answer."""
        while True:
            await asyncio.sleep(0)  # tasks woken so far take their turn: a watch that fired starts its look
            if not self.under_way:
                return
            await self.idle.wait()


@dataclass
class Sessions:
    """A writer and a reader on ZooKeeper, each on an event loop of its own, kept from example to example.

    Only the reader's loop runs while the reader's waiters may look, and only the writer's while it writes: a waiter
    woken by a write looks once the whole burst of writes is done, as in the memory store, where nothing runs
    between two writes. The two then answer alike, however ZooKeeper's notifications are timed.
    """

    writing: asyncio.Runner
    writer: ZkStore
    reading: asyncio.Runner
    reader: CountedZkStore


@dataclass(frozen=True)
class Seen:
    """What each store's reader saw of a node (``None``: absent) once it had had ``writes`` writes."""

    path: str
    versions: dict[str, Version | None]
    writes: int


class StoresAgree(RuleBasedStateMachine):
    """The same bursts of creates, sets and deletes on a MemoryClusterStore and on ZooKeeper, with waiters parked on
    versions seen at any time before: both answer as the model does, and so as each other."""

    seen = Bundle("seen")

    def __init__(self, zookeeper: Sessions) -> None:
        super().__init__()
        self.zookeeper = zookeeper
        self.base = f"/example{next(_examples)}"  # a tree of its own on the shared server
        tree = MemoryTree()
        self.memory = (MemoryClusterStore(tree), MemoryClusterStore(tree))  # writer, reader
        self.nodes: dict[str, tuple[int, int] | None] = dict.fromkeys(NODES)  # the model: (data, version)
        self.writes = dict.fromkeys(NODES, 0)  # the writes that changed each node so far
        self.waiters: list[tuple[Seen, dict[str, asyncio.Task[tuple[Any, Version | None]]]]] = []

    def read(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the readers' loop (the memory store's too)."""
        return self.zookeeper.reading.run(work)

    def readers(self) -> dict[str, ClusterStore]:
        return {"memory": self.memory[1], "zookeeper": self.zookeeper.reader}

    @rule(target=seen, path=st.sampled_from(NODES))
    def look(self, path: str) -> Seen:
        versions = {}
        for name, reader in self.readers().items():
            found = self.read(reader.get(self.base + path))
            assert found == self.nodes[path], name
            versions[name] = None if found is None else found[1]
        return Seen(path, versions, self.writes[path])

    @precondition(lambda self: len(self.waiters) < 4)
    @rule(held=seen)
    def park(self, held: Seen) -> None:
        loop = self.zookeeper.reading.get_loop()
        tasks = {
            name: loop.create_task(reader.wait_changed(self.base + held.path, held.versions[name]))
            for name, reader in self.readers().items()
        }
        self.waiters.append((held, tasks))
        self.read(self.zookeeper.reader.settled())  # its first look is done: it is parked or it returned

    @rule(path=st.sampled_from(NODES), data=st.integers(0, 1))
    def recreate(self, path: str, data: int) -> None:
        """The burst that brings a node back at version 0 (common enough to be tried often)."""
        self.burst([("delete", path, data), ("create", path, data)])

    @rule(writes=st.lists(WRITES, min_size=1, max_size=3))
    def burst(self, writes: list[tuple[str, str, int]]) -> None:
        """Writes no waiter can look between: several may show to it as one, in both stores."""
        on_zookeeper = self.zookeeper.writing.run(self._write_all(self.zookeeper.writer, writes))
        in_memory = self.read(self._write_all(self.memory[0], writes))
        assert in_memory == on_zookeeper
        for (kind, path, data), answer in zip(writes, in_memory, strict=True):
            node = self.nodes[path]
            if answer == "done" and (kind != "delete" or node is not None):  # deleting nothing changes nothing
                self.nodes[path] = None if kind == "delete" else (data, 0 if node is None else node[1] + 1)
                self.writes[path] += 1

    async def _write_all(self, store: ClusterStore, writes: list[tuple[str, str, int]]) -> list[str]:
        """Each write's answer: ``"done"``, or the class of the error that refused it."""
        answers = []
        for kind, path, data in writes:
            try:
                if kind == "create":
                    await store.create(self.base + path, data)
                elif kind == "set":
                    await store.set(self.base + path, data)
                else:
                    await store.delete(self.base + path)
                answers.append("done")
            except CoordinationError as exc:
                answers.append(type(exc).__name__)
        return answers

    def changed_since(self, held: Seen) -> bool:
        """The model's answer: a write since, unless the node was absent then and is absent again."""
        absent = held.versions["memory"] is None and self.nodes[held.path] is None
        return self.writes[held.path] != held.writes and not absent

    @invariant()
    def waiters_wake_exactly_when_their_node_changed(self) -> None:
        """In both stores, the waiters whose node changed returned it as it is now; no other waiter returned."""
        self.read(self.zookeeper.reader.settled())
        for held, tasks in list(self.waiters):
            if not self.changed_since(held):
                assert [name for name, task in tasks.items() if task.done()] == [], held
                continue
            assert tasks["memory"].done(), f"{held} slept through a change in memory"
            for name, task in tasks.items():
                data, version = self.read(asyncio.wait_for(asyncio.shield(task), timeout=10))
                now = self.read(self.readers()[name].get(self.base + held.path))
                assert (data, version) == (self.nodes[held.path] or (None, None)), name
                assert (None if version is None else version.mzxid) == (None if now is None else now[1].mzxid), name
            self.waiters.remove((held, tasks))
        self.read(self.zookeeper.reader.settled())

    @invariant()
    def writes_are_ordered_alike(self) -> None:
        """Both stores' mzxids order the nodes' last writes the same way."""
        orders = []
        for reader in self.readers().values():
            made = {path: found[1].mzxid for path in NODES if (found := self.read(reader.get(self.base + path)))}
            orders.append(sorted(made, key=made.__getitem__))
        assert orders[0] == orders[1]

    def teardown(self) -> None:
        self.read(self._stop_waiters())

    async def _stop_waiters(self) -> None:
        tasks = [task for _, both in self.waiters for task in both.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # a look under way ends first: nothing left on the loop


def test_memory_and_zookeeper_answer_every_sequence_of_writes_alike(
    zookeeper: ZooKeeperServer, cluster_name: str
) -> None:
    """Random bursts of creates, sets and deletes, with waiters on old and new versions: both stores answer alike."""
    with asyncio.Runner() as writing, asyncio.Runner() as reading:
        writer = ZkStore(zookeeper.address, cluster_name, session_timeout=10.0, secret=TEST_SECRET)
        reader = CountedZkStore(zookeeper.address, cluster_name, session_timeout=10.0, secret=TEST_SECRET)
        writing.run(writer.start())
        try:
            reading.run(reader.start())
            try:
                run_state_machine_as_test(
                    lambda: StoresAgree(Sessions(writing, writer, reading, reader)),
                    settings=settings(max_examples=50, stateful_step_count=20, deadline=None),
                )
            finally:
                reading.run(reader.aclose())
        finally:
            writing.run(writer.aclose())
