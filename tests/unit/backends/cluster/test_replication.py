"""Checkpoint replicas between workers: who backs up what, pushes and fetches over real loopback data servers,
corrupt and missing copies, superseded replicas, and the submit-time refusal of too many replicas."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.registry import WorkerRegistration
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree
from streamlet.backends.cluster.worker import part_replicator
from streamlet.backends.cluster.worker import replica_service as replicas
from streamlet.backends.cluster.worker.checkpoint_agreement import merge_parts
from streamlet.backends.cluster.worker.job_parts import files_to_keep
from streamlet.backends.cluster.worker.part_replicator import (
    PartReplicator,
    acknowledge_stored,
    backups_for,
    instances_to_restore,
)
from streamlet.backends.cluster.worker.replica_service import ReplicaService, instances_of
from streamlet.core.runtime.channel import Inbox
from streamlet.core.state.changelog import store_increments
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.rocks import RocksDBState
from streamlet.core.state.store import encode
from streamlet.errors import JobError, TransportError, UnusableCheckpoint
from streamlet.transport.blobs import CHUNK, BlobTooLarge, receive_blob, send_blob
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient
from tests.unit.backends.cluster.conftest import MemoryCluster

SECRET = b"replication secret"


def test_backups_follow_the_plan_while_its_workers_live_then_the_ring_after_the_owner() -> None:
    """The plan's w3 is live: kept; its w9 is gone: topped up from the ring after w1 (w2, then w3, w0)."""
    live = ["w0", "w1", "w2", "w3"]
    plan = {"count.0": ["w3"], "count.1": ["w9"]}
    chosen = backups_for("w1", ["count.0", "count.1", "lines.0"], live, plan, replicas=2)
    assert chosen == {"count.0": ["w3", "w2"], "count.1": ["w2", "w3"], "lines.0": ["w2", "w3"]}


def test_backups_never_include_the_owner_and_are_fewer_when_too_few_workers_live() -> None:
    """Two replicas asked, one other worker live: one copy; the owner named by the plan is skipped."""
    assert backups_for("w0", ["count.0"], ["w0", "w1"], {"count.0": ["w0"]}, replicas=2) == {"count.0": ["w1"]}
    assert backups_for("w0", ["count.0"], ["w0"], {}, replicas=1) == {"count.0": []}


def test_a_worker_restores_its_own_instances_or_all_of_a_task_whose_keys_move() -> None:
    """Same parallelism and table: only its own; 'count' rescaled 2 -> 3: every 'count' instance; 'lines'
    with a new segment table (a live change after the checkpoint): every 'lines' instance."""
    holders = {i: ["w0"] for i in ("lines.0", "lines.1", "count.0", "count.1")}
    local = {"lines.1", "count.1"}
    assert instances_to_restore(holders, local, {"lines": 2, "count": 2}, set()) == {"lines.1", "count.1"}
    assert instances_to_restore(holders, local, {"lines": 2, "count": 3}, set()) == {"lines.1", "count.0", "count.1"}
    assert instances_to_restore(holders, local, {"lines": 2, "count": 2}, {"lines"}) == {
        "lines.0", "lines.1", "count.1",
    }  # fmt: skip


def part(epoch: int, indexes: list[int]) -> dict[str, Any]:
    """A worker's part of checkpoint ``epoch``: 'count' instances ``indexes`` with 1000 keys each."""
    tasks = [[i, {"state": {f"key-{i}-{k}": k for k in range(1000)}}] for i in indexes]
    return {"epoch": epoch, "job": "c.wc", "finished": False, "attempt": "wc.u.1", "sources": {},
            "tasks": {"count": tasks}, "layout": {}}  # fmt: skip


