"""Cluster checkpoints: merging the workers' parts, and the agreement between workers on the in-memory store."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import pytest

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree
from streamlet.backends.cluster.worker.checkpoint_agreement import (
    AttemptInfo,
    RestoreScope,
    ZkAgreement,
    merge_parts,
)
from streamlet.backends.cluster.worker.part_replicator import PartReplicator
from streamlet.backends.cluster.worker.replica_service import ReplicaService, instances_of, piece
from streamlet.core.model import world
from streamlet.core.state.store import encode
from streamlet.errors import JobError
from streamlet.testing import ManualClock
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient

SECRET = b"test secret"


def part(worker_sources: list[list[object]], worker_tasks: list[list[object]], finished: bool = False) -> dict:
    return {
        "epoch": 4,
        "job": "wc",
        "finished": finished,
        "attempt": "wc.u1.2",
        "sources": {"lines": worker_sources} if worker_sources else {},
        "tasks": {"count": worker_tasks} if worker_tasks else {},
        "layout": {"count": {"owners": [0, 1, 2], "instances": 3, "version": 2}},
    }


def test_parts_merge_into_instance_order_whichever_worker_held_which_instance() -> None:
    """Worker b held count.0 and lines.1, worker a the rest: the document lists each node by index."""
    a = part([[0, 100]], [[1, {"state": "s1"}], [2, {"state": "s2"}]])
    b = part([[1, 250]], [[0, {"state": "s0"}]])
    merged = merge_parts([a, b])
    assert merged == {
        "epoch": 4,
        "job": "wc",
        "finished": False,
        "attempt": "wc.u1.2",
        "sources": {"lines": [100, 250]},
        "tasks": {"count": [{"state": "s0"}, {"state": "s1"}, {"state": "s2"}]},
        "sinks": {},
        "layout": {"count": {"owners": [0, 1, 2], "instances": 3, "version": 2}},
    }


def test_the_output_a_collect_sink_kept_merges_and_is_cut_by_instance_like_state() -> None:
    """out.1's collected records in worker a's part, out.0's in b's: the document lists them by index, and a
    replica piece for out.0 holds out.0's alone."""
    a = {**part([[0, 1]], [[0, {}]]), "sinks": {"out": [[1, [["k", 2, 0.0]]]]}}
    b = {**part([[1, 2]], [[1, {}], [2, {}]]), "sinks": {"out": [[0, [["k", 1, 0.0]]]]}}
    assert merge_parts([a, b])["sinks"] == {"out": [[["k", 1, 0.0]], [["k", 2, 0.0]]]}
    assert piece(b, ["out.0"])["sinks"] == {"out": [[0, [["k", 1, 0.0]]]]}
    assert instances_of(b) == ["lines.1", "count.1", "count.2", "out.0"]


def test_a_document_is_finished_only_when_every_part_is() -> None:
    """One worker's final snapshot does not make the whole checkpoint final."""
    assert merge_parts([part([[0, 1]], [], finished=True), part([], [[0, {}]])])["finished"] is False
    assert merge_parts([part([[0, 1]], [], finished=True), part([], [[0, {}]], finished=True)])["finished"] is True


def test_a_missing_instance_is_an_error_naming_the_node() -> None:
    """A part that never arrived must not restore a job with a hole in its state."""
    with pytest.raises(JobError, match="checkpoint 4: instances of 'count' are missing"):
        merge_parts([part([[0, 1]], [[0, {}], [2, {}]])])


def test_a_worker_restoring_only_a_sink_still_learns_which_run_staged_the_checkpoints_output() -> None:
    """A sink that stages its output outside keeps no state, so its worker reads no piece; the completed record
    names the run (and job id), so the sink publishes what that run staged for the checkpoint: its output is
    part of the checkpoint."""
    completed = {"attempt": 2, "epoch": 4, "workers": ["w0"], "finished": False, "holders": {"lines.0": ["w0"]},
                 "layout": {}, "run": "wc.u1.2", "job_id": "c.wc"}  # fmt: skip
    assert merge_parts([], completed) == {
        "epoch": 4, "job": "c.wc", "finished": False, "attempt": "wc.u1.2", "layout": {}, "sources": {}, "tasks": {},
        "sinks": {},
    }  # fmt: skip


def test_a_piece_leaves_the_instances_another_worker_restores_empty() -> None:
    """This worker read count.1 only: count.0 and count.2 are None in their places, the count stays 3."""
    completed = {"attempt": 2, "epoch": 4, "workers": ["w0"], "finished": False,
                 "holders": {f"count.{i}": ["w0"] for i in range(3)}, "layout": {}}  # fmt: skip
    merged = merge_parts([part([], [[1, {"state": "s1"}]])], completed)
    assert merged["tasks"] == {"count": [None, {"state": "s1"}, None]}


