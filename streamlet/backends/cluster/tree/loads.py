"""The live workers and their loads, as the leader and the clients read them from the tree: who has a fresh
heartbeat, how many instances each holds, which may run a node.
"""

from __future__ import annotations

from typing import Any

from streamlet.adaptation.dispatch import WorkerLoad
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.jobs import held_instances
from streamlet.backends.cluster.tree.lifecycle import state_of
from streamlet.backends.cluster.tree.registry import WorkerView, workers
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model.topology import Node

STALE_AFTER = 5.0  # seconds without a heartbeat before the leader counts a worker as lost
#: A worker whose heartbeats are fresh counts as BUSY (alive, its loop held by user code: ``worker.heart``) when
#: its loop lags this many seconds, or its calls of user code held the loop this share of the time since its
#: last beat. Reported, never a reason to restart anything.
BUSY_AFTER = 1.0
BUSY_SHARE = 0.8


def busy(load: dict[str, Any] | None) -> dict[str, Any] | None:
    """What holds a BUSY worker's loop (``lag`` seconds, ``share`` of the time, and the call holding it or
    that held it last, when known), or ``None`` when the heartbeat ``load`` says the loop keeps up."""
    lag = float((load or {}).get("loop_lag", 0.0))
    share = float((load or {}).get("loop_held_share", 0.0))
    if lag < BUSY_AFTER and share < BUSY_SHARE:
        return None
    holding = (load or {}).get("holding") or {}
    return {
        "lag": lag, "share": share, "task": holding.get("task"), "instance": holding.get("instance"),
        "seconds": holding.get("seconds"),
    }  # fmt: skip


def heartbeat_word(stale: bool, load: dict[str, Any] | None) -> str:
    """A worker's heartbeat in a word or a few: ``stale`` (lost), ``BUSY 3.2s in 'task' #0`` (its loop lags 3.2 s)
    or ``BUSY 95% in 'task' #0`` (its calls held the loop 95 % of the time), or ``ok``."""
    if stale:
        return "stale"
    held = busy(load)
    if held is None:
        return "ok"
    where = "" if held["task"] is None else f" in '{held['task']}' #{held['instance']}"
    how = f"{held['lag']:.1f}s" if held["lag"] >= BUSY_AFTER else f"{held['share']:.0%}"
    return f"BUSY {how}{where}"


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
