"""MemoryClusterStore: the semantics the cluster's logic relies on (versions, ephemerals, transactions, watches)."""

from __future__ import annotations

import anyio
import pytest

from streamlet.backends.cluster.store import (
    Check,
    CoordinationError,
    Create,
    MemoryClusterStore,
    MemoryTree,
    NodeExists,
    SetData,
    VersionConflict,
    write_fenced,
)


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