class FakeCoordinator:
    """What an agreement drives: records the epochs begun and committed, in order."""

    def __init__(self) -> None:
        self.next_epoch = 1
        self.calls: list[tuple[str, int]] = []

    async def begin(self, epoch: int, final: bool = False, pause: bool = False) -> None:
        self.next_epoch = max(self.next_epoch, epoch + 1)
        self.calls.append(("final" if final else "pause" if pause else "begin", epoch))

    async def commit_through(self, epoch: int) -> None:
        self.calls.append(("commit", epoch))


async def settle_on(store: MemoryClusterStore) -> None:
    """Let every watcher react to the last write (the store wakes them on the loop)."""
    await anyio.wait_all_tasks_blocked()


@pytest.fixture(autouse=True)
def files_under_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each agreement's own folder (``tempfile.mkdtemp``) goes under the test's tmp_path, removed with it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture
def tree() -> MemoryTree:
    """The shared in-memory tree, with the job's assignment at version 0."""
    return MemoryTree()


def agreement(tree: MemoryTree, worker: str, attempt: int = 1, version: int = 0, interval: float | None = None,
              clock: ManualClock | None = None, root: Path | None = None) -> ZkAgreement:  # fmt: skip
    """Worker ``worker``'s agreement, keeping its files under ``root`` (default: a fresh temporary folder)
    and no replicas (``test_replication`` has them)."""
    info = AttemptInfo("wc", attempt, worker, ["w0", "w1"], version)
    store = MemoryClusterStore(tree)
    service = ReplicaService(root or Path(tempfile.mkdtemp(prefix="streamlet-test-")), worker, DataServer(SECRET),
                             TcpClient(SECRET))  # fmt: skip
    replicator = PartReplicator(store, service, "wc", attempt, replicas=0)
    scope = RestoreScope(frozenset(), {}, {})
    return ZkAgreement(store, info, replicator, scope, interval, clock or ManualClock())


async def saved(part_of: ZkAgreement, epoch: int, finished: bool) -> None:
    """The worker's coordinator saved its part of ``epoch`` (one instance of 'count'): the agreement hears so."""
    index = part_of.info.workers.index(part_of.info.worker)
    document = {**part([], [[index, {"state": index}]], finished), "epoch": epoch}
    data = encode(document)
    part_of.store.save(epoch, data)
    await part_of.saved(epoch, len(data), finished)


async def test_the_first_worker_triggers_and_the_last_ack_completes_for_both(tree: MemoryTree) -> None:
    """w0 triggers epoch 1 on its interval; both begin it; once both parts are saved both commit it."""
    await MemoryClusterStore(tree).create(paths.assignment("wc"), {"attempt": 1})
    clock = ManualClock()
    first, second = agreement(tree, "w0", interval=1.0, clock=clock), agreement(tree, "w1")
    seen = {"w0": FakeCoordinator(), "w1": FakeCoordinator()}
    async with anyio.create_task_group() as group:
        group.start_soon(first.run, seen["w0"])
        group.start_soon(second.run, seen["w1"])
        await settle_on(first.zk)
        assert seen["w0"].calls == seen["w1"].calls == [("begin", 1)]
        await saved(first, 1, False)
        await settle_on(first.zk)
        assert seen["w1"].calls == [("begin", 1)]  # not complete until w1's part is saved too
        await saved(second, 1, False)
        await settle_on(first.zk)
        assert seen["w0"].calls == seen["w1"].calls == [("begin", 1), ("commit", 1)]
        clock.advance(1.0)
        await settle_on(first.zk)
        assert seen["w1"].calls[-1] == ("begin", 2)
        group.cancel_scope.cancel()


async def test_a_replaced_attempt_cannot_complete_a_checkpoint(tree: MemoryTree) -> None:
    """Both parts saved, but the assignment moved on (version 1): nothing is published as completed."""
    client = MemoryClusterStore(tree)
    await client.create(paths.assignment("wc"), {"attempt": 1})
    await client.set(paths.assignment("wc"), {"attempt": 2})
    zombie_a, zombie_b = agreement(tree, "w0"), agreement(tree, "w1")
    await saved(zombie_a, 1, False)
    await saved(zombie_b, 1, False)
    assert await client.get(paths.completed("wc")) is None