@asynccontextmanager
async def workers(tmp_path: Path, names: list[str]) -> AsyncIterator[dict[str, PartReplicator]]:
    """Registered workers, each with a data server, a client and its own folder, serving replicas; each as
    the replicator of its part of attempt 1 of job 'wc'."""
    tree = MemoryTree()
    found: dict[str, PartReplicator] = {}
    async with anyio.create_task_group() as group, AsyncExitStack() as stack:  # the stack closes first
        for name in names:
            server = await stack.enter_async_context(DataServer(SECRET))
            client = await stack.enter_async_context(TcpClient(SECRET))
            zk = MemoryClusterStore(tree)
            info = {"host": server.host, "data_port": server.port, "capacity": 8, "labels": []}
            await WorkerRegistration(zk, name, info).register()
            service = ReplicaService(tmp_path / name, name, server, client)
            service.on_stored = lambda piece, owner, size, zk=zk, name=name: acknowledge_stored(
                zk, name, piece, owner, size
            )
            group.start_soon(service.run)
            found[name] = PartReplicator(zk, service, "wc", 1, replicas=1)
        await anyio.wait_all_tasks_blocked()  # every service accepts pushes
        yield found
        group.cancel_scope.cancel()


async def save_and_replicate(replicator: PartReplicator, document: dict[str, Any]) -> dict[str, list[str]]:
    """What a worker's coordinator and agreement do: save the part locally, then replicate it."""
    data = encode(document)
    replicator.service.parts("wc", 1).save(int(document["epoch"]), data)
    return await replicator.replicate(int(document["epoch"]), data)


def completed(epoch: int, *owned: tuple[str, dict[str, list[str]]]) -> dict[str, Any]:
    """The completed checkpoint's record as the last acknowledging worker publishes it."""
    holders = {instance: [owner, *backups] for owner, chosen in owned for instance, backups in chosen.items()}
    return {"attempt": 1, "epoch": epoch, "workers": [owner for owner, _ in owned], "finished": False,
            "holders": holders, "layout": {}}  # fmt: skip


async def test_a_part_is_acknowledged_only_once_its_backup_stored_it_and_survives_its_owners_disk(
    tmp_path: Path,
) -> None:
    """w0's part goes to w1 (the next worker); w1 acknowledges it in ZooKeeper; with w0's folder deleted, w2
    (which holds nothing) reads w0's instances from w1 over the data plane, exactly as saved."""
    async with workers(tmp_path, ["w0", "w1", "w2"]) as found:
        document = part(5, [0, 1])
        chosen = await save_and_replicate(found["w0"], document)
        assert chosen == {"count.0": ["w1"], "count.1": ["w1"]}
        assert await found["w0"].zk.children(paths.checkpoint_acks("wc", 1, 5)) == ["w0~w1"]
        shutil.rmtree(tmp_path / "w0")
        pieces = await found["w2"].read(completed(5, ("w0", chosen)), {"count.0", "count.1"})
        assert merge_parts(pieces) == merge_parts([document])
        assert found["w2"].service.counts["fetched_bytes"] > 2 * 1000 * 8


async def test_a_worker_holding_a_copy_reads_it_from_its_own_disk_and_fetches_nothing(tmp_path: Path) -> None:
    """The redeployed instance lands on its backup: the restore moves no byte over the network."""
    async with workers(tmp_path, ["w0", "w1"]) as found:
        chosen = await save_and_replicate(found["w0"], part(2, [0]))
        pieces = await found["w1"].read(completed(2, ("w0", chosen)), {"count.0"})
        assert instances_of(pieces[0]) == ["count.0"]
        assert found["w1"].service.counts["fetched_bytes"] == 0


async def test_a_corrupt_copy_is_logged_and_the_next_holder_is_asked(tmp_path: Path) -> None:
    """Two replicas (w1, w2) of w0's part; w0's folder gone and w1's copy flipped: w3 asks the owner, then
    w1, then gets it from w2; the log names both unusable copies and why."""
    async with workers(tmp_path, ["w0", "w1", "w2", "w3"]) as found:
        found["w0"].replicas = 2
        document = part(7, [0])
        chosen = await save_and_replicate(found["w0"], document)
        assert chosen == {"count.0": ["w1", "w2"]}
        shutil.rmtree(tmp_path / "w0")
        copy = found["w1"].service.replicas("wc", "w0").path(7)
        data = bytearray(copy.read_bytes())
        data[-10] ^= 0xFF
        copy.write_bytes(bytes(data))
        with capture_logs() as logs:
            pieces = await found["w3"].read(completed(7, ("w0", chosen)), {"count.0"})
        assert merge_parts(pieces) == merge_parts([document])
        warnings = [entry for entry in logs if entry["event"] == "checkpoint copy unusable, asking the next holder"]
        assert [(entry["holder"], entry["owner"], entry["epoch"]) for entry in warnings] == [
            ("w0", "w0", 7), ("w1", "w0", 7),
        ]  # fmt: skip
        assert warnings[0]["reason"].endswith("/w0/checkpoints/wc/attempt-1/w0 does not exist")
        assert "checksum mismatch" in warnings[1]["reason"]
        assert not (tmp_path / "w0").exists()  # asking for what is not there makes no folder for it


