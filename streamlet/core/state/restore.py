"""Putting a job back where a checkpoint left it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from streamlet.core.model.sinks import RestorePoint
from streamlet.core.model.timers import Timers
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.participant import Participant
from streamlet.errors import JobError


async def restore(instances: Mapping[str, Sequence[Participant]], document: dict[str, Any] | None) -> None:
    """Restore sources' positions, tasks' state and windows, and sinks' staged output.

    Sinks are told the checkpoint's epoch and the attempt that took it
    (``document["attempt"]``), so they publish what that run staged; for a
    fresh start (``document`` is ``None``) they are told ``None``. A sink's
    ``restore`` may be ``async def``, e.g. to redo a Spark write off the
    event loop. A task's keyed state is re-split by key when its parallelism
    changed; sources and windowed tasks must keep theirs. ``instances`` may
    hold only some instances of a node (a cluster worker's share): each takes
    the entry of its own index.
    """
    point = None if document is None else RestorePoint(document["epoch"], document.get("attempt"))
    for group in instances.values():
        for instance in group:
            await instance.restore_output(point)
    if document is None or document["finished"]:
        return
    for name, group in instances.items():
        section = group[0].section
        if section == "sources":
            _restore_each(group, _entries(document, section, name, group))
        elif section == "tasks":
            _restore_each(group, _resplit(name, group, _entries(document, section, name, group, exact=False)))


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


def _restore_each(group: Sequence[Participant], entries: list[Any]) -> None:
    for instance in group:
        instance.restore(entries[instance.index])


def _resplit(name: str, group: Sequence[Participant], snapshots: list[Any]) -> list[Any]:
    """Tasks' snapshots for the parallelism the job runs with now: keyed state, its write times (under a
    TTL) and timers are re-split by key."""
    parallelism = group[0].node.parallelism
    if len(snapshots) == parallelism:
        return snapshots
    if any(snapshot["window"] is not None for snapshot in snapshots):
        raise JobError(f"windowed task '{name}' cannot change parallelism ({len(snapshots)} -> {parallelism})")
    finished = all(snapshot["finished"] for snapshot in snapshots)
    parts = _resplit_keyed([snapshot["state"] for snapshot in snapshots], parallelism)
    timers = Timers.partition(Timers.merge([snapshot.get("timers") for snapshot in snapshots]), parallelism)
    resplit = [
        {"state": part, "window": None, "finished": finished, "timers": timers[index]}
        for index, part in enumerate(parts)
    ]
    written = [snapshot["state_written"] for snapshot in snapshots if "state_written" in snapshot]
    if written:
        for entry, part in zip(resplit, _resplit_keyed(written, parallelism), strict=True):
            entry["state_written"] = part
    return resplit


def _resplit_keyed(snapshots: list[bytes], parallelism: int) -> list[bytes]:
    """Key-to-something maps of every old instance, split for ``parallelism`` new ones."""
    return KeyedState.partition(KeyedState.merge(snapshots), parallelism)
