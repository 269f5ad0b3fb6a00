"""Jobs on the cluster: submitted by reference, scheduled by the leader, run in parts by the workers.

ZooKeeper layout under the cluster root::

    /jobs/<job>/spec                {"target": "pkg.module:name", "parallelism": {...}, "checkpoint": {...} | None}
    /jobs/<job>/assignment          {"epoch": leader epoch, "attempt": n, "instances": {"<node>.<index>": worker}}
    /jobs/<job>/channels/<instance>@<port>   "host:port" of the worker receiving it (seed 000)
    /jobs/<job>/done/<attempt>/<worker>      {"sinks": {...}, "statistics": {...}} or {"error": "..."}

Node failover: when a worker that holds instances of an unfinished job
disappears (its ephemeral node goes, or its heartbeat goes stale), the
leader writes the next *attempt* of the assignment over the live workers.
Workers drop the old attempt and run the new one: from the job's last
completed checkpoint when it takes checkpoints (see ``checkpoints``), else
from the start; the sources replay from there. Channel ids and done-reports carry the attempt, so nothing
of the old attempt mixes in. Results are reported only when an attempt
completes, so the job's output is exact.
    /jobs/<job>/kill                present once someone asked for the job to stop
    /jobs/<job>/failures/<instance> the attempts in which that instance crashed (instance failover)
    /jobs/<job>/failed              {"reason": ...}: the leader gave up on the job; workers stop it
"""

from __future__ import annotations

import time
from typing import Any

from streamlet.adaptation.dispatch import DispatchError, WorkerLoad, assign
from streamlet.backends.cluster.coordinator import NodeExists, ZkCoordinator
from streamlet.backends.cluster.registry import workers
from streamlet.core.topology import Topology
from streamlet.errors import JobError
from streamlet.loading import load_topology

JOBS = "/jobs"


def instance_id(node: str, index: int) -> str:
    """``count.1``: how instances are named in ZooKeeper."""
    return f"{node}.{index}"


async def submit(
    zk: ZkCoordinator, job: str, target: str, parallelism: dict[str, int], checkpoint: dict[str, Any] | None = None
) -> None:
    """Record a job; the leader schedules it. The topology is loaded here first to fail early."""
    load_topology(target, parallelism).validate()
    spec = {"target": target, "parallelism": parallelism, "checkpoint": checkpoint, "submitted": time.time()}
    try:
        await zk.create(f"{JOBS}/{job}/spec", spec)
    except NodeExists:
        raise JobError(f"a job called '{job}' already exists on cluster '{zk.cluster}'") from None


async def spec_of(zk: ZkCoordinator, job: str) -> dict[str, Any] | None:
    """A job's spec, if it exists."""
    found = await zk.get(f"{JOBS}/{job}/spec")
    return None if found is None else found[0]


def topology_of(spec: dict[str, Any]) -> Topology:
    """Load the job's topology from its reference."""
    topology = load_topology(spec["target"], spec.get("parallelism") or {})
    topology.validate()
    return topology


def plan_instances(topology: Topology) -> tuple[list[tuple[str, int]], dict[tuple[str, int], list[tuple[str, int]]]]:
    """Every instance in topological order, and each one's upstream instances."""
    order: list[str] = []
    remaining = dict(topology.nodes)
    while remaining:
        ready = [n for n in remaining if all(e.upstream in order for e in topology.edges if e.downstream == n)]
        if not ready:
            raise JobError(f"topology '{topology.name}' has a cycle: cluster runs need a DAG for now")
        for name in ready:
            order.append(name)
            del remaining[name]
    instances = [(name, index) for name in order for index in range(topology.nodes[name].parallelism)]
    upstream: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for edge in topology.edges:
        senders = [(edge.upstream, i) for i in range(topology.nodes[edge.upstream].parallelism)]
        for index in range(topology.nodes[edge.downstream].parallelism):
            upstream.setdefault((edge.downstream, index), []).extend(senders)
    return instances, upstream


