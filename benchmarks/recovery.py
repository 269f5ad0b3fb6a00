"""Recovery without a shared disk: a worker SIGKILLed mid-job, restored from the replicas on the others.

A local cluster of three workers, each on its own loopback address with its own folder, runs a keyed count
over 100 000 keys (``cluster_slow_job``) with a checkpoint every 0.2 s and one replica, placed by the
leader's backup location controller. The worker running ``count.1`` is killed and its folder deleted.
The recovered counts are checked (every key, every record, once). Measured: seconds from the kill until
the next attempt is assigned, and until it completes its first checkpoint (its output commits again:
output resumes); the bytes the next attempt fetched from other
workers to restore (the controller redeploys lost instances where their replicas are). The same loss under
*random* placement — each instance's replica on a random other worker, its redeploy worker a random live
worker other than its own — is computed from the state sizes the checkpoint recorded: the mean restore
bytes over 10 000 draws (a restore fetches an instance's state when its redeploy worker holds no replica).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from benchmarks.cluster_slow_job import KEYS, RECORDS
from streamlet.backends.cluster.client import api as client
from streamlet.backends.cluster.client.status import wait_until_ready
from streamlet.backends.cluster.local import local_cluster
from streamlet.backends.cluster.tree.zk import ZkStore

JOB = "slow"
WORKERS = 3
DRAWS = 10_000


async def _until(zk: ZkStore, path: str, wanted: Callable[[Any], bool], seconds: float = 120) -> Any:
    """The data at ``path`` once ``wanted(data)``, waiting on a watch."""
    version: int | None = -2
    with anyio.fail_after(seconds):
        while True:
            data, version = await zk.wait_changed(path, version)
            if data is not None and wanted(data):
                return data


def random_restore_bytes(instances: dict[str, str], sizes: dict[str, int], lost: str, rng: random.Random) -> float:
    """Mean bytes fetched to restore ``lost``'s instances under random placement (see the module docstring)."""
    workers = [f"worker-{index}" for index in range(WORKERS)]
    others = [worker for worker in workers if worker != lost]
    totals = []
    for _ in range(DRAWS):
        fetched = 0
        for instance, worker in instances.items():
            if worker != lost or instance not in sizes:
                continue
            backup = rng.choice([w for w in workers if w != worker])
            redeploy = rng.choice(others)
            fetched += 0 if redeploy == backup else sizes[instance]
        totals.append(fetched)
    return statistics.fmean(totals)


def recovery_with_replicas(repeats: int = 3) -> dict[str, Any]:
    """The measurement ``repeats`` times, each on a fresh cluster: the medians, and every run's figures."""
    runs = [recovery_once() for _ in range(repeats)]
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0] if key != "recovery_keys"}
    return {**medians, "recovery_keys": KEYS, "recovery_runs": runs}


def recovery_once() -> dict[str, Any]:
    """Run the measurement once (see the module docstring)."""
    with tempfile.TemporaryDirectory() as directory:
        state_dir = Path(directory)
        state = local_cluster.up(state_dir, "recovery", WORKERS, 1, None, capacity=3, loopback_hosts=True)
        try:
            anyio.run(wait_until_ready, state.settings(), WORKERS)
            checkpoint = {"interval": 0.2, "replicas": 1}
            submission = client.Submission("benchmarks.cluster_slow_job:build_topology", JOB, checkpoint=checkpoint)
            anyio.run(client.submit_and_wait, state.settings(), submission, False, 60)
            return anyio.run(_kill_and_recover, state, state_dir)
        finally:
            local_cluster.down(state_dir)


async def _kill_and_recover(state: local_cluster.ClusterState, state_dir: Path) -> dict[str, Any]:
    base = f"/jobs/{JOB}"
    async with ZkStore(state.zk, state.name, secret=state.secret()) as zk:
        # 20 checkpoints in (4 s or more): past the first 100 000 records, so every key has state
        await _until(zk, f"{base}/checkpoints/completed", lambda data: data["epoch"] >= 20)
        await _until(zk, f"{base}/backups", lambda data: bool(data["backups"]))
        assignment = await _until(zk, f"{base}/assignment", lambda data: True)
        victim = assignment["instances"]["count.1"]
        [process] = [p for p in state.processes if p["id"] == victim]
        killed = time.monotonic()
        os.kill(int(process["pid"]), signal.SIGKILL)
        shutil.rmtree(state_dir / victim, ignore_errors=True)  # its disk is gone with it
        await _until(zk, f"{base}/assignment", lambda data: int(data["attempt"]) >= 2)
        reassigned = time.monotonic() - killed
        completed = await _until(zk, f"{base}/checkpoints/completed", lambda data: True)  # attempt 1's are over
        restored = completed if int(completed["attempt"]) == 1 else completed["previous"]
        await _until(zk, f"{base}/checkpoints/completed", lambda data: int(data["attempt"]) >= 2)
        resumed = time.monotonic() - killed
        final = await _until(zk, f"{base}/state", lambda data: data["state"] in ("FINISHED", "FAILED"))
        if final["state"] != "FINISHED":
            raise RuntimeError(f"the job did not recover: {final['reason']}")
        second = await _until(zk, f"{base}/assignment", lambda data: True)
        reports = [await _until(zk, f"{base}/done/2/{w}", lambda data: True) for w in set(second["instances"].values())]
    if {report["restored_from"] for report in reports} != {restored["epoch"]}:
        raise RuntimeError(f"attempt 2 did not restore checkpoint {restored['epoch']}: {reports}")
    summaries = [value for report in reports for _key, value, _ts in report["sinks"].get("totals", [])]
    if [sum(column) for column in zip(*summaries, strict=True)] != [KEYS, RECORDS]:
        raise RuntimeError(f"the recovered counts are wrong: {summaries} (keys, records) per instance")
    sizes = {instance: int(size) for instance, size in restored["sizes"].items()}
    return {
        "recovery_reassigned_seconds": round(reassigned, 2),
        "recovery_to_output_seconds": round(resumed, 2),
        "recovery_bytes_controller": sum(int(report["fetched_bytes"]) for report in reports),
        "recovery_bytes_random_placement": round(
            random_restore_bytes(assignment["instances"], sizes, victim, random.Random(1))
        ),
        "recovery_lost_state_bytes": sum(s for i, s in sizes.items() if assignment["instances"][i] == victim),
        "recovery_keys": KEYS,
    }
