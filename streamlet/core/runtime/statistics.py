"""Frozen snapshots of what a job has done so far."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    """Records into and out of one node, summed over its instances."""

    name: str
    kind: str
    parallelism: int
    records_in: int
    records_out: int
    queued: int  # items waiting in the node's inboxes now


@dataclass(frozen=True, slots=True)
class JobStatistics:
    """A job's counters at one moment.

    ``dropped`` counts records removed on purpose (past a loop's iteration
    limit, or sent into a loop that had already ended); ``dead_lettered``
    counts records a ``skip`` task set aside; ``discarded`` counts records
    emitted on output ports nothing is connected to; ``late`` counts records
    that reached an event-time window after it closed (they went to the late
    output). ``checkpoints`` counts completed checkpoints and
    ``last_checkpoint`` describes the newest (epoch, size, seconds).
    """

    job: str
    nodes: dict[str, NodeStatistics]
    dropped: int
    dead_lettered: int
    discarded: int
    late: int
    restarts: int
    checkpoints: int
    last_checkpoint: Any
    wall_time: float
    running: bool


class InstanceCounters:
    """Mutable per-instance counters, summed into :class:`NodeStatistics` (records out are counted by the routes)."""

    __slots__ = ("records_in",)

    def __init__(self) -> None:
        self.records_in = 0
