"""Live changes of a running cluster job: what the client asks, what the leader plans, what each worker does.

1. A client (``streamlet rescale``) checks the request against the job's
   topology and its current layout and writes ``/jobs/<job>/reconfigure``.
2. The leader, for a RUNNING job, plans it (:func:`plan`): the task's new
   segment table, a worker for every new instance (the live workers holding
   fewest of the job's instances; one outside the attempt joins it, see
   ``joining``), and writes, in one transaction, the plan under
   ``/jobs/<job>/reconfigurations/<id>``, the state RECONFIGURING, and a hold
   on the job's checkpoint trigger (no checkpoint begins during the change;
   one in flight completes first, on every worker). The request is removed.
3. Every worker of the attempt wires its part (new instances' inboxes, held
   channels, state channels), says so under ``wired/``, and once every worker
   has, runs it (the core's protocol, with state crossing workers through
   ``handoff``), then reports under ``done/``.
4. When every worker is done the leader writes, in one transaction, the job
   RUNNING with ``reconfigurations`` + 1, the new ``/jobs/<job>/layout``
   (which a later attempt starts from) and the trigger released. The attempt
   does not change. A worker lost or failing meanwhile makes the next attempt
   (RECOVERING), from the last checkpoint, which no change ever crosses.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import anyio

from streamlet.backends.cluster.tree import jobs, paths
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.outline import window_reason
from streamlet.backends.cluster.tree.paths import Layout, Reconfiguration, ReconfigureRequest
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model import graph
from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.topology import Topology
from streamlet.errors import NodeExists, ReconfigurationError

POLL = 0.1  # seconds between looks while a client waits for a change (as ``submit --wait`` does)


def with_layout(topology: Topology, layout: Layout | None) -> Topology:
    """``topology`` with the parallelism live changes gave its tasks."""
    for name, count in (layout["parallelism"] if layout else {}).items():
        if name in topology.nodes:
            topology.nodes[name].parallelism = int(count)
    return topology


def table_of(topology: Topology, layout: Layout | None, task: str) -> SegmentTable:
    """The segment table ``task`` runs with: the layout's, else contiguous ranges."""
    data = (layout["tables"] if layout else {}).get(task)
    node = topology.nodes[task]
    if data is not None:
        table = SegmentTable.from_data(data)
        if table.instances == node.parallelism:
            return table
    return SegmentTable.contiguous(node.max_parallelism, node.parallelism)


def unchangeable(topology: Topology, task: str) -> str | None:
    """Why ``task`` cannot change live (``None``: it can): not a task of the job, in a loop, or keeping a
    window that cannot be split."""
    node = topology.nodes.get(task)
    if node is None or node.kind != "task":
        tasks = sorted(name for name, n in topology.nodes.items() if n.kind == "task")
        return f"job '{topology.name}' has no task called '{task}' (tasks: {tasks})"
    if any(task in part for part in graph.strongly_connected(topology.successors())):
        return f"task '{task}' is in a loop: loops cannot be reconfigured live"
    reason = window_reason(topology, task)  # the window object's word, or the outline's copy of it
    return None if reason is None else f"task '{task}' cannot be reconfigured: {reason}"


def new_table(
    topology: Topology, layout: Layout | None, request: ReconfigureRequest
) -> tuple[SegmentTable, SegmentTable]:
    """The task's table now and after ``request``; a request that cannot be done is a :class:`ReconfigurationError`."""
    task = str(request.get("task"))
    reason = unchangeable(topology, task)
    if reason is not None:
        raise ReconfigurationError(reason)
    node = topology.nodes[task]
    old = table_of(topology, layout, task)
    if "instances" in request:
        count = request["instances"]
        if type(count) is not int or not 1 <= count <= node.max_parallelism:
            raise ReconfigurationError(
                f"task '{task}' can run with 1 to {node.max_parallelism} instances (its max_parallelism), not {count!r}"
            )
        return old, old.rescaled(count)
    if "migrate" in request:
        return old, old  # the table stays: one instance moves (see :func:`plan`)
    moves = {int(segment): int(owner) for segment, owner in (request.get("moves") or {}).items()}
    for segment, owner in moves.items():
        if not 0 <= segment < old.segments or not 0 <= owner < old.instances:
            raise ReconfigurationError(f"task '{task}': segment {segment} cannot go to instance {owner}")
    return old, old.moved_to(moves)