async def test_no_intact_copy_anywhere_marks_the_checkpoint_unusable_and_says_which_instance(tmp_path: Path) -> None:
    """w0's folder and w1's copy both gone: UnusableCheckpoint naming count.0 and its holders; the epoch is
    recorded unusable, so the next attempt takes the checkpoint before it."""
    async with workers(tmp_path, ["w0", "w1", "w2"]) as found:
        chosen = await save_and_replicate(found["w0"], part(4, [0]))
        shutil.rmtree(tmp_path / "w0")
        shutil.rmtree(tmp_path / "w1" / "replicas")
        with pytest.raises(UnusableCheckpoint) as refused:
            await found["w2"].read(completed(4, ("w0", chosen)), {"count.0"})
        assert refused.value.epoch == 4
        assert str(refused.value) == (
            "checkpoint 4 of job 'wc': no live worker holds an intact copy of count.0 (held by w0, w1)"
        )
        assert await found["w2"].zk.children(paths.unusable("wc")) == ["4"]


async def test_a_backup_keeps_the_newest_three_replicas_of_each_owner(tmp_path: Path) -> None:
    """Five checkpoints of w0: w1 keeps 3, 4 and 5 (the newest complete one and those before it)."""
    async with workers(tmp_path, ["w0", "w1"]) as found:
        for epoch in range(1, 6):
            await save_and_replicate(found["w0"], part(epoch, [0]))
        assert found["w1"].service.replicas("wc", "w0").epochs() == [3, 4, 5]


async def test_a_push_that_is_not_a_checkpoint_is_dropped_and_counted(tmp_path: Path) -> None:
    """Garbage on a replica channel: nothing stored, no acknowledgement, one bad request counted."""
    async with workers(tmp_path, ["w0", "w1"]) as found:
        sender, receiver = found["w0"].service, found["w1"].service
        with anyio.fail_after(10):
            channel = sender.client.channel(receiver.server.address, "replica/garbage")
            await send_blob(channel, b"not a checkpoint at all")
            await channel.release()  # delivered: the service takes it up at once
            await anyio.wait_all_tasks_blocked()
        assert receiver.counts["bad_requests"] == 1
        assert receiver.counts["stored"] == 0
        assert not (tmp_path / "w1" / "replicas").exists()


async def test_more_replicas_than_other_workers_are_refused_at_submit(cluster: MemoryCluster) -> None:
    """Two workers: --replicas 1 is fine, --replicas 2 is refused naming both numbers; nothing is written."""
    await cluster.add_worker("w0")
    await cluster.add_worker("w1")
    spec = job_commands.new_spec(cluster.module(), {}, {"interval": 1.0, "replicas": 2})
    with pytest.raises(JobError) as refused:
        await job_commands.submit(cluster.client, "p", spec, SECRET)
    assert str(refused.value) == (
        "--replicas 2 needs 3 workers (each copy on a worker other than the instance's own); "
        "the cluster has 2 registered"
    )
    assert await cluster.client.children(paths.JOBS) == []
    await job_commands.submit(
        cluster.client, "p", job_commands.new_spec(cluster.module(), {}, {"interval": 1.0, "replicas": 1}), SECRET
    )
    assert await cluster.client.children(paths.JOBS) == ["p"]