async def schedule_pending(zk: ZkCoordinator, epoch: int) -> list[str]:
    """Leader: assign every job that has none yet; returns the jobs assigned now."""
    assigned = []
    for job in await zk.children(JOBS):
        if await zk.get(f"{JOBS}/{job}/assignment") is not None:
            continue
        spec = await spec_of(zk, job)
        loads = await live_loads(zk)  # per job, as it now stands: it counts the jobs assigned just before
        if spec is None or not loads:
            continue
        mapping = place(topology_of(spec), loads)
        try:
            await zk.create(f"{JOBS}/{job}/assignment", {"epoch": epoch, "attempt": 1, "instances": mapping})
        except NodeExists:
            continue  # another leader (a stale one) got there: fencing sorts it out
        assigned.append(job)
    return assigned


STALE_AFTER = 5.0  # seconds without a heartbeat before the leader counts a worker as lost


async def live_loads(zk: ZkCoordinator, exclude: str | None = None) -> list[WorkerLoad]:
    """Workers with a fresh heartbeat: capacity, instances of unfinished jobs (but ``exclude``) they hold,
    and whether they report being overloaded."""
    views = [v for v in await workers(zk) if not v.stale(time.time(), STALE_AFTER)]
    used = dict.fromkeys((v.worker_id for v in views), 0)
    for job in await zk.children(JOBS):
        found = await zk.get(f"{JOBS}/{job}/assignment")
        if job == exclude or found is None or (await job_status(zk, job))["state"] in ENDED:
            continue
        for worker in found[0]["instances"].values():
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


def place(topology: Topology, loads: list[WorkerLoad], avoid: dict[str, set[str]] | None = None) -> dict[str, str]:
    """Instance id -> worker for every instance of ``topology``.

    A node runs only on the workers it names and that carry all its labels;
    it avoids the workers in ``avoid[node]`` (where it failed) while others remain.
    """
    instances, upstream = plan_instances(topology)
    allowed: dict[str, set[str]] = {}
    for node in topology.nodes.values():
        fitting = {w.worker_id for w in loads if set(node.labels) <= w.labels}
        if node.workers is not None:
            fitting &= set(node.workers)
        if not fitting:
            raise DispatchError(
                f"task '{node.name}' needs a worker among {list(node.workers or ['any'])} "
                f"with labels {list(node.labels)}; none is live"
            )
        allowed[node.name] = (fitting - (avoid or {}).get(node.name, set())) or fitting
    placed = assign(instances, upstream, loads, allowed)
    return {instance_id(node, index): worker for (node, index), worker in placed.items()}


ENDED = ("finished", "failed", "killed")


async def job_status(zk: ZkCoordinator, job: str) -> dict[str, Any]:
    """What is known of a job: spec, assignment, which workers are done, errors."""
    assignment = await zk.get(f"{JOBS}/{job}/assignment")
    attempt = 1 if assignment is None else int(assignment[0].get("attempt", 1))
    done: dict[str, Any] = {}
    for worker in await zk.children(f"{JOBS}/{job}/done/{attempt}"):
        entry = await zk.get(f"{JOBS}/{job}/done/{attempt}/{worker}")
        if entry is not None:
            done[worker] = entry[0]
    instances: dict[str, str] = {} if assignment is None else assignment[0]["instances"]
    involved = sorted(set(instances.values()))
    failed = await zk.get(f"{JOBS}/{job}/failed")
    errors = [entry["error"] for entry in done.values() if "error" in entry]
    retrying = all(entry.get("retry") for entry in done.values() if "error" in entry)
    if failed is not None:
        state, errors = "failed", [failed[0]["reason"]]
    elif errors and retrying:
        state = "recovering"  # an instance crashed: the leader restarts it elsewhere
    elif errors:
        state = "failed"
    elif involved and set(involved) <= set(done):
        state = "finished"
    elif assignment is not None:
        state = "running"
    else:
        state = "submitted"
    return {
        "job": job, "state": state, "attempt": attempt, "workers": involved, "done": done, "errors": errors,
        "given_up": failed is not None,
    }  # fmt: skip
