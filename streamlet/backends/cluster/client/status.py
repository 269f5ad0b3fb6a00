"""What ``streamlet cluster status`` shows, read from ZooKeeper alone (with the cluster secret: the jobs, the
assignments and the heartbeats are readable with it only)."""

from __future__ import annotations

import time
from typing import Any

import anyio

from streamlet.backends.cluster.client.api import public
from streamlet.backends.cluster.leader.scheduler import STALE_AFTER
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import candidates, leader
from streamlet.backends.cluster.tree.jobs import all_jobs
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.registry import WorkerView, workers
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.backends.cluster.tree.zk import ZkStore


async def read_status(zk: ClusterStore) -> dict[str, Any]:
    """Leader (with epoch), candidates, workers (state, load, instances, staleness) and jobs with their state."""
    now = time.time()
    jobs = await all_jobs(zk)
    held: dict[str, list[str]] = {}
    for job in jobs:
        if JobState(job["state"]).ended:
            continue
        found = await zk.get(paths.assignment(job["job"]))
        for instance, worker in ({} if found is None else found[0]["instances"]).items():
            held.setdefault(worker, []).append(f"{job['job']}/{instance}")
    dashboard = await zk.get(paths.DASHBOARD)
    return {
        "cluster": zk.cluster,
        "dashboard": None if dashboard is None else dashboard[0]["url"],
        "leader": await leader(zk),
        "candidates": [c.get("name") for c in await candidates(zk)],
        "workers": [_worker_row(view, now, held.get(view.worker_id, [])) for view in await workers(zk)],
        "jobs": [public(job) for job in jobs],
    }


def _worker_row(view: WorkerView, now: float, instances: list[str]) -> dict[str, Any]:
    load = view.load or {}
    return {
        "id": view.worker_id,
        "address": f"{view.info.get('host')}:{view.info.get('data_port')}",
        "metrics": None
        if "metrics_port" not in view.info
        else f"http://{view.info['host']}:{view.info['metrics_port']}/metrics",
        "state": f"{view.info.get('zk_state')}/{view.info.get('local_state')}",
        "load": "OVERLOADED" if load.get("overloaded") else "NORMAL",
        "cpu": round(100 * float(load.get("cpu_share", 0.0))),
        "queued": sum(load.get("queues", {}).values()),
        "rss_mb": round(load.get("rss_bytes", 0) / 2**20, 1),
        "labels": view.info.get("labels", []),
        "instances": sorted(instances),
        "stale": view.stale(now, STALE_AFTER),
    }


async def wait_until_ready(
    zk_hosts: str, cluster: str, workers_expected: int, secret: bytes, seconds: float = 60.0
) -> dict[str, Any]:
    """Poll until a leader is elected and ``workers_expected`` workers are registered (the status reads the
    jobs and heartbeats: ``secret``)."""
    async with ZkStore(zk_hosts, cluster, secret=secret) as zk:
        with anyio.fail_after(seconds):
            while True:
                status = await read_status(zk)
                ready = [worker for worker in status["workers"] if not worker["stale"]]  # heartbeating
                if status["leader"] is not None and len(ready) >= workers_expected:
                    return status
                await anyio.sleep(0.1)


async def wait_for_worker(zk_hosts: str, cluster: str, worker_id: str, secret: bytes, seconds: float = 60.0) -> None:
    """Poll until ``worker_id`` is registered and heartbeating (the leader counts it live from then on; the
    heartbeats are readable with ``secret`` only)."""
    async with ZkStore(zk_hosts, cluster, secret=secret) as zk:
        with anyio.fail_after(seconds):
            while True:
                status = await read_status(zk)
                if any(worker["id"] == worker_id and not worker["stale"] for worker in status["workers"]):
                    return
                await anyio.sleep(0.1)


def format_status(status: dict[str, Any]) -> str:
    """The status as a short text table."""
    lead = status["leader"]
    lines = [
        f"cluster '{status['cluster']}'",
        f"  leader: {lead['name']} (epoch {lead['epoch']})" if lead else "  leader: none",
        f"  dashboard: {status.get('dashboard') or 'none'}",
        f"  candidates: {', '.join(status['candidates']) or 'none'}",
        f"  {'worker':<12} {'data address':<22} {'state':<18} {'load':<11} {'cpu%':>4} {'queued':>6} "
        f"{'rss MB':>7}  heartbeat",
    ]
    for worker in status["workers"]:
        beat = "stale" if worker["stale"] else "ok"
        lines.append(
            f"  {worker['id']:<12} {worker['address']:<22} {worker['state']:<18} {worker['load']:<11} "
            f"{worker['cpu']:>4} {worker['queued']:>6} {worker['rss_mb']:>7}  {beat}"
        )
        if worker["labels"]:
            lines.append(f"      labels: {', '.join(worker['labels'])}")
        if worker["instances"]:
            lines.append(f"      instances: {', '.join(worker['instances'])}")
    jobs = [f"{job['name']} ({job['state']}, attempt {job['attempt']})" for job in status["jobs"]]
    lines.append(f"  jobs: {', '.join(jobs) or 'none'}")
    return "\n".join(lines)
