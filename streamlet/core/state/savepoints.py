"""Savepoints: a checkpoint document kept as a file of its own, to start a job (maybe changed) from.

A savepoint is taken like any checkpoint (barriers, nothing stops) and then
written to a path the user names, in the checkpoint file format (framed,
CRC-checked msgpack; never pickle). A job started from it may run changed
code and other parallelism as long as its task and source names and the
shapes of their state match: a task that kept state must still be there and
windowed, a source must keep its parallelism; a node the savepoint does not
know starts afresh. A mismatch is a :class:`~streamlet.errors.JobError`
naming the task, before anything runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from streamlet.core.model.topology import Topology
from streamlet.core.state.durable import reason, write_file
from streamlet.core.state.store import decode, encode
from streamlet.errors import CheckpointError, JobError


def write_savepoint(path: str | os.PathLike[str], document: dict[str, Any]) -> Path:
    """Write ``document`` to ``path`` durably (fsync, rename into place); returns the path."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # a job started from it is another job: what a CollectSink collected stays with the job that did
        kept = {key: value for key, value in document.items() if key != "sinks"}
        write_file(target, encode({**kept, "savepoint": True}))
    except OSError as exc:
        raise CheckpointError(f"cannot write the savepoint {target}: {reason(exc)}") from exc
    return target


def read_savepoint(path: str | os.PathLike[str]) -> tuple[int, dict[str, Any]]:
    """The savepoint at ``path`` as ``(epoch, document)``; a missing, torn or foreign file is a clear error."""
    source = Path(path)
    try:
        document = decode(source.read_bytes(), str(source))
    except OSError as exc:
        raise JobError(f"cannot read the savepoint {source}: {reason(exc)}") from exc
    except ValueError as exc:
        raise JobError(f"{source} is not an intact streamlet savepoint: {exc}") from exc
    return int(document["epoch"]), document


def check_fits(document: dict[str, Any], topology: Topology, where: str) -> None:
    """Refuse, naming the node, a savepoint whose state ``topology`` cannot take (see the module docstring)."""
    nodes = topology.nodes
    for name, entries in document.get("tasks", {}).items():
        node = nodes.get(name)
        if node is None or node.kind != "task":
            raise JobError(f"{where} holds the state of task '{name}', which topology '{topology.name}' has not")
        windowed = any(isinstance(entry, dict) and entry.get("window") is not None for entry in entries)
        if windowed and node.window is None:
            raise JobError(f"{where}: task '{name}' kept window state, but it has no window now")
    for name, positions in document.get("sources", {}).items():
        node = nodes.get(name)
        if node is None or node.kind != "source":
            raise JobError(f"{where} holds the position of source '{name}', which topology '{topology.name}' has not")
        if len(positions) != node.parallelism:
            raise JobError(
                f"{where}: source '{name}' ran with parallelism {len(positions)}; a source keeps its parallelism "
                f"(it has {node.parallelism})"
            )
