"""What the harness asks of the running job, as a client or an operator would: live changes (a rescale, a
migration, a new worker joining for a rescale), the shed ratio, a savepoint.

Each is one step of a run's timeline. A request the job is in no state to take (RECOVERING after a fault,
say) is refused with a reason, as the command would refuse it; the run goes on without it. Every choice
(which instance moves, where) comes from the run's seeded generator.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

from streamlet.backends.cluster.client import live_changes, savepoints
from streamlet.backends.cluster.tree import layouts, paths
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model import world
from streamlet.core.state.savepoints import read_savepoint
from streamlet.errors import StreamletError
from streamlet.testing.chaos.sessions import Trace

SAVEPOINT_SECONDS = 60.0  # virtual seconds a savepoint has before the client gives up on it


async def ask_rescale(client: ClusterStore, job: str, task: str, instances: int) -> None:
    """``streamlet rescale job task instances``."""
    with contextlib.suppress(StreamletError):  # not RUNNING then (recovering from a fault): no change this run
        await live_changes.ask(client, job, layouts.request_node(task, instances))


async def ask_migration(client: ClusterStore, job: str, task: str, rng: random.Random) -> None:
    """``streamlet migrate job task index worker``: one instance of ``task`` (drawn) to a registered worker
    that does not run it now (drawn)."""
    assignment, layout = await client.get(paths.assignment(job)), await client.get(paths.layout(job))
    if assignment is None:
        return
    attempt = int(assignment.data["attempt"])
    placed = layouts.placed_instances(assignment.data["instances"], None if layout is None else layout.data, attempt)
    ours = sorted((int(name.rsplit(".", 1)[1]), at) for name, at in placed.items() if paths.task_of(name) == task)
    index, now = ours[rng.randrange(len(ours))]
    others = sorted(set(await client.children(paths.WORKERS)) - {now})
    if not others:
        return
    target = others[rng.randrange(len(others))]
    with contextlib.suppress(StreamletError):
        await live_changes.ask(client, job, layouts.request_node(task, migrate=(index, target)))


async def set_shed_ratio(client: ClusterStore, job: str, ratio: float) -> None:
    """Set the job's shed ratio, as the leader's shed policy does (``paths.shedding``)."""
    found = await client.get(paths.shedding(job))
    data = {"ratio": ratio, "at": world.wall_time()}
    if found is None:
        await client.create(paths.shedding(job), data)
    else:
        await client.set(paths.shedding(job), data)


async def take_savepoint(client: ClusterStore, job: str, folder: Path, secret: bytes, trace: Trace) -> bool:
    """``streamlet savepoint job file``: the file written, or the reason it was not, goes to the trace;
    whether it was written."""
    path = folder / "savepoint.msgpack"
    try:
        epoch = await savepoints.take(client, job, path, secret, seconds=SAVEPOINT_SECONDS)
    except (StreamletError, TimeoutError) as exc:
        trace.add(f"savepoint refused: {type(exc).__name__}: {exc}")
        return False
    written, document = read_savepoint(path)  # what submit --from-savepoint would read
    nodes = ", ".join(sorted([*document["sources"], *document["tasks"]]))
    trace.add(f"savepoint of epoch {epoch} written (its file says epoch {written}): {nodes}")
    return True
