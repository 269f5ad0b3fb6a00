"""What a worker's heartbeat says of its load, and when it calls itself OVERLOADED.

Each beat also carries every local instance's statistics snapshot
(records, batches, busy and blocked seconds, queue fill and state, latency
histogram; cumulative), which the leader's adaptation loop turns into rates.

A worker runs all its instances in one event loop, so one core is its
ceiling. It is OVERLOADED (SpeedStream's state: the leader places new
instances elsewhere first) when, over the last heartbeat, its process used
at least ``cpu_limit`` of a core *and* some local instance's inbox is full,
meaning senders wait on it. Either alone is no overload: a busy loop that
keeps up is fine, and a full inbox behind a slow ``await`` does not need
another core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamlet.backends.cluster.tree.registry import process_load
from streamlet.core.model import world

QueueDepths = dict[str, tuple[int, bool]]  # "job/node.index" -> (items queued, inbox full)
InstanceStatistics = dict[str, dict[str, Any]]  # "job/node.index" -> InstanceSnapshot.to_data()


@dataclass
class LoadMeter:
    """Builds each heartbeat's load report from the process counters and the instances' queues."""

    queues: Callable[[], QueueDepths]
    statistics: Callable[[], InstanceStatistics] | None = None  # every local instance's counters
    jobs: Callable[[], dict[str, dict[str, Any]]] | None = None  # every local job part's job-wide counters
    cpu_limit: float = 0.9
    sample: Callable[[], dict[str, Any]] = process_load  # CPU seconds and memory of this process
    clock: Callable[[], float] = world.monotonic
    _last: tuple[float, float] | None = field(default=None, init=False)  # (wall clock, cpu seconds)

    def restart(self) -> None:
        """Forget the last sample: the next report's CPU share is 0 and the one after measures afresh."""
        self._last = None

    def __call__(self) -> dict[str, Any]:
        """The load report: CPU share, memory, per-instance queue depth, and the overload verdict."""
        report = self.sample()
        now, cpu = self.clock(), float(report["cpu_seconds"])
        share = 0.0
        if self._last is not None and now > self._last[0]:
            share = (cpu - self._last[1]) / (now - self._last[0])
        self._last = (now, cpu)
        depths = self.queues()
        backed_up = sorted(name for name, (_, full) in depths.items() if full)
        report.update(
            cpu_share=round(share, 3),
            queues={name: queued for name, (queued, _) in depths.items()},
            backed_up=backed_up,
            overloaded=share >= self.cpu_limit and bool(backed_up),
        )
        if self.statistics is not None:  # what the adaptation loop reads (rates are differences of two beats)
            report["instances"] = self.statistics()
        if self.jobs is not None:  # what the dashboard and the cluster's /metrics show per job
            report["jobs"] = self.jobs()
        return report
