"""MemoryClusterStore: the semantics the cluster's logic relies on (versions, ephemerals, transactions, watches)."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from streamlet.backends.cluster.tree.store import (
    Check,
    CoordinationError,
    Create,
    Delete,
    MemoryClusterStore,
    MemoryTree,
    NodeExists,
    SetData,
    Version,
    VersionConflict,
    write_fenced,
)

T = TypeVar("T")


@pytest.fixture
def tree() -> MemoryTree:
    """An empty shared tree."""
    return MemoryTree()


async def test_create_get_and_versioned_set(tree: MemoryTree) -> None:
    """A set at a stale version is refused; a set at the current one bumps it."""
    store = MemoryClusterStore(tree)
    await store.create("/jobs/a/state", {"state": "SUBMITTED"})
    assert await store.get("/jobs/a/state") == ({"state": "SUBMITTED"}, 0)
    assert await store.set("/jobs/a/state", {"state": "RUNNING"}, version=0) == 1
    with pytest.raises(VersionConflict, match=r"^/jobs/a/state is at version 1, not 0$"):
        await store.set("/jobs/a/state", {"state": "FAILED"}, version=0)
    with pytest.raises(NodeExists):
        await store.create("/jobs/a/state", {})


async def test_data_must_be_json(tree: MemoryTree) -> None:
    """What ZooKeeper could not hold fails at once, not in another process."""
    with pytest.raises(TypeError):
        await MemoryClusterStore(tree).create("/x", {"bad": object()})


async def test_ephemeral_nodes_go_with_an_expired_session(tree: MemoryTree) -> None:
    """expire() removes the session's ephemeral nodes and tells its listeners lost, then connected."""
    worker, other = MemoryClusterStore(tree), MemoryClusterStore(tree)
    heard: list[str] = []
    worker.on_state(heard.append)
    await worker.create("/workers/w1", {}, ephemeral=True)
    await other.create("/workers/w2", {}, ephemeral=True)
    worker.expire()
    assert await other.children("/workers") == ["w2"]
    assert heard == ["lost", "connected"]


async def test_a_transaction_applies_all_or_nothing(tree: MemoryTree) -> None:
    """A failed check leaves every other step undone."""
    store = MemoryClusterStore(tree)
    await store.create("/fence", {})
    await store.set("/fence", {})
    assert not await store.commit([Check("/fence", 0), Create("/out", 1)])
    assert await store.get("/out") is None
    assert await store.commit([Check("/fence", 1), Create("/out", 1), SetData("/fence", {}, 1)])
    assert await store.get("/out") == (1, 0)


async def test_write_fenced_fails_once_the_fence_moved(tree: MemoryTree) -> None:
    """A write fenced on an assignment's version fails after a newer attempt replaced it."""
    store = MemoryClusterStore(tree)
    await store.create("/assignment", {"attempt": 1})
    await store.set("/assignment", {"attempt": 2}, version=0)
    assert not await write_fenced(store, "/done", {"ok": True}, None, ("/assignment", 0))
    assert await write_fenced(store, "/done", {"ok": True}, None, ("/assignment", 1))


async def test_a_suspended_session_refuses_calls_until_resumed(tree: MemoryTree) -> None:
    """Calls fail while suspended, as kazoo's do, and work again after resume()."""
    store = MemoryClusterStore(tree)
    store.suspend()
    with pytest.raises(CoordinationError, match=r"^the store session is suspended$"):
        await store.get("/x")
    store.resume()
    assert await store.get("/x") is None


async def test_wait_changed_returns_when_another_session_writes(tree: MemoryTree) -> None:
    """A watch wakes on the write, with the new data and version."""
    reader, writer = MemoryClusterStore(tree), MemoryClusterStore(tree)
    seen: list[object] = []
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            seen.append(await reader.wait_changed("/trigger", None))

        group.start_soon(watch)
        await anyio.wait_all_tasks_blocked()
        await writer.create("/trigger", {"epoch": 1})
    assert seen == [({"epoch": 1}, 0)]


