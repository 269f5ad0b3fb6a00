"""``streamlet rebalance JOB``: spread a running job's instances over the workers now present.

The moves come from the pure policy (``adaptation.rebalance``), given what
this module reads of the cluster: where the job's instances run now (live
changes included), which live workers may take which task (room over every
job, ``workers=``/``labels=``), and which instances can move at all. Each
move is then an ordinary live migration, one after the other, so a worker
that joined the cluster after the job started takes its share without a
restart (it joins the running attempt with the first instance it gets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from streamlet.adaptation.rebalance import Migration, rebalance
from streamlet.backends.cluster.tree import jobs, paths
from streamlet.backends.cluster.tree.jobs import held_instances
from streamlet.backends.cluster.tree.layouts import (
    placed_instances,
    unchangeable,
    with_layout,
)
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.loads import fitting_workers, live_loads
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.errors import ReconfigurationError


@dataclass(frozen=True)
class Situation:
    """What the move policies read of a running job: where its instances run (``placed``), how many more
    each live worker may take (``room``), which instances may move at all and where they may run."""

    placed: dict[str, str]
    room: dict[str, int]
    movable: Callable[[str], bool]
    may_run: Callable[[str, str], bool]


async def situation(store: ClusterStore, job: str, now: float, secret: bytes | None = None) -> Situation:
    """Running ``job`` as the move policies see it (see :class:`Situation`; ``secret`` opens sealed params)."""
    status = await jobs.job_status(store, job)
    if status["state"] != JobState.RUNNING.value:
        raise ReconfigurationError(f"job '{job}' is {status['state']}: only a RUNNING job is rebalanced")
    spec, found = await store.get(paths.spec(job)), await store.get(paths.assignment(job))
    if spec is None or found is None:
        raise ReconfigurationError(f"job '{job}' has no spec or assignment")
    assignment = found.data
    layout = None if (node := await store.get(paths.layout(job))) is None else node.data
    topology = with_layout(jobs.topology_of(spec.data, secret), layout)
    held = await held_instances(store, job, assignment)
    attempt = int(assignment["attempt"])
    finished = set(await store.children(paths.done(job, attempt)))
    emptied = set(placed_instances(assignment["instances"], layout, attempt).values()) - set(held.values())
    loads = await live_loads(store, now, exclude=job)
    room = {
        load.worker_id: load.capacity - load.used - sum(1 for worker in held.values() if worker == load.worker_id)
        for load in loads
        if load.worker_id not in finished | emptied  # their part may be over: they wait for the next attempt
    }
    fitting = {name: fitting_workers(node, loads) for name, node in topology.nodes.items()}

    def movable(instance: str) -> bool:
        return held[instance] not in finished and unchangeable(topology, paths.task_of(instance)) is None

    def may_run(instance: str, worker: str) -> bool:
        return worker in fitting[paths.task_of(instance)]

    return Situation(held, room, movable, may_run)


async def planned_moves(store: ClusterStore, job: str, now: float, secret: bytes | None = None) -> list[Migration]:
    """The migrations that would spread running ``job`` evenly over the live workers (empty: it is even)."""
    found = await situation(store, job, now, secret)
    return rebalance(found.placed, found.room, found.movable, found.may_run)
