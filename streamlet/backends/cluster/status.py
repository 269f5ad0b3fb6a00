"""What ``streamlet cluster status`` shows, read from ZooKeeper alone."""

from __future__ import annotations

import time
from typing import Any

import anyio

from streamlet.backends.cluster.coordinator import ZkCoordinator
from streamlet.backends.cluster.election import candidates, leader
from streamlet.backends.cluster.registry import workers

STALE_AFTER = 5.0  # seconds without a heartbeat before a worker shows as stale


async def read_status(zk: ZkCoordinator) -> dict[str, Any]:
    """Leader (with epoch), candidates, workers (state, load, staleness) and jobs."""
    now = time.time()
    return {
        "cluster": zk.cluster,
        "leader": await leader(zk),
        "candidates": [c.get("name") for c in await candidates(zk)],
        "workers": [
            {
                "id": view.worker_id,
                "address": f"{view.info.get('host')}:{view.info.get('data_port')}",
                "state": f"{view.info.get('zk_state')}/{view.info.get('local_state')}",
                "rss_mb": round((view.load or {}).get("rss_bytes", 0) / 2**20, 1),
                "stale": view.stale(now, STALE_AFTER),
            }
            for view in await workers(zk)
        ],
        "jobs": await zk.children("/jobs"),
    }


async def wait_until_ready(zk_hosts: str, cluster: str, workers_expected: int, seconds: float = 60.0) -> dict[str, Any]:
    """Poll until a leader is elected and ``workers_expected`` workers are registered."""
    async with ZkCoordinator(zk_hosts, cluster) as zk:
        with anyio.fail_after(seconds):
            while True:
                status = await read_status(zk)
                ready = [worker for worker in status["workers"] if not worker["stale"]]  # heartbeating
                if status["leader"] is not None and len(ready) >= workers_expected:
                    return status
                await anyio.sleep(0.1)


def format_status(status: dict[str, Any]) -> str:
    """The status as a short text table."""
    lead = status["leader"]
    lines = [
        f"cluster '{status['cluster']}'",
        f"  leader: {lead['name']} (epoch {lead['epoch']})" if lead else "  leader: none",
        f"  candidates: {', '.join(status['candidates']) or 'none'}",
        f"  {'worker':<12} {'data address':<22} {'state':<18} {'rss MB':>7}  heartbeat",
    ]
    for worker in status["workers"]:
        beat = "stale" if worker["stale"] else "ok"
        lines.append(
            f"  {worker['id']:<12} {worker['address']:<22} {worker['state']:<18} {worker['rss_mb']:>7}  {beat}"
        )
    lines.append(f"  jobs: {', '.join(status['jobs']) or 'none'}")
    return "\n".join(lines)
