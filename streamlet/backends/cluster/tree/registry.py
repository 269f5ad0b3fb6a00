"""Workers in the store: an ephemeral ``/workers/<id>`` node and an ephemeral ``/loads/<id>`` heartbeat.

The worker state model follows SpeedStream: on the ZooKeeper side a worker is
VOID (not registered), STANDBY (registered, nothing assigned) or LIVE
(running instances); locally it is *waiting* or *running*. A worker's node
vanishing (its session ended) or its heartbeat going stale is how the
leader detects a failed worker.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.lifecycle import WORKER_MOVES, LocalState, WorkerState
from streamlet.backends.cluster.tree.paths import WorkerInfo
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model import world
from streamlet.errors import CoordinationError, NodeExists


def process_load() -> dict[str, Any]:
    """CPU seconds used and resident memory of this process, for the heartbeat."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_seconds": usage.ru_utime + usage.ru_stime, "rss_bytes": _rss_bytes(), "pid": os.getpid()}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class WorkerRegistration:
    """Registers one worker and keeps its heartbeat going; re-registers after a lost session."""

    zk: ClusterStore
    worker_id: str
    info: WorkerInfo
    heartbeat: float = 1.0
    load: Callable[[], dict[str, Any]] = process_load
    zk_state: WorkerState = WorkerState.VOID
    local_state: LocalState = LocalState.WAITING
    beats: int = field(default=0, init=False)
    boot: str = field(default_factory=lambda: world.token_hex(6), init=False)  # this process of the worker
    last_load: dict[str, Any] = field(default_factory=dict, init=False)  # the last heartbeat's load report
    _lost: bool = field(default=False, init=False)  # the session was lost: register again once connected
    #: A heart thread writes the beats (``worker.heart``): the loop only refreshes ``last_load`` for it.
    beats_from_thread: bool = field(default=False, init=False)
    _listening: bool = field(default=False, init=False)  # told of the session's states

    @property
    def node(self) -> str:
        """The worker's node path (relative to the cluster root)."""
        return paths.worker(self.worker_id)

    async def register(self) -> None:
        """Create the ephemeral worker node (STANDBY until it runs instances)."""
        if self.zk_state == WorkerState.VOID:
            self.zk_state = WorkerState.STANDBY
        try:
            await self._create_through_standby()
        except NodeExists:  # a session we lost (this worker before a restart) has not expired yet: take the
            await self.zk.delete(self.node)  # node over as ours; left to that session, it would go when the
            await self.zk.delete(paths.load(self.worker_id))  # session expires (the load node too: the next
            await self._create_through_standby()  # beat makes ours)
        self._lost = False
        if not self._listening:
            self.zk.on_state(self._on_state)
            self._listening = True

    async def _create_through_standby(self) -> None:
        """The node, created as the lifecycle moves even when coming back: STANDBY, then the state it is in."""
        await self.zk.create(self.node, {**self._description(), "zk_state": WorkerState.STANDBY.value}, ephemeral=True)
        if self.zk_state is not WorkerState.STANDBY:
            await self.zk.set(self.node, self._description())

    def _description(self) -> dict[str, Any]:
        return {**self.info, "zk_state": self.zk_state.value, "local_state": self.local_state.value, "boot": self.boot}

    async def set_state(self, zk_state: WorkerState, local_state: LocalState) -> None:
        """Move in the state model and publish it (the heartbeat loop re-registers if the session is gone)."""
        if self.zk_state is WorkerState.VOID:  # the session was lost: registered again first (see below)
            self.zk_state = WorkerState.STANDBY
        assert zk_state in WORKER_MOVES[self.zk_state], f"worker {self.zk_state.value} -> {zk_state.value}"
        self.zk_state, self.local_state = zk_state, local_state
        try:
            await self.zk.set(self.node, self._description())
        except CoordinationError:
            with contextlib.suppress(CoordinationError):  # the node went with a lost session: register again
                await self._create_through_standby()
                self._lost = False  # registered: the heartbeat loop need not

    def _on_state(self, state: str) -> None:
        if state == "lost":
            self._lost = True
            self.zk_state = WorkerState.VOID

    async def run(self) -> None:
        """Heartbeat forever; after a lost session, register again once connected."""
        while True:
            try:
                if self._lost and self.zk.state == "connected":
                    self._lost = False
                    await self.register()
                if self.beats_from_thread:
                    # what the heart thread sends with its next beats, stamped with when its counters were read
                    self.last_load = {**self.load(), "sampled": world.wall_time()}
                else:
                    await self.beat()
                if await self.zk.get(self.node) is None:  # gone with a session that was not ours (see register)
                    await self.register()
            except CoordinationError:
                pass  # suspended or reconnecting: the next beat tries again
            await anyio.sleep(self.heartbeat)

    async def beat(self) -> None:
        """Publish the load now."""
        now = world.wall_time()
        load = {**self.load(), "ts": now, "sampled": now, "beat": self.beats}
        self.last_load = load
        try:
            await self.zk.set(paths.load(self.worker_id), load)
        except CoordinationError:
            await self.zk.create(paths.load(self.worker_id), load, ephemeral=True)
        self.beats += 1


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What the leader knows of a worker."""

    worker_id: str
    info: WorkerInfo
    load: dict[str, Any] | None

    def stale(self, now: float, after: float, since: float = 0.0) -> bool:
        """No heartbeat for ``after`` seconds, counted from ``since`` at the earliest (the reader's view of
        the store came back then: a heartbeat missed while the reader could not see the store, or while the
        store itself was down, is not held against the worker)."""
        return self.load is None or now - max(float(self.load.get("ts", 0.0)), since) > after


async def workers(zk: ClusterStore) -> list[WorkerView]:
    """Every registered worker with its last heartbeat."""
    found = []
    for worker_id in await zk.children(paths.WORKERS):
        entry = await zk.get(paths.worker(worker_id))
        if entry is None:
            continue  # gone between the listing and the read
        load = await zk.get(paths.load(worker_id))
        found.append(WorkerView(worker_id, entry.data, None if load is None else load.data))
    return found
