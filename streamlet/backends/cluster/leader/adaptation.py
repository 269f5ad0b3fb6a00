"""The adaptation loop: the leader reads the statistics the workers' heartbeats carry, runs the job's
policies (pure functions in ``adaptation``) and carries their decisions out with the live changes.

A job that names no policy runs under the default, ``spread``
(``settings.default_settings``); ``--adapt none`` runs none.

At every look (every :data:`TICK`) past the cooldown, for each RUNNING job
with no change under way or waiting:

- ``spread``: each instance's busy share since its part started (its counters
  are cumulative from 0 there), so the first heartbeat already tells; a task
  CPU-bound on a worker (``adaptation.spread``) gets its CPU hint recorded at
  once (``tree.hints``: the scheduler spreads it from the start the next time
  the topology is placed), and once that worker's part has run ``SETTLED``
  seconds one of its instances is migrated to a worker with idle CPU.

Every ``interval`` (the job's ``AdaptSettings``), for the same jobs:

- the window since the last look: each instance's counters now minus then
  (per worker, between two of its heartbeats), turned into rates;
- ``autoscale``: DS2 (``adaptation.autoscale``) says which task needs how many
  instances; the first such decision becomes a rescale request, as
  ``streamlet rescale`` would leave it;
- ``migrate``: an OVERLOADED worker (its heartbeat says so) hands its hottest
  instance to the least loaded worker (``adaptation.overload``);
- ``rebalance``: when a worker joined (or the job is uneven), the rebalance
  policy's first move becomes a migration request;
- ``balance``: for a task fed through ``SESSION_TABLE`` edges, the segment
  loads its senders counted in the window go to the session-table balancer
  (``adaptation.session_table``); its moves become one segment-move request;
- ``shed``: when nothing above decided (no capacity to add), the shed policy
  (``adaptation.shedding``) sets the share the sources shed under the job's
  QoS, in ``/jobs/<job>/shed``; every worker running a part applies it.

Each decision is written fenced on the leader's term (``election.LeaderFence``):
a deposed leader's never lands. It is recorded under ``/jobs/<job>/decisions/``
with its policy and reason (``jobs --json`` lists them) and logged. After one, the job is left
alone for ``cooldown`` seconds and its next window starts afresh, so that
rates measured across a change never drive the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import structlog

from streamlet.adaptation.autoscale import ds2, node_edges, node_rates, windows
from streamlet.adaptation.overload import hand_off
from streamlet.adaptation.rebalance import Migration
from streamlet.adaptation.session_table import balance, session_tasks
from streamlet.adaptation.settings import AdaptSettings, settings_of
from streamlet.adaptation.shedding import decide, held_back, window_latency
from streamlet.adaptation.spread import CPU_BOUND, SETTLED, CpuBound, cpu_bound, spread
from streamlet.backends.cluster.tree import hints, paths, rebalancing
from streamlet.backends.cluster.tree import layouts as reconfigure
from streamlet.backends.cluster.tree.election import LeaderFence
from streamlet.backends.cluster.tree.lifecycle import JobState, state_of
from streamlet.backends.cluster.tree.loads import live, live_loads
from streamlet.backends.cluster.tree.outline import Outlines
from streamlet.backends.cluster.tree.paths import CpuHint, ReconfigureRequest
from streamlet.backends.cluster.tree.registry import workers
from streamlet.backends.cluster.tree.signing import verify
from streamlet.backends.cluster.tree.store import ClusterStore, Create, SetData, read_all
from streamlet.core.model import world
from streamlet.core.model.qos import QoS
from streamlet.core.model.topology import Topology
from streamlet.errors import CoordinationError, ReconfigurationError

log = structlog.get_logger("streamlet")
TICK = 0.5  # seconds between looks at the jobs (each job's own interval decides when its window closes)
MEASURED = 0.25  # seconds of an instance's part it takes before the spread policy reads its busy share

Beats = dict[str, tuple[float, dict[str, dict[str, Any]]]]  # worker -> (beat time, its instances of one job)


@dataclass
class _Watch:
    """What the loop remembers of one job: where its current window began, and its last decision."""

    base: Beats
    began: float
    decided: float = float("-inf")


class AdaptationLoop:
    """Runs the job's policies while this master leads (``store``: its session; ``fence``: its term, which every
    decision's write checks)."""

    def __init__(
        self,
        store: ClusterStore,
        secret: bytes,
        fence: LeaderFence,
        clock: Callable[[], float] = world.wall_time,
        outlines: Outlines | None = None,
    ) -> None:
        self.store = store
        self.secret = secret
        self.fence = fence
        self.clock = clock
        self.outlines = Outlines(secret=secret) if outlines is None else outlines  # the leader's: each job built once
        self._watches: dict[str, _Watch] = {}
        self._burning = False  # some live worker burns CPU_BOUND of a core, as of this look's beats

    async def run(self) -> None:
        """Look every :data:`TICK` until cancelled (a failed look is logged; the next one tries again)."""
        while True:
            try:
                await self.tick()
            except (CoordinationError, ReconfigurationError) as exc:
                log.info("adaptation look skipped", reason=str(exc))
            except Exception as exc:  # noqa: BLE001 - a job's code that fails to load must not stop the loop
                log.warning("adaptation look failed", error=f"{type(exc).__name__}: {exc}")
            await anyio.sleep(TICK)

    async def tick(self) -> list[dict[str, Any]]:
        """Look at every job once; returns the decisions taken."""
        now = self.clock()
        beats = await self._beats(now)
        decisions = []
        for job in await self.store.children(paths.JOBS):
            decision = await self._look(job, beats, now)
            if decision is not None:
                decisions.append(decision)
        return decisions

    async def _beats(self, now: float) -> dict[str, tuple[float, dict[str, dict[str, Any]]]]:
        """Every live worker's last heartbeat: worker -> (its time, its instances' statistics)."""
        found = {}
        self._burning = False
        for view in live(await workers(self.store), now):
            load = view.load or {}
            found[view.worker_id] = (float(load.get("ts", 0.0)), dict(load.get("instances") or {}))
            self._burning |= float(load.get("cpu_share", 0.0)) >= CPU_BOUND
        return found

    async def _look(self, job: str, beats: dict[str, tuple[float, dict[str, dict[str, Any]]]], now: float) -> Any:
        found = await self.store.get(paths.spec(job))
        spec = None if found is None else found.data
        settings = None if spec is None else settings_of(spec.get("adapt"))
        state = await self.store.get(paths.state(job))
        if spec is None or settings is None or state is None or state_of(state.data) != JobState.RUNNING:
            self._watches.pop(job, None)
            return None
        if settings.policies == {"spread"} and not self._burning:
            self._watches.pop(job, None)  # no process burns a core: nothing to spread, nothing more to read
            return None
        if await self.store.get(paths.reconfigure_request(job)) is not None:
            return None  # one change at a time: a request waits already
        current = _job_beats(job, beats)
        watch = self._watches.get(job)
        if watch is None or now - watch.decided < settings.cooldown:
            if watch is None or watch.base != current:
                decided = float("-inf") if watch is None else watch.decided
                self._watches[job] = _Watch(current, now, decided)  # the window starts after the cooldown
            return None
        if now - watch.began < settings.interval and "spread" not in settings.policies:
            return None
        signed = verify(job, spec, self.secret)  # before any of its code runs anywhere
        shape = await self.outlines.build(signed)  # in a process of its own, once (or the leader's build)
        if isinstance(shape, str):
            return None  # it cannot run: the leader fails it
        layout = await self._layout(job)
        topology = reconfigure.with_layout(shape, layout)
        decision = None
        if "spread" in settings.policies:  # at every look: the sooner a CPU-bound task spreads, the more it pays
            decision = await self._spread(job, topology.name, current, now)
        if decision is None and now - watch.began < settings.interval:
            return None
        if decision is None:
            decision = await self._decide(job, topology, layout, settings, watch.base, current, now)
        self._watches[job] = _Watch(current, now, now if decision is not None else watch.decided)
        return decision

    async def _layout(self, job: str) -> Any:
        found = await self.store.get(paths.layout(job))
        return None if found is None else found.data

    async def _decide(
        self,
        job: str,
        topology: Topology,
        layout: Any,
        settings: AdaptSettings,
        base: Beats,
        current: Beats,
        now: float,
    ) -> dict[str, Any] | None:
        if "autoscale" in settings.policies:
            decision = await self._autoscale(job, topology, settings, base, current)
            if decision is not None:
                return decision
        if "balance" in settings.policies:
            decision = await self._balance(job, topology, layout, base, current)
            if decision is not None:
                return decision
        if "migrate" in settings.policies:
            decision = await self._hand_off(job, base, current, now)
            if decision is not None:
                return decision
        if "rebalance" in settings.policies:
            moves = await rebalancing.planned_moves(self.store, job, now)
            if moves:
                move = moves[0]
                reason = f"{move.instance}: {move.source} holds most of the job's instances, {move.target} fewest"
                return await self._migrate(job, "rebalance", move, reason)
        if "shed" in settings.policies and topology.qos is not None:  # the last resort: nothing else helped
            return await self._shed(job, topology, topology.qos, base, current)
        return None

    async def _autoscale(
        self, job: str, topology: Topology, settings: AdaptSettings, base: Beats, current: Beats
    ) -> dict[str, Any] | None:
        observed = []
        for worker, (at, snapshots) in current.items():
            before = base.get(worker)
            if before is not None:
                observed.extend(windows(before[1], snapshots, at - before[0]))
        edges = node_edges(topology)
        parallelism = {name: node.parallelism for name, node in topology.nodes.items() if node.kind == "task"}
        bounds = {
            name: settings.bounds.get(name, (1, topology.nodes[name].max_parallelism))
            for name in parallelism
            if reconfigure.unchangeable(topology, name) is None
        }
        room = sum(max(load.capacity - load.used, 0) for load in await live_loads(self.store, self.clock()))
        for scaling in ds2(edges, node_rates(observed), parallelism, bounds):
            instances = min(scaling.instances, scaling.current + room)  # what the workers can take
            if instances == scaling.current:
                continue
            request = reconfigure.request_node(scaling.task, instances, by="autoscale")
            action = f"rescale {scaling.task} {scaling.current} -> {instances}"
            return await self._carry_out(job, "autoscale", request, action, scaling.reason)
        return None

    async def _hand_off(self, job: str, base: Beats, current: Beats, now: float) -> dict[str, Any] | None:
        views = live(await workers(self.store), now)
        overloaded = {view.worker_id for view in views if (view.load or {}).get("overloaded")}
        if not overloaded:
            return None
        cpu = {view.worker_id: float((view.load or {}).get("cpu_share", 0.0)) for view in views}
        busy = {}
        for worker, (at, snapshots) in current.items():
            before = base.get(worker)
            for window in [] if before is None else windows(before[1], snapshots, at - before[0]):
                busy[f"{window.node}.{window.index}"] = window.busy / window.seconds
        found = await rebalancing.situation(self.store, job, now)
        handing = hand_off(cpu, overloaded, found.placed, busy, found.room, found.movable, found.may_run)
        if handing is None:
            return None
        return await self._migrate(job, "migrate", handing.migration, handing.reason)

    async def _spread(self, job: str, topology: str, current: Beats, now: float) -> dict[str, Any] | None:
        """The spread policy on each instance's busy share since its part started: a CPU-bound task's hint is
        recorded at once, and one of its instances migrated once its worker's part has run ``SETTLED``."""
        views = live(await workers(self.store), now)
        cpu = {view.worker_id: float((view.load or {}).get("cpu_share", 0.0)) for view in views}
        if max(cpu.values(), default=0.0) < CPU_BOUND:
            return None  # no process burns a core: nothing is CPU-bound (the usual case, read in one look)
        busy, ages = await self._since_start(job, current)
        beating = {name: worker for worker, (_, snapshots) in current.items() for name in snapshots}
        findings = cpu_bound(beating, busy, cpu, lambda instance: True)  # the beats alone: a cheap first look
        if not findings:
            return None
        await self._hint(topology, job, findings, now)
        if all(ages.get(finding.worker, 0.0) < SETTLED for finding in findings):
            return None  # too young to pay for a move: the hint spreads the next placement
        found = await rebalancing.situation(self.store, job, now)
        settled = [worker for worker, age in ages.items() if age >= SETTLED]
        spreading = spread(found.placed, busy, cpu, found.room, found.movable, found.may_run, settled.__contains__)
        if spreading is None:
            return None
        return await self._migrate(job, "spread", spreading.migration, spreading.reason)

    async def _hint(self, topology: str, job: str, findings: list[CpuBound], now: float) -> None:
        """Record the CPU hint of each task found CPU-bound that has none yet (fenced; logged)."""
        known = await hints.cpu_bound_tasks(self.store, topology)
        for finding in findings:
            if finding.task in known:
                continue
            hint: CpuHint = {"cpu": round(finding.cpu, 3), "at": now, "job": job}
            if await self.fence.commit([await hints.hint_step(self.store, topology, finding.task, hint)]):
                known.add(finding.task)
                reason = f"its {len(finding.instances)} instances on {finding.worker} take {finding.cpu:.0%} of a core"
                log.info("cpu hint recorded", job=job, topology=topology, task=finding.task, reason=reason)

    async def _since_start(self, job: str, current: Beats) -> tuple[dict[str, float], dict[str, float]]:
        """Instance -> its busy share of the time since its worker's part of the attempt started (counters are
        cumulative from there; an instance a live change added later is under-counted, never over), and
        worker -> how long its part has run (as of its beat)."""
        assignment = await self.store.get(paths.assignment(job))
        if assignment is None:
            return {}, {}
        started = await read_all(self.store, paths.started(job, int(assignment.data["attempt"])))
        busy, ages = {}, {}
        for worker, (at, snapshots) in current.items():
            ages[worker] = at - float((started.get(worker) or {}).get("at", at))
            if ages[worker] < MEASURED:
                continue  # too little measured yet: the next beat tells
            for name, snapshot in snapshots.items():
                busy[name] = float(snapshot["busy"]) / ages[worker]
        return busy, ages

    async def _migrate(self, job: str, policy: str, move: Migration, reason: str) -> dict[str, Any] | None:
        request = reconfigure.request_node(paths.task_of(move.instance), migrate=(move.index, move.target), by=policy)
        return await self._carry_out(job, policy, request, f"migrate {move.instance} to {move.target}", reason)

    async def _balance(
        self, job: str, topology: Topology, layout: Any, base: Beats, current: Beats
    ) -> dict[str, Any] | None:
        for task in session_tasks(topology):
            table = reconfigure.table_of(topology, layout, task)
            loads = window_segment_loads(base, current, task, table.segments)
            balancing = balance(loads, table.owners, table.instances)
            if balancing.moves:
                request = reconfigure.request_node(task, moves=balancing.table_moves(), by="balance")
                action = f"move {len(balancing.moves)} segments of {task}"
                return await self._carry_out(job, "balance", request, action, balancing.reason)
        return None

    async def _shed(self, job: str, topology: Topology, qos: QoS, base: Beats, current: Beats) -> dict[str, Any] | None:
        found = await self.store.get(paths.shedding(job))
        now_shedding = 0.0 if found is None else float(found.data["ratio"])
        edges = node_edges(topology)
        everything_before: dict[str, dict[str, Any]] = {}
        everything_now: dict[str, dict[str, Any]] = {}
        blocked = 0.0
        for worker, (at, snapshots) in current.items():
            before = base.get(worker)
            if before is not None:
                everything_before.update(before[1])
                everything_now.update(snapshots)
                blocked = max(blocked, held_back(before[1], snapshots, at - before[0]))
        latency = window_latency(everything_before, everything_now, edges)  # a path may cross workers
        shedding = decide(qos, now_shedding, latency, blocked)
        if shedding is None:
            return None
        data = {"ratio": shedding.ratio, "at": self.clock()}
        path = paths.shedding(job)
        if not await self.fence.commit([Create(path, data) if found is None else SetData(path, data, found.version)]):
            return None  # another write got there first, or this leader was deposed
        return await self._record(job, "shed", f"shed {shedding.ratio:.0%} at the sources", shedding.reason)

    async def _carry_out(
        self, job: str, policy: str, request: ReconfigureRequest, action: str, reason: str
    ) -> dict[str, Any] | None:
        """Leave the request for the leader and record the decision (nothing, if a request got there first or
        this leader was deposed)."""
        if not await self.fence.commit([Create(paths.reconfigure_request(job), request)]):
            return None
        return await self._record(job, policy, action, reason)

    async def _record(self, job: str, policy: str, action: str, reason: str) -> dict[str, Any]:
        """Keep the decision under the job's decisions, and log it."""
        decision = {"at": self.clock(), "policy": policy, "action": action, "reason": reason}
        await self.store.ensure(paths.decisions(job))
        await self.store.create(paths.decision_prefix(job), decision, sequence=True)
        log.info("adaptation decision", job=job, **decision)
        return {"job": job, **decision}


def window_segment_loads(base: Beats, current: Beats, task: str, segments: int) -> list[int]:
    """Records sent into each of ``task``'s segments between two sets of beats, over every sender instance
    present in both (a sender added or retired meanwhile is left out, as for rates)."""
    totals = [0] * segments
    for worker, (_, snapshots) in current.items():
        before = base.get(worker, (0.0, {}))[1]
        for name, now in snapshots.items():
            then = before.get(name)
            counts, earlier = (now.get("segments") or {}).get(task), (then or {}).get("segments", {}).get(task)
            if counts is None or earlier is None or len(counts) != segments:
                continue
            for segment in range(segments):
                totals[segment] += max(int(counts[segment]) - int(earlier[segment]), 0)
    return totals


def _job_beats(job: str, beats: dict[str, tuple[float, dict[str, dict[str, Any]]]]) -> Beats:
    """Each worker's beat time and its statistics of ``job``'s instances (``"node.index"`` -> snapshot)."""
    prefix = f"{job}/"
    found: Beats = {}
    for worker, (at, instances) in beats.items():
        mine = {name.removeprefix(prefix): data for name, data in instances.items() if name.startswith(prefix)}
        if mine:
            found[worker] = (at, mine)
    return found