def test_a_sweep_keeps_what_a_restore_may_read_and_deletes_the_rest(tmp_path: Path) -> None:
    """Kept: epochs 4 (last complete, attempt 2) and 3 (the one before, attempt 1) with their attempts'
    parts; deleted: older replicas, attempt 0's parts; a job that is over loses everything."""
    service = ReplicaService(tmp_path / "w1", "w1", DataServer(SECRET), TcpClient(SECRET))
    for epoch in (2, 3, 4):
        service.replicas("wc", "w0").save(epoch, encode(part(epoch, [0])))
    for attempt, epoch in ((0, 1), (1, 3), (2, 4)):
        service.parts("wc", attempt).save(epoch, encode(part(epoch, [1])))
    assert service.sweep("wc", {4: 2, 3: 1}) == 2
    assert service.replicas("wc", "w0").epochs() == [3, 4]
    assert sorted(path.name for path in (tmp_path / "w1" / "checkpoints" / "wc").iterdir()) == [
        "attempt-1", "attempt-2",
    ]  # fmt: skip
    assert service.jobs() == {"wc"}
    assert service.sweep("wc", None) == 4
    assert service.jobs() == set()


async def test_the_files_to_keep_are_the_last_two_complete_checkpoints_of_a_job_not_over(
    cluster: MemoryCluster,
) -> None:
    """None complete: keep all (epoch 0); then the completed one and its previous; another submission of the
    same name (a removed job's leftovers), an ended job, a job that is gone: nothing."""
    await cluster.submit("p")
    found = await cluster.client.get(paths.job("p"))
    assert found is not None
    uid = str(found[0]["uid"])
    assert await files_to_keep(cluster.client, "p", uid) == {0: 0}
    previous = {"attempt": 1, "epoch": 3}
    await cluster.client.create(paths.completed("p"), {"attempt": 2, "epoch": 4, "previous": previous})
    assert await files_to_keep(cluster.client, "p", uid) == {4: 2, 3: 1}
    assert await files_to_keep(cluster.client, "p", "an-earlier-submission") is None
    await job_commands.kill(cluster.client, "p")
    await cluster.leader.round()
    assert await files_to_keep(cluster.client, "p", uid) is None
    assert await files_to_keep(cluster.client, "gone", uid) is None


async def test_a_push_or_fetch_naming_a_path_outside_the_folder_is_refused(tmp_path: Path) -> None:
    """A piece whose job is '../escape' is dropped and counted; nothing is written outside w1's folder."""
    async with workers(tmp_path, ["w0", "w1"]) as found:
        sender, receiver = found["w0"].service, found["w1"].service
        forged = {**part(1, [0]), "owner": "w0", "job_name": "../escape", "attempt_number": 1}
        with anyio.fail_after(10):
            await sender.push(receiver.server.address, forged)
            await anyio.wait_all_tasks_blocked()
        assert (receiver.counts["bad_requests"], receiver.counts["stored"]) == (1, 0)
        assert not (tmp_path / "w1" / "escape").exists()
        assert not (tmp_path / "escape").exists()


