"""The leader's side of a live change: the plan for a request (the task's new table, a worker for each new
instance) and the job's layout once the change is done.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.layouts import new_table
from streamlet.backends.cluster.tree.paths import Layout, Reconfiguration, ReconfigureRequest
from streamlet.core.model import world
from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.topology import Topology
from streamlet.errors import ReconfigurationError


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


def held(trigger: dict[str, Any] | None, ident: int) -> dict[str, Any]:
    """The trigger's data held for change ``ident`` (created at epoch 0 when no checkpoint began yet)."""
    base = trigger or {"epoch": 0, "final": False, "pause": False, "at": world.wall_time()}
    return {**base, "hold": ident}
