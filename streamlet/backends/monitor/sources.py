"""Readings of one job running in this process (``sl.start(topology, monitor_port=...)``); the cluster's
are ``cluster_source``."""

from __future__ import annotations

import time

from streamlet.backends.monitor.views import Reading, graph_of
from streamlet.core.runtime.job import Job


class JobSource:
    """Readings of one job running in this process: one pseudo-worker, ``local``."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._graph = graph_of(job.topology)

    async def read(self) -> Reading:
        """The job now."""
        job, stats = self.job, self.job.statistics()
        name = job.topology.name
        instances = {f"{name}/{s.node}.{s.index}": s.to_data() for s in job.instance_statistics()}
        counters = {
            "late": stats.late, "dead_lettered": stats.dead_lettered, "dropped": stats.dropped, "shed": stats.shed,
            "restarts": stats.restarts, "checkpoints": stats.checkpoints,
            "checkpoint_durations": stats.checkpoint_durations,
        }  # fmt: skip
        load = {"instances": instances, "jobs": {name: counters}, "loop_lag": round(stats.loop_lag, 3)}
        last = stats.last_checkpoint
        state = "RUNNING" if stats.running else ("ENDED" if stats.wall_time else "STARTING")
        entry = {
            "name": name, "state": state, "reason": "in this process", "attempt": 1, "reconfigurations": 0,
            "instances": {key.split("/", 1)[1]: "local" for key in instances}, "decisions": list(job.decisions),
            "graph": self._graph, "checkpoint": None if last is None else {"epoch": last.epoch},
        }  # fmt: skip
        return Reading(time.time(), None, [{"worker": "local", "load": load}], [entry])