def plan(
    ident: int,
    topology: Topology,
    layout: Layout | None,
    request: ReconfigureRequest,
    instances: dict[str, str],
    attempt: int,
    epoch: int,
    room: dict[str, int],
    finished: Collection[str] = (),
) -> Reconfiguration:
    """The leader's plan for ``request``.

    ``instances``: the attempt's instance -> worker, with those added live; ``room``: every live worker the
    task may run on (its ``workers=``/``labels=``) -> instances it can still take (over every job);
    ``finished``: workers whose part of the attempt is over. New instances go to the live workers holding
    fewest of the job's instances, among those with room (a worker that joined the cluster after the job
    started holds none: it is picked first, and joins the running attempt); a migration goes where the
    request says, if that worker is live and has room. A worker whose part of the attempt was emptied
    (everything moved away) takes nothing more until the next attempt: its part may have ended. Every
    worker running a part of the job, and every worker the change puts an instance on, takes part in it.
    """
    old, new = new_table(topology, layout, request)
    task = str(request["task"])
    running = {
        instance: worker
        for instance, worker in running_instances(instances, topology).items()
        if worker not in finished
    }
    # a worker whose part of the attempt holds nothing any more may have ended it: it waits for the next attempt
    emptied = set(instances.values()) - set(running.values())
    free = {worker: count for worker, count in room.items() if worker not in finished and worker not in emptied}
    relocated: list[int] = []
    if "migrate" in request:
        placed = _migration(topology.name, task, request, running, free, old.instances)
        relocated = [int(request["migrate"])]
    else:
        placed = _new_instances(topology.name, task, range(old.instances, new.instances), running, free)
    workers = sorted(set(running.values()) | set(placed.values()))
    return {
        "id": ident, "attempt": attempt, "task": task, "old": old.to_data(), "new": new.to_data(),
        "placed": placed, "relocated": relocated, "workers": workers, "epoch": epoch,
    }  # fmt: skip


def _new_instances(
    job: str, task: str, indices: range, running: dict[str, str], free: dict[str, int]
) -> dict[str, str]:
    """New instances on the live workers holding fewest of the job's instances, among those with room."""
    held = {worker: sum(1 for owner in running.values() if owner == worker) for worker in free}
    placed = {}
    for index in indices:
        open_ = [worker for worker in sorted(free) if free[worker] > 0]
        if not open_:
            raise ReconfigurationError(
                f"no live worker has room for instance {index} of '{task}' of job '{job}' "
                f"(workers: {', '.join(sorted(free)) or 'none'}; their capacity is taken)"
            )
        worker = min(open_, key=lambda w: (held[w], w))
        placed[paths.instance_id(task, index)] = worker
        held[worker] += 1
        free[worker] -= 1
    return placed


def _migration(
    job: str, task: str, request: ReconfigureRequest, running: dict[str, str], free: dict[str, int], instances: int
) -> dict[str, str]:
    """Where instance ``request["migrate"]`` goes: ``request["to"]``, a live worker with room."""
    index, worker = request.get("migrate"), str(request.get("to"))
    if type(index) is not int or not 0 <= index < instances:
        raise ReconfigurationError(f"task '{task}' has instances 0 to {instances - 1}, not {index!r}")
    instance = paths.instance_id(task, index)
    if running.get(instance) == worker:
        raise ReconfigurationError(f"{instance} runs on {worker} already")
    if worker not in free:
        raise ReconfigurationError(
            f"{worker} cannot take {instance}: it is not a live worker that may run '{task}' and takes part in "
            f"job '{job}' now (those that can: {', '.join(sorted(free)) or 'none'})"
        )
    if free[worker] <= 0:
        raise ReconfigurationError(f"{worker} has no room for {instance} (its capacity is taken)")
    return {instance: worker}


def running_instances(instances: dict[str, str], topology: Topology) -> dict[str, str]:
    """The instances of ``instances`` that run now (not retired by a change): index below the parallelism."""
    return {
        instance: worker
        for instance, worker in instances.items()
        if int(instance.rsplit(".", 1)[1]) < topology.nodes[paths.task_of(instance)].parallelism
    }


