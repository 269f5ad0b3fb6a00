"""The adaptation loop of a job embedded in one process: ``sl.start(topology, adapt=AdaptSettings(...))``.

The same pure policies as the cluster's loop (``backends.cluster.control``),
read from the job's own statistics and carried out with its own live
changes:

- ``balance``: every task fed through ``SESSION_TABLE`` edges is balanced by
  the session-table balancer from the segment loads of the window
  (``job.move_segments``);
- ``autoscale``: DS2 from the instances' true rates (``job.rescale``). On one
  event loop more instances add no CPU: it helps tasks that wait (I/O-bound
  work), not CPU-bound ones; a cluster adds workers;
- ``shed``: when neither changed anything, the shed policy sets the share the
  sources shed under the topology's QoS (``job.shed``).

Every ``interval`` seconds one window closes and at most one decision is
taken; it is appended to ``job.decisions`` with its policy and reason, and
the job is left alone for ``cooldown`` seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import structlog

from streamlet.adaptation.autoscale import ds2, node_edges, node_rates, windows
from streamlet.adaptation.session_table import DEFAULT_TOLERANCE, Balancing, balance, session_tasks
from streamlet.adaptation.settings import AdaptSettings
from streamlet.adaptation.shedding import decide, held_back, window_latency
from streamlet.core.runtime.job import Job
from streamlet.errors import JobError, ReconfigurationError

log = structlog.get_logger("streamlet")

Window = tuple[dict[str, dict[str, Any]], dict[str, list[int]]]  # instance statistics, segment loads per task


class LocalAdaptation:
    """Runs ``settings``' policies on ``job`` (``clock``: seconds, for the windows' lengths)."""

    def __init__(self, job: Job, settings: AdaptSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.settings = settings
        self.clock = clock
        self._base = self._window()
        self._began = clock()
        self._decided = -math.inf

    async def run(self) -> None:
        """Look every ``interval`` until cancelled (inside the cooldown the window only starts afresh)."""
        while True:
            await anyio.sleep(self.settings.interval)
            if self.clock() - self._decided < self.settings.cooldown:
                self.restart_window()
                continue
            try:
                await self.look()
            except ReconfigurationError as exc:  # the job ended or changed meanwhile: the next look sees
                log.info("adaptation look skipped", job=self.job.topology.name, reason=str(exc))
            except Exception as exc:  # noqa: BLE001 - a policy's failure must not take the job down with it
                log.warning("adaptation look failed", job=self.job.topology.name, error=f"{type(exc).__name__}: {exc}")

    def restart_window(self) -> None:
        """Begin a new window of statistics now."""
        self._base, self._began = self._window(), self.clock()

    async def look(self) -> dict[str, Any] | None:
        """Close the window now, run the policies on it and carry out the first decision; returns it."""
        current, seconds = self._window(), self.clock() - self._began
        decision = None
        if "autoscale" in self.settings.policies:
            decision = await self._autoscale(self._base[0], current[0], seconds)
        if decision is None and "balance" in self.settings.policies:
            decision = await self._balance(self._base[1], current[1])
        if decision is None and "shed" in self.settings.policies:
            decision = self._shed(self._base[0], current[0], seconds)
        if decision is not None:
            decision = {"at": time.time(), **decision}
            self.job.decisions.append(decision)
            log.info("adaptation decision", job=self.job.topology.name, **decision)
            self._decided = self.clock()
        self.restart_window()
        return decision

    def _window(self) -> Window:
        statistics = {f"{s.node}.{s.index}": s.to_data() for s in self.job.instance_statistics()}
        if not statistics:
            return statistics, {}  # nothing runs (the job failed to start: its own error says why)
        loads = {task: self.job.segment_loads(task) for task in session_tasks(self.job.topology)}
        return statistics, loads

    async def _autoscale(
        self, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], seconds: float
    ) -> dict[str, Any] | None:
        from streamlet.backends.cluster.tree.layouts import unchangeable  # the cluster's rule, imported when used

        topology = self.job.topology
        edges = node_edges(topology)
        tasks = [name for name, node in topology.nodes.items() if node.kind == "task"]
        parallelism = {name: self.job.segment_table(name).instances for name in tasks}
        bounds = {
            name: self.settings.bounds.get(name, (1, topology.nodes[name].max_parallelism))
            for name in tasks
            if unchangeable(topology, name) is None
        }
        for scaling in ds2(edges, node_rates(windows(before, after, seconds)), parallelism, bounds):
            await self.job.rescale(scaling.task, scaling.instances)
            action = f"rescale {scaling.task} {scaling.current} -> {scaling.instances}"
            return {"policy": "autoscale", "action": action, "reason": scaling.reason}
        return None

    def _shed(
        self, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], seconds: float
    ) -> dict[str, Any] | None:
        topology = self.job.topology
        if topology.qos is None:
            return None
        edges = node_edges(topology)
        latency = window_latency(before, after, edges)
        shedding = decide(topology.qos, self.job.shed_ratio, latency, held_back(before, after, seconds))
        if shedding is None:
            return None
        self.job.shed(shedding.ratio)
        return {"policy": "shed", "action": f"shed {shedding.ratio:.0%} at the sources", "reason": shedding.reason}

    async def _balance(self, before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, Any] | None:
        for task, counts in after.items():
            earlier = before.get(task, [0] * len(counts))
            loads = [max(now - then, 0) for now, then in zip(counts, earlier, strict=True)]
            balancing = await balance_segments(self.job, task, loads)
            if balancing.moves:
                action = f"move {len(balancing.moves)} segments of {task}"
                return {"policy": "balance", "action": action, "reason": balancing.reason}
        return None


async def balance_segments(
    job: Job, task: str, loads: Sequence[int] | None = None, tolerance: float = DEFAULT_TOLERANCE
) -> Balancing:
    """Even out ``task``'s instances now: the session-table balancer on ``loads`` per segment (default: every
    record the task's ``SESSION_TABLE`` senders counted so far) and, when it finds moves, ``job.move_segments``.

    Returns the decision (``moves``, imbalance ``before`` and ``after``, ``reason``).
    """
    table = job.segment_table(task)
    if loads is not None and len(loads) != table.segments:
        raise JobError(f"task '{task}' has {table.segments} segments, but {len(loads)} segment loads were given")
    balancing = balance(job.segment_loads(task) if loads is None else loads, table.owners, table.instances, tolerance)
    if balancing.moves:
        await job.move_segments(task, balancing.table_moves())
    return balancing
