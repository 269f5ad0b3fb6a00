"""A worker joining a running attempt: what it reads to build its part where the job stands now.

A live change may put an instance on a worker that runs no part of the
attempt (one that joined the cluster after the job started, say). That
worker builds a part of the running attempt with nothing of its own yet:
the job's shape as live changes left it (parallelism, segment tables, and
the change that placed each moved or added instance, which channel names
carry), held open until the change that gives it instances has wired and
started them. From then on it is a worker of the attempt like the others:
it takes part in checkpoints, later changes, and the job's end.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.lifecycle import JobState, state_of
from streamlet.backends.cluster.tree.paths import Assignment, JobStateNode, Layout, Reconfiguration
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model.segments import SegmentTable


def tables_of(layout: Layout | None) -> dict[str, SegmentTable]:
    """The segment tables live changes gave the job's tasks (the job routes by them, over a checkpoint's)."""
    return {task: SegmentTable.from_data(data) for task, data in (layout["tables"] if layout else {}).items()}


def incarnations_of(layout: Layout | None, attempt: int) -> dict[tuple[str, int], int]:
    """(task, index) -> the live change of ``attempt`` that put the instance where it runs."""
    if layout is None or layout["attempt"] != attempt:
        return {}
    found = {}
    for instance, change in layout.get("incarnations", {}).items():
        task, index = instance.rsplit(".", 1)
        found[task, int(index)] = int(change)
    return found


def attempt_workers(assignment: Assignment, joined: Iterable[str] = ()) -> list[str]:
    """The workers of an attempt as each of them lists it: those assigned, sorted (the first triggers
    checkpoints and detects quiet loops), then those that joined it, sorted."""
    assigned = sorted(set(assignment["instances"].values()))
    return assigned + sorted(set(joined) - set(assigned))


def joined_workers(layout: Layout | None, attempt: int, change: Reconfiguration | None = None) -> set[str]:
    """Workers live changes of ``attempt`` placed instances on (``change`` too, the one under way)."""
    workers = set(layout["placed"].values()) if layout is not None and layout["attempt"] == attempt else set()
    if change is not None and int(change["attempt"]) == attempt:
        workers |= set(change["placed"].values())
    return workers


async def change_to_join(
    store: ClusterStore, job: str, attempt: int, me: str, state: JobStateNode
) -> Reconfiguration | None:
    """The live change under way (``state``: the job's) that puts an instance of ``attempt`` on ``me``
    (``None``: none does)."""
    if state_of(state) != JobState.RECONFIGURING:
        return None
    names = await store.children(paths.reconfigurations(job))
    if not names:
        return None
    found = await store.get(paths.change(job, names[-1]))
    if found is None:
        return None
    change: Reconfiguration = found.data
    if int(change["attempt"]) != attempt or me not in change["placed"].values():
        return None
    if await store.get(paths.child(paths.change_done(job, names[-1]), me)) is not None:
        return None  # its part of the change is over (and the part it joined with has ended)
    return change