def next_layout(layout: Layout | None, reconfiguration: Reconfiguration, topology: Topology) -> Layout:
    """The job's layout once ``reconfiguration`` is done."""
    attempt = reconfiguration["attempt"]
    new = SegmentTable.from_data(reconfiguration["new"])
    task = reconfiguration["task"]
    parallelism, tables = (dict(layout["parallelism"]), dict(layout["tables"])) if layout else ({}, {})
    same = layout is not None and layout["attempt"] == attempt
    placed = dict(layout["placed"]) if layout and same else {}
    incarnations = dict(layout.get("incarnations", {})) if layout and same else {}
    return {
        "attempt": attempt,
        "parallelism": {**parallelism, task: new.instances},
        "tables": {**tables, task: new.to_data()},
        "placed": {**placed, **reconfiguration["placed"]},
        "incarnations": {**incarnations, **dict.fromkeys(reconfiguration["placed"], int(reconfiguration["id"]))},
    }


def request_node(
    task: str,
    instances: int | None = None,
    moves: dict[int, int] | None = None,
    migrate: tuple[int, str] | None = None,
    by: str = "streamlet",
) -> ReconfigureRequest:
    """What ``streamlet rescale`` / ``streamlet migrate`` (or an adaptation policy, ``by``) writes."""
    request: ReconfigureRequest = {"task": task, "by": by, "at": time.time()}
    if migrate is not None:
        request["migrate"], request["to"] = migrate
    if instances is not None:
        request["instances"] = instances
    if moves is not None:
        request["moves"] = {str(segment): owner for segment, owner in moves.items()}
    return request


def placed_instances(assignment: dict[str, str], layout: Layout | None, attempt: int) -> dict[str, str]:
    """The attempt's instance -> worker, with the instances live changes added in it."""
    placed = dict(assignment)
    if layout is not None and layout["attempt"] == attempt:
        placed.update(layout["placed"])
    return placed


def trigger_path(job: str, attempt: int) -> str:
    """The checkpoint trigger of ``attempt`` (see ``checkpoints``): the leader holds it during a change."""
    return f"{paths.checkpoints(job)}/attempt-{attempt}/trigger"


def held(trigger: dict[str, Any] | None, ident: int) -> dict[str, Any]:
    """The trigger's data held for change ``ident`` (created at epoch 0 when no checkpoint began yet)."""
    base = trigger or {"epoch": 0, "final": False, "pause": False, "at": time.time()}
    return {**base, "hold": ident}


# -- the client's side -------------------------------------------------------------------


async def ask(store: ClusterStore, job: str, request: ReconfigureRequest) -> int:
    """Check ``request`` against the running job and leave it for the leader; returns the job's count of
    reconfigurations before it (what :func:`wait_done` waits past)."""
    status = await jobs.job_status(store, job)
    if status["state"] != JobState.RUNNING.value:
        raise ReconfigurationError(f"job '{job}' is {status['state']}: only a RUNNING job changes shape")
    found = await store.get(paths.spec(job))
    if found is None:
        raise ReconfigurationError(f"job '{job}' has no spec")
    layout = await store.get(paths.layout(job))
    topology = with_layout(jobs.topology_of(found[0]), None if layout is None else layout[0])
    new_table(topology, None if layout is None else layout[0], request)  # refused here, with the reason, at once
    try:
        await store.create(paths.reconfigure_request(job), request)
    except NodeExists:
        raise ReconfigurationError(f"a change of job '{job}' is waiting already: one at a time") from None
    return int(status["reconfigurations"])


async def wait_done(store: ClusterStore, job: str, before: int, asked_at: float, seconds: float) -> dict[str, Any]:
    """Follow the job until the change is done (its status then) or refused (a :class:`ReconfigurationError`)."""
    with anyio.move_on_after(seconds):
        while True:
            status = await jobs.job_status(store, job)
            if int(status["reconfigurations"]) > before and status["state"] == JobState.RUNNING.value:
                return status
            if JobState(status["state"]).ended:
                raise ReconfigurationError(f"job '{job}' ended ({status['state']}) before the change was done")
            refused = await store.get(paths.reconfigure_refused(job))
            if refused is not None and float(refused[0]["at"]) >= asked_at:
                raise ReconfigurationError(f"the leader refused the change: {refused[0]['error']}")
            await anyio.sleep(POLL)
    raise ReconfigurationError(f"job '{job}' has not finished the change after {seconds:g} s ({status['reason']})")
