"""Workers the leader lost, kept in plain sight until they come back or an operator forgets them.

A worker whose process died (``kill -9``, a crash, its machine gone) just stopped being listed: its
ephemeral registration went with its ZooKeeper session, and only ``attempt 2`` in ``jobs`` hinted at it.
Now the leader, at each round, compares the workers live now with those live at its last look. One that is
no longer live gets a record ``/lost/<worker>``: since when, why (its heartbeats stopped while it was still
registered, or its ZooKeeper session ended and its registration with it) and the jobs that had instances
on it; and one warning, ``worker lost``, naming it and those jobs. ``cluster status``, ``top`` and the
dashboard list it as ``LOST`` from the record. A worker that registers and beats again is back: its
record goes (``lost worker back``). ``streamlet cluster forget-worker ID`` removes the record of one that
will not come back.

A new leader starts from the records its predecessor wrote and from the workers live at its first look.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import LeaderFence
from streamlet.backends.cluster.tree.jobs import held_instances
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.registry import WorkerView
from streamlet.backends.cluster.tree.store import ClusterStore, Create, Delete

log = structlog.get_logger("streamlet.leader")

HEARTBEATS_STOPPED = "its heartbeats stopped (still registered)"
SESSION_ENDED = "its ZooKeeper session ended (the process or its machine went away)"


@dataclass
class LostWorkers:
    """What one leader knows of the workers it saw; :meth:`look` at every round."""

    store: ClusterStore
    fence: LeaderFence
    clock: Callable[[], float]
    epoch: int = 0
    seen: set[str] | None = field(default=None)  # live at the last look (None: no look yet)

    async def look(self, live: list[WorkerView], registered: list[WorkerView]) -> list[str]:
        """Record the workers lost since the last look and clear those back; returns the workers newly lost."""
        live_ids = {view.worker_id for view in live}
        recorded = set(await self.store.children(paths.LOST))
        newly = sorted((self.seen or set()) - live_ids - recorded)
        if newly:
            await self.store.ensure(paths.LOST)
            still_registered = {view.worker_id for view in registered}
            held = await self._jobs_by_worker()
            for worker in newly:
                why = HEARTBEATS_STOPPED if worker in still_registered else SESSION_ENDED
                record = {"since": self.clock(), "why": why, "jobs": held.get(worker, [])}
                if await self.fence.commit([Create(paths.lost(worker), record)]):
                    log.warning("worker lost", worker=worker, why=why, jobs=record["jobs"], epoch=self.epoch)
        for worker in sorted(recorded & live_ids):
            if await self.fence.commit([Delete(paths.lost(worker))]):
                log.info("lost worker back", worker=worker, epoch=self.epoch)
        self.seen = live_ids
        return newly

    async def _jobs_by_worker(self) -> dict[str, list[str]]:
        """Worker -> the jobs (not ended) with instances assigned to it."""
        held: dict[str, set[str]] = {}
        for job in await self.store.children(paths.JOBS):
            state = await self.store.get(paths.state(job))
            if state is None or JobState(state.data["state"]).ended:
                continue
            assignment = await self.store.get(paths.assignment(job))
            placed = {} if assignment is None else await held_instances(self.store, job, assignment.data)
            for worker in placed.values():  # live changes included: where its instances run now
                held.setdefault(worker, set()).add(job)
        return {worker: sorted(jobs) for worker, jobs in held.items()}
