"""The leader's backup location controller on the in-memory store: it places a RUNNING job's replicas, writes
only when the answer changes, and follows a lost worker."""

from __future__ import annotations

from typing import Any

from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.tree import paths
from tests.unit.backends.cluster.conftest import SECRET, MemoryCluster


async def running_with_checkpoints(
    cluster: MemoryCluster, sizes: dict[str, int], placement: str | None = None
) -> dict[str, str]:
    """Job 'p' (4 instances) RUNNING on w0..w2 with checkpoints, its last checkpoint of state ``sizes``."""
    checkpoint: dict[str, Any] = {"interval": 1.0, "replicas": None}
    if placement is not None:
        checkpoint["placement"] = placement
    spec = job_commands.new_spec(cluster.module(), {}, checkpoint)
    await job_commands.submit(cluster.client, "p", spec, SECRET)
    await cluster.leader.round()
    instances: dict[str, str] = (await cluster.assignment("p"))["instances"]  # type: ignore[assignment]
    for worker in set(instances.values()):
        await cluster.report("p", 1, worker, "started", {})
    completed = {"attempt": 1, "epoch": 1, "workers": sorted(set(instances.values())), "finished": False,
                 "holders": {i: [w] for i, w in instances.items()}, "sizes": sizes}  # fmt: skip
    await cluster.client.create(f"{paths.checkpoints('p')}/completed", completed)
    cluster.leader._backups_placed_at = -1e9  # due at the next round
    await cluster.leader.round()
    return instances


async def placed(cluster: MemoryCluster) -> tuple[dict[str, Any], int]:
    found = await cluster.client.get(paths.backups("p"))
    assert found is not None
    return found


async def test_each_instance_gets_a_backup_off_its_own_worker_and_is_redeployed_where_it_is(
    cluster: MemoryCluster,
) -> None:
    """Every instance: one backup (the default), never its own worker; redeployed on that backup (restore 0)."""
    for worker in ("w0", "w1", "w2"):
        await cluster.add_worker(worker, capacity=3)
    instances = await running_with_checkpoints(cluster, {"numbers.0": 10, "double.0": 5000, "double.1": 5000})
    assert await cluster.state("p") == ("RUNNING", "running on w0, w1")
    record, _ = await placed(cluster)
    assert sorted(record["backups"]) == sorted(instances)
    for instance, backups in record["backups"].items():
        assert len(backups) == 1
        assert backups[0] != instances[instance]
        assert record["redeploy"][instance] == backups[0]
    assert record["unplaced"] == {}
    assert record["restore_s"] == 0.0


async def test_the_placement_is_written_again_only_when_the_answer_changes(cluster: MemoryCluster) -> None:
    """Rounds with nothing new leave the node as it was; losing w2, which runs nothing of the job (it stays
    RUNNING), moves the backups it held to the workers left. Two workers of 3 slots, 4 instances: only 2
    can be redeployed off their worker with room reserved for all, so 2 are reported unplaced (their
    replicas then go to the next worker after their own, see ``replication.backups_for``)."""
    for worker in ("w0", "w1", "w2"):
        await cluster.add_worker(worker, capacity=3)
    instances = await running_with_checkpoints(cluster, {"double.0": 5000})
    assert set(instances.values()) == {"w0", "w1"}
    record, version = await placed(cluster)
    assert "w2" in {backup for backups in record["backups"].values() for backup in backups}
    cluster.leader._backups_placed_at = -1e9
    await cluster.leader.round()
    assert (await placed(cluster))[1] == version
    cluster.workers["w2"].expire()
    cluster.leader._backups_placed_at = -1e9
    await cluster.leader.round()
    assert (await cluster.state("p"))[0] == "RUNNING"
    record, moved = await placed(cluster)
    assert moved > version
    for instance, backups in record["backups"].items():
        assert backups == ["w1" if instances[instance] == "w0" else "w0"]
    assert len(record["backups"]) == len(record["unplaced"]) == 2
    assert set(record["backups"]) | set(record["unplaced"]) == set(instances)


async def test_random_placement_puts_each_backup_and_redeploy_off_the_instance_worker_and_stays_put(
    cluster: MemoryCluster,
) -> None:
    """``--replica-placement random`` (for comparison): every instance gets one backup and a redeploy worker
    other than its own, drawn at random; rounds that see nothing new leave the record as it was."""
    for worker in ("w0", "w1", "w2"):
        await cluster.add_worker(worker, capacity=3)
    instances = await running_with_checkpoints(cluster, {"double.0": 5000, "double.1": 5000}, placement="random")
    record, version = await placed(cluster)
    assert record["reason"].startswith("random: 4 tasks placed at random")
    assert sorted(record["backups"]) == sorted(record["redeploy"]) == sorted(instances)
    for instance, worker in instances.items():
        assert len(record["backups"][instance]) == 1
        assert worker not in (*record["backups"][instance], record["redeploy"][instance])
    cluster.leader._backups_placed_at = -1e9
    await cluster.leader.round()
    assert (await placed(cluster))[1] == version
    completed = await cluster.client.get(f"{paths.checkpoints('p')}/completed")
    assert completed is not None
    sizes = {"double.0": 7000, "double.1": 9000}  # a later checkpoint's sizes: no new draw
    await cluster.client.set(f"{paths.checkpoints('p')}/completed", {**completed.data, "epoch": 2, "sizes": sizes})
    cluster.leader._backups_placed_at = -1e9
    await cluster.leader.round()
    again, _ = await placed(cluster)
    assert (again["backups"], again["redeploy"]) == (record["backups"], record["redeploy"])