async def test_the_final_checkpoint_begins_once_every_worker_has_finished(tree: MemoryTree) -> None:
    """finished() returns on both workers only after the final epoch, begun as final, completed."""
    await MemoryClusterStore(tree).create(paths.assignment("wc"), {"attempt": 1})
    parts = {"w0": agreement(tree, "w0"), "w1": agreement(tree, "w1")}
    seen = {"w0": FakeCoordinator(), "w1": FakeCoordinator()}
    ended: list[str] = []

    async def finish(worker: str) -> None:
        await parts[worker].finished()
        ended.append(worker)

    async with anyio.create_task_group() as group:
        for worker in parts:
            group.start_soon(parts[worker].run, seen[worker])
        group.start_soon(finish, "w0")
        await settle_on(parts["w0"].zk)
        assert seen["w0"].calls == []  # w1 has not finished: no final checkpoint yet
        assert ended == []
        group.start_soon(finish, "w1")
        await settle_on(parts["w0"].zk)
        assert seen["w0"].calls == seen["w1"].calls == [("final", 1)]
        await saved(parts["w0"], 1, True)
        await saved(parts["w1"], 1, True)
        await settle_on(parts["w0"].zk)
        assert sorted(ended) == ["w0", "w1"]
        group.cancel_scope.cancel()


async def test_a_new_attempt_numbers_its_checkpoints_after_every_earlier_trigger(tree: MemoryTree) -> None:
    """Attempt 1 triggered epoch 3 (never completed); attempt 2 restores from 2 but begins at 4, not 3."""
    client = MemoryClusterStore(tree)
    await client.create(paths.assignment("wc"), {"attempt": 2})
    await client.create(f"{paths.checkpoints('wc')}/attempt-1/trigger", {"epoch": 3, "final": False})
    fresh = agreement(tree, "w0", attempt=2, interval=1.0)
    assert await fresh.restore_point() is None  # nothing completed: a fresh start, but numbering goes on
    seen = FakeCoordinator()
    async with anyio.create_task_group() as group:
        group.start_soon(fresh.run, seen)
        await settle_on(fresh.zk)
        assert seen.calls == [("begin", 4)]
        group.cancel_scope.cancel()


async def test_a_graceful_stop_pauses_every_worker_and_returns_once_complete(tree: MemoryTree) -> None:
    """stop_checkpoint on w1: both workers begin the epoch as a pause; it returns when both parts are saved."""
    await MemoryClusterStore(tree).create(paths.assignment("wc"), {"attempt": 1})
    parts = {"w0": agreement(tree, "w0"), "w1": agreement(tree, "w1")}
    seen = {"w0": FakeCoordinator(), "w1": FakeCoordinator()}
    stopped: list[int | None] = []

    async def stop() -> None:
        stopped.append(await parts["w1"].stop_checkpoint())

    async with anyio.create_task_group() as group:
        for worker in parts:
            group.start_soon(parts[worker].run, seen[worker])
        group.start_soon(stop)
        await settle_on(parts["w0"].zk)
        assert seen["w0"].calls == seen["w1"].calls == [("pause", 1)]
        await saved(parts["w0"], 1, False)
        await settle_on(parts["w0"].zk)
        assert stopped == []  # w1's own part is not saved yet
        await saved(parts["w1"], 1, False)
        await settle_on(parts["w0"].zk)
        assert stopped == [1]
        group.cancel_scope.cancel()


async def test_a_checkpoint_slower_than_the_interval_triggers_the_next_with_its_completion(
    tree: MemoryTree,
) -> None:
    """Epoch 1 took 2 s of a 1 s interval: the worker completing it publishes trigger 2 in the same transaction,
    so both begin epoch 2 at once, with no turn of the triggering worker's clock."""
    wall = Wall(1000.0)
    with world.using(wall):
        await _slower_than_the_interval(tree, wall)


async def _slower_than_the_interval(tree: MemoryTree, wall: Wall) -> None:
    await MemoryClusterStore(tree).create(paths.assignment("wc"), {"attempt": 1})
    first, second = agreement(tree, "w0", interval=1.0), agreement(tree, "w1", interval=1.0)
    seen = {"w0": FakeCoordinator(), "w1": FakeCoordinator()}
    async with anyio.create_task_group() as group:
        group.start_soon(first.run, seen["w0"])
        group.start_soon(second.run, seen["w1"])
        await settle_on(first.zk)
        wall.now += 2.0
        await saved(first, 1, False)
        await saved(second, 1, False)
        await settle_on(first.zk)
        assert seen["w0"].calls == seen["w1"].calls == [("begin", 1), ("commit", 1), ("begin", 2)]
        trigger = await first.zk.get(f"{paths.checkpoints('wc')}/attempt-1/trigger")
        assert trigger is not None
        assert trigger[0] == {"epoch": 2, "final": False, "pause": False, "at": 1002.0, "since": 1}
        group.cancel_scope.cancel()


class Wall(world.RealWorld):
    """The time of day a test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def wall_time(self) -> float:
        return self.now
