"""A worker's disk full on a real cluster: the job fails naming ENOSPC and the path; no temp file stays.

Each worker's own directory (``<state-dir>/<worker-id>/``, where its checkpoint parts go) is a real
128 KiB tmpfs mounted for the test (the tests run as root, as CI does), so the error is the kernel's own
ENOSPC, not a simulation.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import running_cluster, streamlet

pytestmark = [pytest.mark.integration, pytest.mark.faults]

BIG_STATE = """
import asyncio
import streamlet as sl

class Slow(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.05)  # pacing, not waiting: 200 batches in 10 s, checkpoints run as state grows
        outputs.emit_batch([sl.Record(f"key-{r.value:06d}", 1, r.ts) for r in inputs.get()])

def build_topology():
    topology = sl.Topology("big-state")
    source = topology.add_source("numbers", list(range(200_000)))
    slow = topology.add_task("slow", Slow).set_input(source)
    count = topology.reduce("count", lambda a, b: a + b).set_input(slow, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology
"""


@pytest.fixture
def tiny_disks(tmp_path: Path) -> Iterator[list[Path]]:
    """A 128 KiB tmpfs as each worker's own directory, unmounted afterwards."""
    mounted = []
    try:
        for worker in ("worker-0", "worker-1"):
            mount_point = tmp_path / ".streamlet" / worker
            mount_point.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mount_point)], check=True)
            mounted.append(mount_point)
        yield mounted
    finally:
        for mount_point in mounted:
            subprocess.run(["umount", str(mount_point)], check=True)


@pytest.fixture
def cluster(tmp_path: Path, tiny_disks: list[Path]) -> Iterator[Path]:
    """ZooKeeper, a master and two workers, each on its own loopback address and tiny disk; every PID stopped
    afterwards (before the disks are unmounted)."""
    with running_cluster(tmp_path, "--workers", "2", "--name", "disk", "--loopback-hosts"):
        yield tmp_path


def test_a_full_checkpoint_disk_fails_the_job_naming_enospc_and_the_path(cluster: Path, tiny_disks: list[Path]) -> None:
    """The checkpoint part does not fit: FAILED with 'No space left on device' and the file; no *.tmp left."""
    job_file = cluster / "big_state.py"
    job_file.write_text(BIG_STATE, encoding="utf-8")
    run = streamlet("submit", str(job_file), "--job", "big", "--checkpoint-interval", "0.2", cwd=cluster)
    assert run.returncode == 1
    [job] = json.loads(streamlet("jobs", "--json", cwd=cluster).stdout)
    assert job["state"] == "FAILED"
    assert "CheckpointError: cannot save checkpoint " in job["reason"]
    assert any(f"to {disk}/checkpoints/big." in job["reason"] for disk in tiny_disks), job["reason"]  # big.<uid>
    assert "[Errno 28] No space left on device" in job["reason"]
    assert [path for disk in tiny_disks for path in disk.rglob("*.tmp")] == []
