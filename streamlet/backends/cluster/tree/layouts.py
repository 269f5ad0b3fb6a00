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

from streamlet.backends.cluster.tree.outline import window_reason
from streamlet.backends.cluster.tree.paths import Layout, ReconfigureRequest
from streamlet.core.model import graph, world
from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.topology import Topology
from streamlet.errors import ReconfigurationError


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


def request_node(
    task: str,
    instances: int | None = None,
    moves: dict[int, int] | None = None,
    migrate: tuple[int, str] | None = None,
    by: str = "streamlet",
) -> ReconfigureRequest:
    """What ``streamlet rescale`` / ``streamlet migrate`` (or an adaptation policy, ``by``) writes."""
    request: ReconfigureRequest = {"task": task, "by": by, "at": world.wall_time()}
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


# -- the client's side -------------------------------------------------------------------
