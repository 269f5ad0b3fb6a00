"""What the whole cluster looks like, read from the tree alone: leader and candidates, workers with their load
and instances, jobs with their state (readable with the cluster secret only).
"""

from __future__ import annotations

from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import candidates, leader
from streamlet.backends.cluster.tree.jobs import all_jobs, public
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.loads import STALE_AFTER, busy, heartbeat_word
from streamlet.backends.cluster.tree.lost import lost_workers
from streamlet.backends.cluster.tree.registry import WorkerView, workers
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model import world


async def read_status(zk: ClusterStore) -> dict[str, Any]:
    """Leader (with epoch), candidates, workers (state, load, instances, staleness) and jobs with their state."""
    now = world.wall_time()
    jobs = await all_jobs(zk)
    held: dict[str, list[str]] = {}
    for job in jobs:  # where each instance runs now: the assignment with its live changes, as jobs shows it
        if JobState(job["state"]).ended:
            continue
        for instance, worker in job["instances"].items():
            held.setdefault(worker, []).append(f"{job['job']}/{instance}")
    dashboard = await zk.get(paths.DASHBOARD)
    registered = await workers(zk)
    rows = [_worker_row(view, now, held.get(view.worker_id, [])) for view in registered]
    lost = await lost_workers(zk)
    for row in rows:  # still registered, its heartbeats stopped
        if row["id"] in lost:
            row.update(_lost_columns(lost.pop(row["id"]), now))
    rows += [
        {**_gone_row(worker, held.get(worker, [])), **_lost_columns(record, now)} for worker, record in lost.items()
    ]
    return {
        "cluster": zk.cluster,
        "dashboard": None if dashboard is None else dashboard.data["url"],
        "leader": await leader(zk),
        "candidates": [c.get("name") for c in await candidates(zk)],
        "workers": sorted(rows, key=lambda row: row["id"]),
        "jobs": [public(job) for job in jobs],
    }


def _lost_columns(record: dict[str, Any], now: float) -> dict[str, Any]:
    """A lost worker's state: ``LOST``, since when and why, and the jobs it held then (``tree.lost``)."""
    since = float(record["since"])
    return {
        "state": "LOST", "lost": {"since": since, "why": record["why"], "jobs": record.get("jobs", [])},
        "heartbeat": f"lost {max(0, round(now - since))} s ago", "stale": True,
    }  # fmt: skip


def _gone_row(worker: str, instances: list[str]) -> dict[str, Any]:
    """The row of a lost worker no longer registered: nothing but its name (and instances still assigned);
    ``tls`` unknown (``None``), so it does not make the data plane look mixed."""
    return {
        "id": worker, "address": "-", "metrics": None, "state": "LOST", "load": "-", "cpu": 0, "queued": 0,
        "rss_mb": 0.0, "labels": [], "tls": None, "instances": sorted(instances), "stale": True, "busy": None,
        "heartbeat": "lost",
    }  # fmt: skip


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
        "tls": bool(view.info.get("tls", False)),
        "instances": sorted(instances),
        "stale": view.stale(now, STALE_AFTER),
        "busy": busy(load),
        "heartbeat": heartbeat_word(view.stale(now, STALE_AFTER), load),
    }
