"""Following a submitted job until it ends, wherever its cluster answers.

A job outlives the client that submitted it, and its cluster may outlive the ZooKeeper address the client
started with: ``cluster down`` then ``cluster up`` on the same state dir keeps ZooKeeper's data (the job goes
on from its checkpoint) but serves it on new ports. So a client that waits follows the job's status and, while
ZooKeeper cannot be reached, asks where the cluster is recorded now (``relocate``); when that is elsewhere, it
closes the old session (a read queued on it fails at once) and goes on there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog

from streamlet.backends.cluster.tree import jobs
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.backends.cluster.tree.zk import StoreSettings, ZkStore
from streamlet.errors import CoordinationError

POLL = 0.1  # seconds between status reads
LOOK_AGAIN = 1.0  # seconds between looks for a new address while ZooKeeper is away

Watcher = Callable[[ClusterStore, dict[str, Any]], Awaitable[None]]  # sees each status read while waiting
Relocate = Callable[[], StoreSettings | None]  # where the cluster is recorded now (None: nowhere, for now)

log = structlog.get_logger("streamlet.client")


def ended(status: dict[str, Any]) -> bool:
    """Whether a job status is final."""
    return JobState(status["state"]).ended


class JobFollower:
    """Follows job ``name`` from ``status`` on; ``status`` is always the last one read (the caller bounds the
    wait and reports it)."""

    def __init__(self, name: str, status: dict[str, Any], watch: Watcher | None, relocate: Relocate | None) -> None:
        self.name = name
        self.status = status
        self.watch = watch
        self.relocate = relocate

    async def until_ended(self, settings: StoreSettings) -> dict[str, Any]:
        """The job's status once it has ended, following its cluster from ``settings`` to wherever it moves."""
        where = settings
        while not ended(self.status):
            moved = await self._follow_at(where)
            if moved is not None:
                log.warning("cluster moved", job=self.name, was=where.hosts, now=moved.hosts)
                where = moved
        return self.status

    async def _follow_at(self, where: StoreSettings) -> StoreSettings | None:
        """Follow the job on the store at ``where`` until it ends (``None``) or the cluster is found recorded
        elsewhere (the new place)."""
        store = where.open()
        try:
            await store.start()
        except CoordinationError:  # not serving (yet): the recorded place may change meanwhile
            await anyio.sleep(LOOK_AGAIN)
            return _elsewhere(where, self.relocate)
        moved: list[StoreSettings] = []
        try:
            async with anyio.create_task_group() as group:
                if self.relocate is not None:
                    group.start_soon(_close_when_moved, store, where, self.relocate, moved)
                await self._poll(store, moved)
                group.cancel_scope.cancel()
        finally:
            await store.aclose()
        return moved[0] if moved else None

    async def _poll(self, store: ZkStore, moved: list[StoreSettings]) -> None:
        """Read the status every :data:`POLL` until it ends or the cluster has moved; while the connection is
        down the last status stands (kazoo reconnects by itself; the job goes on without this client)."""
        while not ended(self.status) and not moved:
            await anyio.sleep(POLL)
            try:
                self.status = await jobs.job_status(store, self.name)
                if self.watch is not None:
                    await self.watch(store, self.status)
            except CoordinationError:
                continue


async def _close_when_moved(
    store: ZkStore, where: StoreSettings, relocate: Relocate, moved: list[StoreSettings]
) -> None:
    """While ``store`` is not connected, look every :data:`LOOK_AGAIN` for the cluster recorded elsewhere; once
    it is, note the new place and close ``store`` (a read waiting on it for a reconnection fails now)."""
    while True:
        await anyio.sleep(LOOK_AGAIN)
        if store.state == "connected":
            continue
        elsewhere = _elsewhere(where, relocate)
        if elsewhere is not None:
            moved.append(elsewhere)
            await store.aclose()
            return


def _elsewhere(where: StoreSettings, relocate: Relocate | None) -> StoreSettings | None:
    """The place the cluster is recorded now, if that is not ``where``."""
    now = None if relocate is None else relocate()
    return None if now is None or now.hosts == where.hosts else now
