"""Disk full under --checkpoint-dir on a real cluster: the job fails naming ENOSPC and the path; no temp file stays.

The checkpoint directory is a real 128 KiB tmpfs mounted for the test (the tests run as root, as CI does),
so the error is the kernel's own ENOSPC, not a simulation.
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
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 128 KiB tmpfs, unmounted afterwards."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    """ZooKeeper, a master and two workers; every PID stopped afterwards."""
    with running_cluster(tmp_path, "--workers", "2", "--name", "disk"):
        yield tmp_path


def test_a_full_checkpoint_disk_fails_the_job_naming_enospc_and_the_path(cluster: Path, tiny_disk: Path) -> None:
    """The checkpoint part does not fit: FAILED with 'No space left on device' and the file; no *.tmp left."""
    job_file = cluster / "big_state.py"
    job_file.write_text(BIG_STATE, encoding="utf-8")
    run = streamlet(
        "submit", str(job_file), "--job", "big", "--checkpoint-interval", "0.2", "--checkpoint-dir", str(tiny_disk),
        cwd=cluster,
    )  # fmt: skip
    assert run.returncode == 1
    [job] = json.loads(streamlet("jobs", "--json", cwd=cluster).stdout)
    assert job["state"] == "FAILED"
    assert "CheckpointError: cannot save checkpoint " in job["reason"]
    assert f"to {tiny_disk}/big/attempt-" in job["reason"]
    assert "[Errno 28] No space left on device" in job["reason"]
    assert list(tiny_disk.rglob("*.tmp")) == []
