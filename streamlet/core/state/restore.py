"""Putting a job back where a checkpoint left it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.sinks import RestorePoint
from streamlet.core.state.participant import Participant
from streamlet.core.state.regroup import regroup, unsplittable_window
from streamlet.errors import JobError, NotReplayable


def layout_of(document: dict[str, Any] | None, tables: Mapping[str, SegmentTable]) -> dict[str, SegmentTable]:
    """The segment tables a job resumes with: the checkpoint's, where they fit its tasks now (same number of
    instances and segments), so state stays where it was; the others keep ``tables`` (the defaults)."""
    chosen = dict(tables)
    for name, data in ((document or {}).get("layout") or {}).items():
        current = chosen.get(name)
        if current is None:
            continue
        table = SegmentTable.from_data(data)
        if table.instances == current.instances and table.segments == current.segments:
            chosen[name] = table
    return chosen


async def restore(
    instances: Mapping[str, Sequence[Participant]],
    document: dict[str, Any] | None,
    tables: Mapping[str, SegmentTable] | None = None,
) -> None:
    """Restore sources' positions, tasks' state and windows, and sinks' staged output.

    Sinks are told the checkpoint's epoch and the attempt that took it
    (``document["attempt"]``), so they publish what that run staged; for a
    fresh start (``document`` is ``None``) they are told ``None``. A sink's
    ``restore`` may be ``async def``, e.g. to redo a Spark write off the
    event loop. A task's keyed state is re-split by key when its parallelism
    changed or its segment table is not the one it was taken with (``tables``:
    what the job routes by now; see :func:`layout_of`); sources must keep
    theirs. ``instances`` may hold only some instances of a node (a cluster
    worker's share): each takes the entry of its own index.
    """
    point = None if document is None else RestorePoint(document["epoch"], document.get("attempt"))
    for group in instances.values():
        for instance in group:
            await instance.restore_output(point)
    if document is None or document["finished"]:
        return
    for name, group in instances.items():
        section = group[0].section
        if section is not None and document.get("savepoint") and name not in document.get(section, {}):
            continue  # a node added since the savepoint was taken starts afresh
        if section == "sources":
            try:
                _restore_each(group, _entries(document, section, name, group))
            except NotReplayable as exc:  # said again with the checkpoint it was resuming from
                raise NotReplayable.of(exc.source, exc.instance, document["epoch"], document["job"]) from None
        elif section == "tasks":
            entries = _entries(document, section, name, group, exact=False)
            table = (tables or {}).get(name)
            _restore_each(group, _resplit(name, group, entries, document, table))
        elif section == "sinks" and name in document.get("sinks", {}):  # (a checkpoint from before sinks kept any)
            _restore_each(group, _sink_entries(document["sinks"][name], group[0].node.parallelism))


def _entries(
    document: dict[str, Any], section: str, name: str, group: Sequence[Participant], exact: bool = True
) -> list[Any]:
    entries = document[section].get(name)
    if entries is None:
        raise JobError(f"checkpoint {document['epoch']} of job '{document['job']}' has nothing for '{name}'")
    parallelism = group[0].node.parallelism
    if exact and len(entries) != parallelism:
        raise JobError(
            f"'{name}' ran with parallelism {len(entries)} at checkpoint {document['epoch']}; "
            f"it cannot resume with {parallelism}"
        )
    return list(entries)


def _sink_entries(entries: list[Any], parallelism: int) -> list[Any]:
    """What each instance of a sink that keeps its output gets back: its own entry; with another parallelism
    than at the checkpoint, every entry's output (a list), in instance order, to instance 0 and none to the
    others (which instance holds a record changes nothing of what the job gave)."""
    if len(entries) == parallelism:
        return list(entries)
    return [[item for entry in entries if entry for item in entry], *([[]] * (parallelism - 1))]


def _restore_each(group: Sequence[Participant], entries: list[Any]) -> None:
    for instance in group:
        instance.restore(entries[instance.index])


def _resplit(
    name: str, group: Sequence[Participant], snapshots: list[Any], document: dict[str, Any], table: SegmentTable | None
) -> list[Any]:
    """Tasks' snapshots for the layout the job runs with now: as they are when it is the layout they were
    taken with, else every key's state, write time, timers and windows regrouped by its owner now."""
    node = group[0].node
    table = table or SegmentTable.contiguous(node.max_parallelism, node.parallelism)
    taken = (document.get("layout") or {}).get(name)
    unsplittable = unsplittable_window(node.window)
    if len(snapshots) == table.instances:
        if unsplittable is not None or (taken is not None and SegmentTable.from_data(taken) == table):
            return snapshots  # as taken (a count window over all of an instance's records stays with it)
    elif unsplittable is not None and any(snapshot.get("window") is not None for snapshot in snapshots):
        raise JobError(
            f"task '{name}' cannot change parallelism ({len(snapshots)} -> {table.instances}): {unsplittable}"
        )
    return regroup(snapshots, table.owner_function(), table.instances, node.window)
