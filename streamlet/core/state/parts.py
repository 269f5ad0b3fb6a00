"""One checkpoint document from the parts several processes or workers saved of it (each its own instances): used
by the cluster's workers and by processes=N alike.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from streamlet.core.state.participant import SECTIONS
from streamlet.errors import JobError


def merge_parts(parts: list[dict[str, Any]], completed: dict[str, Any] | None = None) -> dict[str, Any]:
    """One checkpoint document from workers' parts (or pieces of them): each node's snapshots in instance
    order. Without ``completed`` every instance must be there; with it (the completed checkpoint's record)
    an instance this worker did not read is ``None`` in its place."""
    record = completed or {}
    merged: dict[str, Any] = {
        "epoch": parts[0]["epoch"] if parts else record.get("epoch"),
        "job": parts[0]["job"] if parts else record.get("job_id"),
        "finished": all(part["finished"] for part in parts) and record.get("finished", True),
        "attempt": parts[0].get("attempt") if parts else record.get("run"),  # the run that took it: its staging
        "layout": parts[0].get("layout", {}) if parts else record.get("layout", {}),
    }
    counts = instances_per_task(record.get("holders", {}))
    for section in SECTIONS:
        by_node: dict[str, dict[int, Any]] = {}
        for part in parts:
            for name, entries in part.get(section, {}).items():
                by_node.setdefault(name, {}).update({int(index): snapshot for index, snapshot in entries})
        merged[section] = {}
        for name, snapshots in by_node.items():
            count = counts.get(name, len(snapshots))
            if completed is None and sorted(snapshots) != list(range(count)):
                raise JobError(f"checkpoint {merged['epoch']}: instances of '{name}' are missing from its parts")
            merged[section][name] = [snapshots.get(index) for index in range(count)]
    return merged


def instances_per_task(holders: dict[str, list[str]]) -> dict[str, int]:
    """How many instances of each task a checkpoint holds state of (its parallelism when taken)."""
    return dict(Counter(instance.rsplit(".", 1)[0] for instance in holders))  # "count.1": task "count"