async def test_watch_children_is_set_on_every_change(tree: MemoryTree) -> None:
    """The children watch stays armed: it is set again after being cleared."""
    store = MemoryClusterStore(tree)
    changed = await store.watch_children("/workers")
    await store.create("/workers/w1", {}, ephemeral=True)
    assert changed.is_set()
    changed.clear()
    store.expire()
    assert changed.is_set()


# -- versions carry the write that made them; waiters see every change ------------------------------------------------


async def test_versions_carry_the_id_of_the_write_that_made_them(tree: MemoryTree) -> None:
    """get and set hand out the data version with the tree's zxid of the write; a transaction is one write."""
    store = MemoryClusterStore(tree)
    await store.create("/a", 1)  # write 1
    assert repr(await store.get("/a")) == "Found(data=1, version=Version(0, mzxid=1))"
    assert repr(await store.set("/a", 2, version=0)) == "Version(1, mzxid=2)"
    assert await store.commit([SetData("/a", 3, 1), Create("/b", 4), Delete("/a")])  # write 3, every step
    assert repr(await store.get("/b")) == "Found(data=4, version=Version(0, mzxid=3))"
    await store.create("/a", 5)
    assert repr(await store.get("/a")) == "Found(data=5, version=Version(0, mzxid=4))"


def test_a_version_is_its_data_version_wherever_an_int_goes() -> None:
    """It equals, hashes and prints as the int (paths, messages, Check), and pickles with its mzxid."""
    version = Version(3, mzxid=17)
    assert (version == 3, hash(version) == hash(3), f"{version}", str(version)) == (True, True, "3", "3")
    assert repr(pickle.loads(pickle.dumps(version))) == "Version(3, mzxid=17)"


async def test_a_waiter_wakes_when_the_node_it_saw_is_deleted_and_created_again(tree: MemoryTree) -> None:
    """Re-created at version 0 between two looks, the node has a new mzxid: a waiter holding version 0 returns it."""
    reader, writer = MemoryClusterStore(tree), MemoryClusterStore(tree)
    await writer.create("/trigger", {"epoch": 1})
    seen = await reader.get("/trigger")
    assert seen is not None
    waiter = asyncio.ensure_future(reader.wait_changed("/trigger", seen[1]))
    await ready_tasks_run()
    await writer.delete("/trigger")
    await writer.create("/trigger", {"epoch": 2})  # no await in between that lets the waiter look: one change to it
    await ready_tasks_run()
    assert waiter.done(), "the waiter slept through the node's re-creation"
    assert repr(waiter.result()) == "({'epoch': 2}, Version(0, mzxid=3))"  # writes: create, delete, create


async def test_a_plain_int_version_compares_data_versions_only(tree: MemoryTree) -> None:
    """Held without an mzxid (an int), version 0 of the re-created node looks the same: only its next write wakes."""
    reader, writer = MemoryClusterStore(tree), MemoryClusterStore(tree)
    await writer.create("/trigger", {"epoch": 1})
    waiter = asyncio.ensure_future(reader.wait_changed("/trigger", 0))
    await ready_tasks_run()
    await writer.delete("/trigger")
    await writer.create("/trigger", {"epoch": 2})
    await ready_tasks_run()
    assert not waiter.done()
    await writer.set("/trigger", {"epoch": 3})
    await ready_tasks_run()
    assert waiter.result() == ({"epoch": 3}, 1)


async def ready_tasks_run() -> None:
    """Yield to the loop once: every task woken so far runs to its next wait (a memory store never suspends)."""
    await asyncio.sleep(0)


NODES = ("/n0", "/n1")
WRITES = st.tuples(st.sampled_from(("create", "set", "delete")), st.sampled_from(NODES), st.integers(0, 1))


