"""Where a job's instances go: the live workers' loads in, instance -> worker out.

The placing itself is the pure dispatch policy (``adaptation/dispatch``); this
module reads what it needs from the store (live workers, their heartbeats
and the instances of unfinished jobs they hold) and applies a topology's
constraints (``add_task(workers=..., labels=...)``) and its CPU hints (the
tasks the spread policy found CPU-bound: spread from the start).
"""

from __future__ import annotations

from collections.abc import Collection

from streamlet.adaptation.dispatch import WorkerLoad, assign
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.jobs import held_instances
from streamlet.backends.cluster.tree.loads import fitting_workers
from streamlet.backends.cluster.tree.paths import Assignment
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model.topology import Topology
from streamlet.errors import DispatchError

Instance = tuple[str, int]


def plan_instances(topology: Topology) -> tuple[list[Instance], dict[Instance, list[Instance]]]:
    """Every instance, upstream nodes first, and each one's upstream instances.

    "Upstream first" ignores the back edges a depth-first search finds: without
    them every loop opens into a chain, whose head (where the loop is entered)
    comes first.
    """
    back = topology.back_edges()
    forward = [edge for edge in topology.edges if (edge.upstream, edge.downstream) not in back]
    order: list[str] = []
    remaining = dict(topology.nodes)
    while remaining:
        ready = [n for n in remaining if all(e.upstream in order for e in forward if e.downstream == n)]
        for name in ready:
            order.append(name)
            del remaining[name]
    instances = [(name, index) for name in order for index in range(topology.nodes[name].parallelism)]
    upstream: dict[Instance, list[Instance]] = {}
    for edge in topology.edges:
        senders = [(edge.upstream, i) for i in range(topology.nodes[edge.upstream].parallelism)]
        for index in range(topology.nodes[edge.downstream].parallelism):
            upstream.setdefault((edge.downstream, index), []).extend(senders)
    return instances, upstream


def place(
    topology: Topology,
    loads: list[WorkerLoad],
    avoid: dict[str, set[str]] | None = None,
    prefer: dict[str, list[str]] | None = None,
    spread: Collection[str] = (),
) -> dict[str, str]:
    """Instance id -> worker for every instance of ``topology``.

    A node runs only on the workers it names and that carry all its labels;
    it avoids the workers in ``avoid[node]`` (where it failed) while others
    remain; an instance goes to the first worker of ``prefer[instance id]``
    with room (where its state is); the instances of a task in ``spread`` (its CPU hint says CPU-bound) go
    to different workers while some have room. Raises :class:`DispatchError` when no
    live worker fits a node.
    """
    if not loads:
        raise DispatchError("no live worker")
    instances, upstream = plan_instances(topology)
    allowed: dict[str, set[str]] = {}
    for node in topology.nodes.values():
        fitting = fitting_workers(node, loads)
        if not fitting:
            raise DispatchError(
                f"task '{node.name}' needs a worker among {list(node.workers or ['any'])} "
                f"with labels {list(node.labels)}; none is live"
            )
        allowed[node.name] = (fitting - (avoid or {}).get(node.name, set())) or fitting
    preferred = {(paths.task_of(i), int(i.rsplit(".", 1)[1])): workers for i, workers in (prefer or {}).items()}
    placed = assign(instances, upstream, loads, allowed, preferred, spread)
    return {paths.instance_id(node, index): worker for (node, index), worker in placed.items()}


async def state_holders(store: ClusterStore, job: str, assignment: Assignment | None) -> dict[str, list[str]]:
    """Instance id -> the workers where its state is, to redeploy it without moving state: where it runs now
    (its newest local checkpoint part), the backup location controller's redeploy worker, then the holders
    of the job's last complete checkpoint."""
    where: dict[str, list[str]] = {}
    if assignment is not None:
        for instance, worker in (await held_instances(store, job, assignment)).items():
            where[instance] = [worker]
    planned = await store.get(paths.backups(job))
    for instance, worker in ((planned.data if planned else {}).get("redeploy") or {}).items():
        where[instance] = [*where.get(instance, []), worker]  # the backup location controller's choice
    found = await store.get(paths.completed(job))
    for instance, holders in ((found.data if found else {}).get("holders") or {}).items():
        where[instance] = [*where.get(instance, []), *(h for h in holders if h not in where.get(instance, []))]
    return where
