"""Recovery without a shared disk: a worker SIGKILLed mid-job, restored from the replicas on the others.

A local cluster of three workers, each on its own loopback address with its own folder, runs a keyed count
over 100 000 keys (``cluster_slow_job``) with a checkpoint every 0.2 s and one replica, placed by the
leader's backup location controller. The worker running ``count.1`` is killed and its folder deleted.
The recovered counts are checked (every key, every record, once). Measured: seconds from the kill until
the next attempt is assigned, and until it completes its first checkpoint (its output commits again:
output resumes); the bytes the next attempt fetched from other workers to restore (the controller
redeploys lost instances where their replicas are). The same loss runs again for real under *random*
placement (``--replica-placement random``: each instance's replica on a random other worker, its
redeploy worker a random other worker too), on a fresh cluster each time: ``recovery_random_*``. A
random draw puts the redeploy worker where the replica is half the time here (three workers), so its
runs fetch either nothing or the whole lost state; the mean over its runs is reported beside the median.
"""

from __future__ import annotations

import os
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


def recovery_with_replicas(repeats: int = 3) -> dict[str, Any]:
    """The measurement ``repeats`` times per placement, alternating, each on a fresh cluster: the medians (and
    the mean bytes fetched), and every run's figures."""
    runs: dict[str, list[dict[str, Any]]] = {"controller": [], "random": []}
    for repeat in range(repeats):
        for placement in ("controller", "random") if repeat % 2 == 0 else ("random", "controller"):
            runs[placement].append(recovery_once(placement))
    figures: dict[str, Any] = {}
    for placement, prefix in (("controller", "recovery_"), ("random", "recovery_random_")):
        for key in runs[placement][0]:
            figures[f"{prefix}{key}"] = round(statistics.median(run[key] for run in runs[placement]), 3)
        figures[f"{prefix}mean_bytes"] = round(statistics.fmean(run["bytes"] for run in runs[placement]))
        figures[f"{prefix}runs"] = runs[placement]
    return {**figures, "recovery_keys": KEYS}


def recovery_once(placement: str = "controller") -> dict[str, Any]:
    """Run the measurement once with the replicas placed by ``placement`` (see the module docstring)."""
    with tempfile.TemporaryDirectory() as directory:
        state_dir = Path(directory)
        state = local_cluster.up(state_dir, "recovery", WORKERS, 1, None, capacity=3, loopback_hosts=True)
        try:
            anyio.run(wait_until_ready, state.settings(), WORKERS)
            checkpoint = {"interval": 0.2, "replicas": 1, "placement": placement}
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
        "reassigned_seconds": round(reassigned, 2),
        "to_output_seconds": round(resumed, 2),
        "bytes": sum(int(report["fetched_bytes"]) for report in reports),
        "lost_state_bytes": sum(s for i, s in sizes.items() if assignment["instances"][i] == victim),
    }
