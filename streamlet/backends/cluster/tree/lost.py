"""The records of workers the leader lost (``/lost/<worker>``: see ``leader.lost_workers``), as clients read them."""

from __future__ import annotations

from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.store import ClusterStore


async def lost_workers(store: ClusterStore) -> dict[str, dict[str, Any]]:
    """Every recorded lost worker and its record (the job names in it are job data: secret holders only)."""
    found = {}
    for worker in await store.children(paths.LOST):
        record = await store.get(paths.lost(worker))
        if record is not None:
            found[worker] = record.data
    return found


async def forget(store: ClusterStore, worker: str) -> bool:
    """Remove ``worker``'s record (``streamlet cluster forget-worker``); ``False`` when there was none."""
    if await store.get(paths.lost(worker)) is None:
        return False
    await store.delete(paths.lost(worker))
    return True
