"""The leader's backup location controller (seed 001): where each running job's checkpoint replicas go.

For every RUNNING job that takes checkpoints the leader builds the model of
``adaptation.backup_placement`` — each instance a task on the worker it runs
on, needing one instance slot wherever it is redeployed, with the size of
its state in the last complete checkpoint; each live worker a server of
its capacity in instance slots, loaded by the instances it holds; each pair
of workers a link of the lesser of their configured bandwidths (``streamlet
worker --bandwidth``, Mbit/s; configured, not measured) — and runs the
greedy controller. The answer goes to ``/jobs/<job>/backups``: the backup
workers of each instance (its next checkpoint's pieces go there, see
``replication``) and where it is redeployed when its worker is lost (the
scheduler tries that worker first). It runs again when the job's live
workers or placement change, when a checkpoint brings new state sizes, and
every :data:`RERUN_EVERY` seconds; it writes only when the answer changed,
fenced on the leader's term (a deposed leader's placement never lands).
Only the greedy runs here (milliseconds, no scipy): the exact MILP is for
tests and the benchmark.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import structlog

from streamlet.adaptation.backup_placement import Plan, Problem, Server, Task, greedy_placement, random_placement
from streamlet.adaptation.dispatch import WorkerLoad
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import LeaderFence
from streamlet.backends.cluster.tree.jobs import held_instances
from streamlet.backends.cluster.tree.paths import Assignment
from streamlet.backends.cluster.tree.registry import WorkerView
from streamlet.backends.cluster.tree.store import ClusterStore, Create, SetData
from streamlet.core.model import world

log = structlog.get_logger("streamlet")
RERUN_EVERY = 10.0  # seconds: loads drift between the changes that trigger a run at once
MBIT = 125_000.0  # bytes per second in a Mbit/s
DEFAULT_MBIT = 1000.0
DEFAULT_STATE_BYTES = 1.0  # an instance not checkpointed yet: placed as if tiny (it still needs a backup)


def backup_problem(
    instances: dict[str, str],
    loads: list[WorkerLoad],
    bandwidth_mbit: dict[str, float],
    sizes: dict[str, int],
    interval: float,
) -> Problem:
    """The controller's model of a job: ``instances`` (instance -> worker) as tasks, ``loads`` as servers,
    links of the lesser of two workers' bandwidths, state sizes from the last checkpoint."""
    live = {load.worker_id for load in loads}
    servers = tuple(
        Server(load.worker_id, float(load.capacity), float(min(load.used, load.capacity))) for load in loads
    )
    tasks = tuple(
        Task(instance, host=worker, cpu=1.0, backup_bytes=size, transfer_bytes=size)
        for instance, worker in sorted(instances.items())
        if worker in live
        for size in [float(sizes.get(instance) or DEFAULT_STATE_BYTES)]
    )
    names = sorted(live)
    links = {
        (a, b): min(bandwidth_mbit.get(a, DEFAULT_MBIT), bandwidth_mbit.get(b, DEFAULT_MBIT)) * MBIT
        for index, a in enumerate(names)
        for b in names[index + 1 :]
    }
    return Problem(servers, tasks, links, checkpoint_interval_s=interval)


def plan_record(plan: Plan) -> dict[str, Any]:
    """What ``/jobs/<job>/backups`` holds: backups and redeploy worker per instance, and what was left out."""
    return {
        "backups": {placement.task: list(placement.backups) for placement in plan.placements},
        "redeploy": {placement.task: placement.redeploy for placement in plan.placements},
        "unplaced": {unplaced.task: unplaced.reason for unplaced in plan.unplaced},
        "restore_s": plan.restore_s,
        "reason": plan.reason,
    }


class BackupController:
    """Runs the greedy controller for the leader's RUNNING jobs when something it depends on changed; writes
    through ``fence``, the leader's term."""

    def __init__(self, store: ClusterStore, fence: LeaderFence, clock: Callable[[], float] = world.wall_time) -> None:
        self.store = store
        self.fence = fence
        self.clock = clock
        self._last: dict[str, tuple[Any, float]] = {}  # job -> (what the last run saw, when)
        self._seeds: dict[str, int] = {}  # job -> its random placement's seed (a job asking for one)

    async def step(
        self, job: str, spec: dict[str, Any], assignment: Assignment, views: list[WorkerView], loads: list[WorkerLoad]
    ) -> str | None:
        """Place ``job``'s backups again if due; returns a line when the placement changed."""
        settings = spec.get("checkpoint")
        if settings is None or len(loads) < 2:
            return None  # no checkpoints, or nowhere to put a copy
        instances = await held_instances(self.store, job, assignment)
        found = await self.store.get(paths.completed(job))
        sizes = {} if found is None else dict(found.data.get("sizes") or {})
        seen = (sorted(load.worker_id for load in loads), sorted(instances.items()), sorted(sizes.items()))
        last = self._last.get(job)
        now = self.clock()
        if last is not None and last[0] == seen and now - last[1] < RERUN_EVERY:
            return None
        self._last[job] = (seen, now)
        bandwidth = {view.worker_id: float(view.info.get("bandwidth_mbit", DEFAULT_MBIT)) for view in views}
        problem = backup_problem(instances, loads, bandwidth, sizes, float(settings.get("interval") or 1.0))
        wanted = settings.get("replicas")
        replicas = min(1 if wanted is None else int(wanted), len(loads) - 1)
        if replicas < 1:
            return None
        if settings.get("placement") == "random":  # for comparison: a draw of its own per job
            seed = self._seeds.setdefault(job, random.getrandbits(64))
            # redrawn when the workers or the placement change, not with every checkpoint's sizes
            plan = random_placement(problem, replicas, random.Random(repr((seed, seen[:2]))))
        else:
            plan = greedy_placement(problem, replicas)
        record = plan_record(plan)
        current = await self.store.get(paths.backups(job))
        if current is not None and {k: v for k, v in current.data.items() if k != "at"} == record:
            return None
        record["at"] = now
        path = paths.backups(job)
        write = Create(path, record) if current is None else SetData(path, record, current.version)
        if not await self.fence.commit([write]):
            self._last.pop(job, None)  # not written (a newer placement, a deposed leader): the next pass looks again
            return None
        log.info("backups placed", job=job, restore_s=record["restore_s"], unplaced=len(record["unplaced"]))
        return f"backups placed ({record['reason']})"

    def forget(self, job: str) -> None:
        """The job is not running: its next run starts afresh."""
        self._last.pop(job, None)
        self._seeds.pop(job, None)