async def test_a_fetch_request_past_its_size_limit_is_dropped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 'fetch' blob larger than a request can be: the receiver stops taking it, drops what it had,
    counts a bad request, and answers nothing."""
    monkeypatch.setattr(replicas, "MAX_REQUEST", 3 * CHUNK)
    async with workers(tmp_path, ["w0", "w1"]) as found:
        sender, receiver = found["w0"].service, found["w1"].service
        with anyio.fail_after(10), capture_logs() as logs:
            channel = sender.client.channel(receiver.server.address, "fetch/huge")
            with contextlib.suppress(TransportError):  # the receiver may close the connection on what follows
                await send_blob(channel, b"x" * (4 * CHUNK))
                await channel.release()  # delivered: the service takes it up at once
            await anyio.wait_all_tasks_blocked()
        assert receiver.counts["bad_requests"] == 1
        [dropped] = [entry for entry in logs if entry["event"] == "dropping a replica transfer"]
        assert (
            dropped["reason"]
            == f"BlobTooLarge: a blob passed the {3 * CHUNK} bytes its receiver takes ({3 * CHUNK + CHUNK} so far)"
        )
        assert receiver.counts["stored"] == 0


async def test_a_blob_past_max_bytes_is_refused_by_its_receiver() -> None:
    """receive_blob stops once the chunks pass max_bytes, naming the limit."""
    inbox = Inbox(8)
    channel = inbox.add_channel(0)
    inbox.put_nowait(channel, [(0, b"a" * 10, None), (10, b"b" * 10, None)])
    with pytest.raises(BlobTooLarge, match=r"^a blob passed the 15 bytes its receiver takes \(20 so far\)$"):
        await receive_blob(inbox, channel, max_bytes=15)


def incremental_part(epoch: int, state: Any, store: Any) -> dict[str, Any]:
    """A worker's part of ``epoch`` holding 'count' instance 0's incremental checkpoint (its new chunk saved in
    ``store`` first, as the coordinator does)."""
    document = {"epoch": epoch, "job": "c.wc", "finished": False, "attempt": "wc.u.1", "sources": {},
                "tasks": {"count": [[0, {"state": state.checkpoint_increment()}]]}, "layout": {}}  # fmt: skip
    store_increments(document, store.save_chunk)
    return document


async def test_incremental_parts_carry_only_the_chunks_their_backup_lacks_and_restore_whole(tmp_path: Path) -> None:
    """Three incremental checkpoints of w0's count.0 (RocksDB state): w1 is sent the full chunk once, then one
    new chunk a checkpoint; with w0's folder gone, w2 fetches count.0 from w1 as the whole state."""
    backend = RocksDBState(tmp_path / "rocks")
    state = backend.open("wc", "count", 0, 128)
    async with workers(tmp_path, ["w0", "w1", "w2"]) as found:
        owner = found["w0"]
        pushed: list[int] = []
        push = owner.service.push

        async def counting_push(address: Any, document: dict[str, Any], backup: str | None = None) -> None:
            pushed.append(len(document.get("chunks", {})))
            await push(address, document, backup)

        owner.service.push = counting_push  # type: ignore[method-assign]
        expected: dict[str, int] = {}
        for epoch in (1, 2, 3):
            for n in range(2000 if epoch == 1 else 5):
                state.put(f"k{n}", epoch)
                expected[f"k{n}"] = epoch
            chosen = await save_and_replicate(owner, incremental_part(epoch, state, owner.service.parts("wc", 1)))
        assert pushed == [1, 1, 1]  # the full chunk, then each checkpoint's increment
        assert len(list((tmp_path / "w1" / "replicas" / "wc" / "w0" / "chunks").glob("*.chunk"))) == 3
        shutil.rmtree(tmp_path / "w0")
        [fetched] = await found["w2"].read(completed(3, ("w0", chosen)), {"count.0"})
        restored = KeyedState()
        restored.restore(fetched["tasks"]["count"][0][1]["state"])
        assert restored.values == expected
    backend.close()


async def test_a_piece_naming_a_chunk_its_backup_lost_is_refused_and_sent_whole_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1 loses the chunks it stored (its process did not start again, so w0 cannot know): the next increment,
    naming them, is refused, never acknowledged and counted, so that checkpoint has no copy on w1; w0 then sends
    w1 every chunk of the chain, and w1 acknowledges."""
    monkeypatch.setattr(part_replicator, "ACK_TIMEOUT", 1.0)  # the wait for an acknowledgement that never comes
    backend = RocksDBState(tmp_path / "rocks")
    state = backend.open("wc", "count", 0, 128)
    async with workers(tmp_path, ["w0", "w1"]) as found:
        owner, backup = found["w0"], found["w1"]
        for n in range(100):
            state.put(n, n)
        await save_and_replicate(owner, incremental_part(1, state, owner.service.parts("wc", 1)))
        shutil.rmtree(tmp_path / "w1" / "replicas" / "wc" / "w0" / "chunks")
        state.put(0, -1)
        with anyio.fail_after(60):
            refused = await save_and_replicate(owner, incremental_part(2, state, owner.service.parts("wc", 1)))
        assert refused == {"count.0": []}  # no other worker to back it up
        assert backup.service.counts["bad_requests"] == 1
        state.put(1, -1)
        with anyio.fail_after(60):
            acknowledged = await save_and_replicate(owner, incremental_part(3, state, owner.service.parts("wc", 1)))
        assert acknowledged == {"count.0": ["w1"]}
        restored = KeyedState()
        restored.restore(backup.service.replicas("wc", "w0").read(3)["tasks"]["count"][0][1]["state"])
        assert restored.values == {**{n: n for n in range(100)}, 0: -1, 1: -1}
    backend.close()
