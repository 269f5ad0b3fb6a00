"""What ``streamlet cluster status`` shows, read from ZooKeeper alone (with the cluster secret: the jobs, the
assignments and the heartbeats are readable with it only)."""

from __future__ import annotations

from typing import Any

import anyio

from streamlet.backends.cluster.tree.status import read_status
from streamlet.backends.cluster.tree.zk import StoreSettings


async def wait_until_ready(
    settings: StoreSettings, workers_expected: int, seconds: float = 60.0, dashboard: bool = False
) -> dict[str, Any]:
    """Poll until a leader is elected and ``workers_expected`` workers are registered (the status reads the
    jobs and heartbeats: ``secret``), and with ``dashboard`` until the leader serves its dashboard."""
    async with settings.open() as zk:
        with anyio.fail_after(seconds):
            while True:
                status = await read_status(zk)
                ready = [worker for worker in status["workers"] if not worker["stale"]]  # heartbeating
                served = status["dashboard"] is not None or not dashboard
                if status["leader"] is not None and len(ready) >= workers_expected and served:
                    return status
                await anyio.sleep(0.1)


async def wait_for_worker(settings: StoreSettings, worker_id: str, seconds: float = 60.0) -> None:
    """Poll until ``worker_id`` is registered and heartbeating (the leader counts it live from then on; the
    heartbeats are readable with ``secret`` only)."""
    async with settings.open() as zk:
        with anyio.fail_after(seconds):
            while True:
                status = await read_status(zk)
                if any(worker["id"] == worker_id and not worker["stale"] for worker in status["workers"]):
                    return
                await anyio.sleep(0.1)


def _zookeeper_lines(members: list[dict[str, str]] | None) -> list[str]:
    """``zookeeper: 127.0.0.1:2181 leader, ...``: each member of the connect string and its mode."""
    if not members:
        return []
    return ["  zookeeper: " + ", ".join(f"{member['address']} {member['mode']}" for member in members)]


def _data_plane(workers: list[dict[str, Any]]) -> str:
    """How the workers' connections are protected, as their registrations say (a lost worker no longer
    registered says nothing)."""
    secured = {bool(worker["tls"]) for worker in workers if worker.get("tls") is not None}
    if secured == {True}:
        return "mutual TLS (the cluster's CA)"
    if secured == {False}:
        return "cleartext (--no-tls: loopback only)"
    return "no workers" if not secured else "MIXED: some workers in cleartext (--no-tls), their links refused"


def format_status(status: dict[str, Any]) -> str:
    """The status as a short text table."""
    lead = status["leader"]
    lines = [
        f"cluster '{status['cluster']}'",
        f"  leader: {lead['name']} (epoch {lead['epoch']})" if lead else "  leader: none",
        *_zookeeper_lines(status.get("zookeeper")),
        f"  data plane: {_data_plane(status['workers'])}",
        f"  dashboard: {status.get('dashboard') or 'none'}",
        f"  candidates: {', '.join(status['candidates']) or 'none'}",
        f"  {'worker':<12} {'data address':<22} {'state':<18} {'load':<11} {'cpu%':>4} {'queued':>6} "
        f"{'rss MB':>7}  heartbeat",
    ]
    for worker in status["workers"]:
        beat = worker.get("heartbeat") or ("stale" if worker["stale"] else "ok")
        lines.append(
            f"  {worker['id']:<12} {worker['address']:<22} {worker['state']:<18} {worker['load']:<11} "
            f"{worker['cpu']:>4} {worker['queued']:>6} {worker['rss_mb']:>7}  {beat}"
        )
        if worker.get("lost"):
            lost = worker["lost"]
            lines.append(f"      lost: {lost['why']}; it held {', '.join(lost['jobs']) or 'no job'}")
        if worker["labels"]:
            lines.append(f"      labels: {', '.join(worker['labels'])}")
        if worker["instances"]:
            lines.append(f"      instances: {', '.join(worker['instances'])}")
    jobs = [f"{job['name']} ({job['state']}, attempt {job['attempt']})" for job in status["jobs"]]
    lines.append(f"  jobs: {', '.join(jobs) or 'none'}")
    return "\n".join(lines)