@dataclass(frozen=True)
class Seen:
    """What a reader saw of a node: its version (``None``: absent) when the node had had ``writes`` writes."""

    path: str
    version: Version | None
    writes: int


class WatchedNodes(RuleBasedStateMachine):
    """Bursts of create/set/delete on two nodes, with waiters parked on versions seen at any time before."""

    seen = Bundle("seen")

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        tree = MemoryTree()
        self.writer, self.reader = MemoryClusterStore(tree), MemoryClusterStore(tree)
        self.nodes: dict[str, tuple[int, int] | None] = dict.fromkeys(NODES)  # the model: (data, version)
        self.writes = dict.fromkeys(NODES, 0)  # the writes that changed each node so far
        self.waiters: list[tuple[Seen, asyncio.Task[tuple[Any, Version | None]]]] = []

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(work)

    @rule(target=seen, path=st.sampled_from(NODES))
    def look(self, path: str) -> Seen:
        found = self.run(self.reader.get(path))
        assert found == self.nodes[path]
        return Seen(path, None if found is None else found[1], self.writes[path])

    @precondition(lambda self: len(self.waiters) < 4)
    @rule(held=seen)
    def park(self, held: Seen) -> None:
        task = self.runner.get_loop().create_task(self.reader.wait_changed(held.path, held.version))
        self.waiters.append((held, task))

    @rule(path=st.sampled_from(NODES), data=st.integers(0, 1))
    def recreate(self, path: str, data: int) -> None:
        """The burst that brings a node back at version 0 (common enough to be tried often)."""
        self.burst([("delete", path, data), ("create", path, data)])

    @rule(writes=st.lists(WRITES, min_size=1, max_size=3))
    def burst(self, writes: list[tuple[str, str, int]]) -> None:
        """Writes with no chance for a waiter to look between them: they may show to it as one."""
        self.run(self._write_all(writes))

    async def _write_all(self, writes: list[tuple[str, str, int]]) -> None:
        for kind, path, data in writes:
            await self._write(kind, path, data)

    async def _write(self, kind: str, path: str, data: int) -> None:
        node = self.nodes[path]
        if kind == "create":
            if node is not None:
                with pytest.raises(NodeExists):
                    await self.writer.create(path, data)
                return
            await self.writer.create(path, data)
            self.nodes[path] = (data, 0)
        elif kind == "set":
            if node is None:
                with pytest.raises(CoordinationError, match=r"^no node "):
                    await self.writer.set(path, data)
                return
            assert await self.writer.set(path, data) == node[1] + 1
            self.nodes[path] = (data, node[1] + 1)
        else:
            await self.writer.delete(path)
            if node is None:
                return  # nothing there: nothing changed
            self.nodes[path] = None
        self.writes[path] += 1

    def changed_since(self, held: Seen) -> bool:
        """The model's answer: a write since, unless the node was absent then and is absent again."""
        return self.writes[held.path] != held.writes and not (held.version is None and self.nodes[held.path] is None)

    @invariant()
    def waiters_wake_exactly_when_their_node_changed(self) -> None:
        """Every waiter whose node changed since its version returned the node as it is now; no other did."""
        self.run(ready_tasks_run())
        for held, task in list(self.waiters):
            if not self.changed_since(held):
                assert not task.done(), f"{held} woke with no change since: {task.result()}"
                continue
            assert task.done(), f"{held} slept through a change to {self.nodes[held.path]}"
            data, version = task.result()
            now = self.run(self.reader.get(held.path))
            assert (data, version) == (self.nodes[held.path] or (None, None))
            assert (None if version is None else version.mzxid) == (None if now is None else now[1].mzxid)
            self.waiters.remove((held, task))

    def teardown(self) -> None:
        for _, task in self.waiters:
            task.cancel()
        self.runner.close()


test_a_waiter_wakes_after_every_change_since_the_version_it_holds = WatchedNodes.TestCase
