"""Putting a job back where a checkpoint left it."""

from __future__ import annotations

from typing import Any

from streamlet.core.model.sinks import RestorePoint
from streamlet.core.runtime.instances import Instance, SinkInstance, SourceInstance, _maybe_await
from streamlet.core.runtime.task_instance import TaskInstance
from streamlet.core.state.keyed import KeyedState
from streamlet.errors import JobError


async def restore(instances: dict[str, list[Instance]], document: dict[str, Any] | None) -> None:
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
            if isinstance(instance, SinkInstance):
                await _maybe_await(instance.writer.restore(point))
    if document is None or document["finished"]:
        return
    for name, group in instances.items():
        kind = group[0].node.kind
        if kind == "source":
            _restore_sources(name, group, _entries(document, "sources", name, group))
        elif kind == "task":
            _restore_tasks(name, group, _entries(document, "tasks", name, group, exact=False))


def _entries(document: dict[str, Any], section: str, name: str, group: list[Instance], exact: bool = True) -> list[Any]:
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


def _restore_sources(name: str, group: list[Instance], positions: list[Any]) -> None:
    for instance in group:
        assert isinstance(instance, SourceInstance)
        instance.restore_position = positions[instance.index]


def _restore_tasks(name: str, group: list[Instance], snapshots: list[Any]) -> None:
    parallelism = group[0].node.parallelism
    if len(snapshots) != parallelism:
        if any(snapshot["window"] is not None for snapshot in snapshots):
            raise JobError(f"windowed task '{name}' cannot change parallelism ({len(snapshots)} -> {parallelism})")
        merged = KeyedState.merge([snapshot["state"] for snapshot in snapshots])
        finished = all(snapshot["finished"] for snapshot in snapshots)
        parts = KeyedState.partition(merged, parallelism)
        snapshots = [{"state": part, "window": None, "finished": finished} for part in parts]
    for instance in group:
        assert isinstance(instance, TaskInstance)
        instance.restore(snapshots[instance.index])
