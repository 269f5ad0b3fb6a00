"""The live workers and their loads, as the leader and the clients read them from the tree: who has a fresh
heartbeat, how many instances each holds, which may run a node.
"""

from __future__ import annotations

from streamlet.adaptation.dispatch import WorkerLoad
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.jobs import held_instances
from streamlet.backends.cluster.tree.lifecycle import state_of
from streamlet.backends.cluster.tree.registry import WorkerView, workers
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model.topology import Node

STALE_AFTER = 5.0  # seconds without a heartbeat before the leader counts a worker as lost


def fitting_workers(node: Node, loads: list[WorkerLoad]) -> set[str]:
    """The workers of ``loads`` a node may run on: those it names (if it names any) carrying all its labels."""
    fitting = {w.worker_id for w in loads if set(node.labels) <= w.labels}
    return fitting if node.workers is None else fitting & set(node.workers)


def live(views: list[WorkerView], now: float, since: float = 0.0) -> list[WorkerView]:
    """The workers with a fresh heartbeat (staleness counted from ``since`` at the earliest)."""
    return [view for view in views if not view.stale(now, STALE_AFTER, since)]


async def live_loads(
    store: ClusterStore, now: float, exclude: str | None = None, since: float = 0.0
) -> list[WorkerLoad]:
    """Live workers: capacity, instances of unfinished jobs (but ``exclude``) they hold, overload."""
    views = live(await workers(store), now, since)
    used = dict.fromkeys((v.worker_id for v in views), 0)
    for job in await store.children(paths.JOBS):
        found = await store.get(paths.assignment(job))
        if job == exclude or found is None:
            continue
        state = await store.get(paths.state(job))
        if state_of(None if state is None else state.data).ended:
            continue
        for worker in (await held_instances(store, job, found.data)).values():
            if worker in used:
                used[worker] += 1
    return [
        WorkerLoad(
            v.worker_id,
            int(v.info.get("capacity", 8)),
            used[v.worker_id],
            bool((v.load or {}).get("overloaded", False)),
            frozenset(v.info.get("labels", ())),
        )
        for v in views
    ]
