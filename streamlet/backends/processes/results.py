"""The worker processes' reports, gathered into the one ``JobResult`` a run in one process returns.

Each process reports its part: the records of its ``CollectSink``
instances (instance by instance), its dead letters and its statistics. The
result puts each sink's records together in instance order (every process
holds one contiguous run of a node's instances: see ``placement``), sums the
counters per node and for the job, and takes the wall time the parent
measured (from the fork to the last part's end: what the caller waited).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamlet.backends.processes.failures import rebuilt
from streamlet.backends.processes.placement import Where, holders
from streamlet.backends.processes.wire import records_in
from streamlet.core.model.record import DeadLetter, Record
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.job import JobResult
from streamlet.core.runtime.statistics import JobStatistics, NodeStatistics
from streamlet.core.state.checkpoints import CheckpointInfo

Checkpoints = tuple[int, CheckpointInfo | None, list[int]] | None  # completed, the last, duration histogram


@dataclass
class PartReport:
    """What one worker process reported of its part."""

    where: str  # "worker process 2 of 3 (pid 4242)", for the errors it raised
    records: dict[str, list[Record]] = field(default_factory=dict)  # sink -> records, as they came
    dead_letters: list[DeadLetter] = field(default_factory=list)
    sinks: dict[str, int] = field(default_factory=dict)  # collecting sinks it had instances of -> records
    statistics: dict[str, Any] = field(default_factory=dict)

    def take(self, message: dict[str, Any]) -> None:
        """Add a ``records``, ``dead_letters`` or ``done`` message."""
        kind = message["kind"]
        if kind == "records":
            self.records.setdefault(str(message["sink"]), []).extend(records_in(message["body"]))
        elif kind == "dead_letters":
            records = [record for body in message["records"] for record in records_in(body)]
            for (task, instance, error, exception), record in zip(message["letters"], records, strict=True):
                self.dead_letters.append(DeadLetter(task, instance, record, error, rebuilt(exception, self.where)))
        elif kind == "done":
            self.sinks = {str(name): int(count) for name, count in message["sinks"].items()}
            self.statistics = message["statistics"]


def merged(
    topology: Topology, where: Where, parts: list[PartReport], wall_time: float, checkpoints: Checkpoints = None
) -> JobResult:
    """One result from every process's ``parts`` (in process order) of a run of ``topology`` (validated);
    ``checkpoints``: how many the parent completed, the last one and the histogram of their durations."""
    sinks: dict[str, list[Record]] = {}
    for name, node in topology.nodes.items():
        if node.kind != "sink":
            continue
        holding = [parts[process] for process in holders(where, name)]
        if all(name in part.sinks for part in holding):
            sinks[name] = [record for part in holding for record in part.records.get(name, [])]
    dead_letters = [letter for part in parts for letter in part.dead_letters]
    counters = statistics(topology, [part.statistics for part in parts], wall_time, checkpoints)
    return JobResult(counters, dead_letters, sinks)


SUMMED_NODE_COUNTERS = ("held", "held_peak", "lookups", "cache_hits")  # NodeStatistics' fields after queued


def statistics(
    topology: Topology, parts: list[dict[str, Any]], wall_time: float, checkpoints: Checkpoints = None
) -> JobStatistics:
    """The job's counters: each node's summed over the processes, and the job's."""
    nodes = {}
    for name, node in topology.nodes.items():
        counted = [part["nodes"][name] for part in parts if name in part["nodes"]]
        if counted:
            nodes[name] = NodeStatistics(
                name, node.kind, node.parallelism, sum(int(c["records_in"]) for c in counted),
                sum(int(c["records_out"]) for c in counted), sum(int(c["queued"]) for c in counted),
                *(sum(int(c.get(field, 0)) for c in counted) for field in SUMMED_NODE_COUNTERS),
            )  # fmt: skip

    def total(counter: str) -> int:
        return sum(int(part[counter]) for part in parts)

    completed, last, durations = checkpoints or (0, None, [])
    return JobStatistics(
        job=topology.name, nodes=nodes, dropped=total("dropped"), dead_lettered=total("dead_lettered"),
        discarded=total("discarded"), late=total("late"), restarts=total("restarts"), checkpoints=completed,
        last_checkpoint=last, wall_time=wall_time, running=False, shed=total("shed"),
        checkpoint_durations=durations,
    )  # fmt: skip
