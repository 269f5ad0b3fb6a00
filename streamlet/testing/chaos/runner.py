"""One seeded run: start the cluster, submit the workload, inject the faults, heal, wait, check.

:func:`run_once` is the whole of a run and returns a :class:`RunResult`: the
trace hash (the same seed gives the same hash, event for event), the faults
injected, how the job ended and every violation the checker found.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import structlog.testing

import streamlet.testing.chaos.checker as checker
from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.simulated import targets
from streamlet.backends.cluster.simulated.cluster import ExactlyOnceSink
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.core.model import world
from streamlet.core.model.record import Record
from streamlet.core.model.topology import Topology
from streamlet.errors import SimulationStalled
from streamlet.testing.chaos.faults import CRASH_POINTS, KINDS, Fault, schedule
from streamlet.testing.chaos.harness import ChaosCluster, ClusterShape
from streamlet.testing.chaos.network import STORE
from streamlet.testing.chaos.parties import PARTY
from streamlet.testing.chaos.steering import ask_migration, ask_rescale, set_shed_ratio, take_savepoint
from streamlet.testing.chaos.workloads import PacedSource, Workload

JOB = "chaos"
FINISH_BOUND = 120.0  # virtual seconds the job has to finish once the last fault healed
TEAR_DOWN_SECONDS = 60.0  # virtual seconds the run's tasks have to end once cancelled
SETTLE_STEP = 0.25  # virtual seconds between the harness's looks at the job


@dataclass
class RunResult:
    """What one run did and what the checker found."""

    seed: int
    workload: str
    trace_hash: str
    faults: list[Fault]
    state: str
    reason: str
    violations: list[str]
    virtual_seconds: float
    committed: int
    records_in: int = 0  # the records its sources read (the input, once)
    changes_done: int = 0  # live changes that completed (rescales, migrations)
    savepoints: int = 0  # savepoints written
    trace_tail: list[str] = field(default_factory=list)

    def to_data(self) -> dict[str, Any]:
        """As JSON (one entry of the chaos command's report)."""
        return {
            "seed": self.seed, "workload": self.workload, "trace_hash": self.trace_hash,
            "faults": [fault.to_data() for fault in self.faults], "state": self.state, "reason": self.reason,
            "violations": self.violations, "virtual_seconds": round(self.virtual_seconds, 3),
            "committed": self.committed, "records_in": self.records_in, "changes_done": self.changes_done,
            "savepoints": self.savepoints,
        }  # fmt: skip


def with_chaos_io(topology: Topology, workload: Workload) -> Topology:
    """``topology`` with its named sources paced over ``workload.inputs`` and every sink exactly-once."""
    from streamlet.testing import replaced_io

    def source(items: list[Any]) -> PacedSource:
        return PacedSource(items, workload.per_read, workload.every)

    return replaced_io(topology, {name: source(items) for name, items in workload.inputs.items()}, ExactlyOnceSink)


@dataclass
class _Observer:
    """What the harness sees in the store as it happens: the job's states, the workers' moves, leadership,
    and the crash points armed."""

    cluster: ChaosCluster
    job_states: list[tuple[str, str]] = field(default_factory=list)
    ended_at: float | None = None
    worker_states: dict[str, list[str | None]] = field(default_factory=dict)
    leadership: checker.LeadershipWatch = field(default_factory=checker.LeadershipWatch)
    armed: list[tuple[str, Callable[[], None]]] = field(default_factory=list)  # (point, what to do)

    def __call__(self, path: str, raw: bytes | None) -> None:
        data = json.loads(raw) if raw else None
        party = PARTY.get()
        if path == paths.LEADER:
            self.leadership.leader_node(data)
        elif path.startswith(paths.WORKERS + "/") and path.count("/") == 2:
            worker = path.rsplit("/", 1)[1]
            self.worker_states.setdefault(worker, []).append(None if data is None else data.get("zk_state"))
        led = path.startswith(paths.JOBS + "/")  # what a master writes there, only the leader may
        if led and party is not None and data is not None and party.name.startswith("master-"):
            self.leadership.leader_write(party.name, path)
        if path == paths.state(JOB) and data is not None:
            self.job_states.append((str(data["state"]), str(data.get("reason", ""))))
            if JobState(data["state"]).ended and self.ended_at is None:
                self.ended_at = self.cluster.loop.time()
        point = _crash_point(path, data)
        if point is not None:
            for armed in [entry for entry in self.armed if entry[0] == point]:
                self.armed.remove(armed)
                armed[1]()


def _crash_point(path: str, data: Any) -> str | None:
    if data is None:
        return None
    if path.startswith(paths.checkpoints(JOB) + "/attempt-") and path.endswith("/trigger"):
        return "savepoint" if data.get("export") else "checkpoint"
    if path == paths.completed(JOB):
        return "commit"
    if path.startswith(paths.reconfigurations(JOB) + "/"):
        return "change"
    return None


def expected_output(workload: Workload) -> dict[str, list[Record]]:
    """The workload's topology run in-process on the same input: what every sink must commit."""
    from streamlet.testing import run_topology

    with structlog.testing.capture_logs():  # a dead-lettered record is the workload's, not news
        return run_topology(workload.build(), {name: list(items) for name, items in workload.inputs.items()})


def run_once(
    seed: int,
    workload: Workload,
    *,
    kinds: tuple[str, ...] = KINDS,
    expected: dict[str, list[Record]] | None = None,
    shape: ClusterShape | None = None,
    faults: list[Fault] | None = None,
) -> RunResult:
    """Run ``workload`` on a simulated cluster under the faults ``seed`` draws (or ``faults``); check it."""
    shape = shape or ClusterShape()
    expected = expected_output(workload) if expected is None else expected
    with tempfile.TemporaryDirectory(prefix="streamlet-chaos-") as folder:
        cluster = ChaosCluster.make(seed, shape, Path(folder))
        drawn = faults if faults is not None else schedule(seed, cluster.masters, cluster.workers, kinds=kinds)
        observer = _Observer(cluster)
        cluster.tree.listener = observer
        reference = targets.register(partial(_job_topology, workload), token=f"chaos_{seed}")
        outcome: dict[str, Any] = {}
        try:
            with world.using(cluster.world()), structlog.testing.capture_logs():
                cluster.loop.run_until_complete(_drive(cluster, workload, drawn, observer, reference, outcome))
        except SimulationStalled as exc:
            outcome["stalled"] = str(exc)
        finally:
            outcome["virtual_seconds"] = cluster.loop.time()
            outcome["trace_hash"] = cluster.trace.hash()
            targets.forget(reference)
            committed = ExactlyOnceSink.committed(f"{cluster.name}.{JOB}")
            ExactlyOnceSink.forget(f"{cluster.name}.{JOB}")
            _tear_down(cluster)
        return _judge(seed, workload, cluster, drawn, observer, outcome, expected, committed)


def _job_topology(workload: Workload) -> Topology:
    return with_chaos_io(workload.build(), workload)


async def _drive(
    cluster: ChaosCluster,
    workload: Workload,
    faults: list[Fault],
    observer: _Observer,
    reference: str,
    outcome: dict[str, Any],
) -> None:
    loop = cluster.loop
    client = cluster.client_session()
    cluster.start_all()
    while not await _cluster_up(client, len(cluster.workers)):  # noqa: ASYNC110 - a client's look, virtual time
        await asyncio.sleep(SETTLE_STEP)
    interval = workload.checkpoint_interval
    checkpoint: dict[str, Any] | None = None if interval is None else {"interval": interval, "replicas": None}
    spec = job_commands.new_spec(reference, {}, checkpoint, None)
    await job_commands.submit(client, JOB, spec, cluster.secret)
    began = loop.time()
    timeline = _timeline(cluster, faults, observer, client)
    if workload.rescale is not None:
        at = cluster.rng.uniform(1.0, 8.0)
        timeline.append((at, partial(ask_rescale, client, JOB, *workload.rescale)))
        if workload.add_worker:  # it joins a second before: the rescale puts the new instance on it
            timeline.append((at - 1.0, cluster.add_worker))
    if workload.migrate is not None:
        at = cluster.rng.uniform(1.0, 8.0)
        timeline.append((at, partial(ask_migration, client, JOB, workload.migrate, cluster.rng)))
    if workload.shed is not None:
        ratio, seconds = workload.shed
        at = cluster.rng.uniform(1.0, 6.0)
        shed = partial(set_shed_ratio, client, JOB)
        timeline += [(at, partial(shed, ratio)), (at + seconds, partial(shed, 0.0))]
    timeline.sort(key=lambda entry: entry[0])
    for at, action in timeline:
        await asyncio.sleep(max(0.0, began + at - loop.time()))
        result = action()
        if asyncio.iscoroutine(result):
            await result
    healed = loop.time()
    outcome["healed_at"] = healed
    while observer.ended_at is None and loop.time() < healed + FINISH_BOUND:  # noqa: ASYNC110 - virtual time
        await asyncio.sleep(SETTLE_STEP)


async def _cluster_up(client: Any, workers: int) -> bool:
    """Every worker registered and a master leading."""
    return len(await client.children(paths.WORKERS)) >= workers and await client.get(paths.LEADER) is not None


def _timeline(cluster: ChaosCluster, faults: list[Fault], observer: _Observer, client: Any) -> list[tuple[float, Any]]:
    """Each fault as its start and its end (restart, resume, heal), at seconds from the submit."""
    timeline: list[tuple[float, Any]] = []
    for fault in faults:
        target, other, end = fault.target, fault.other, fault.at + fault.lasts
        if fault.kind == "kill":
            timeline += [(fault.at, partial(cluster.kill, target)), (end, partial(cluster.restart, target))]
        elif fault.kind == "disk":
            timeline += [(fault.at, partial(cluster.kill, target))]
            timeline += [(end, partial(cluster.restart, target, lose_disk=True))]
        elif fault.kind == "pause":
            timeline += [(fault.at, partial(cluster.pause, target)), (end, partial(cluster.resume, target))]
        elif fault.kind == "partition":
            assert other is not None
            timeline += [(fault.at, partial(cluster.partition, target, other))]
            timeline += [(end, partial(cluster.heal, target, other))]
        elif fault.kind == "isolate":
            timeline += [(fault.at, partial(cluster.partition, target, STORE))]
            timeline += [(end, partial(cluster.heal, target, STORE))]
        elif fault.kind == "slow":
            timeline += [(fault.at, partial(cluster.slow, target, 20.0)), (end, partial(cluster.slow, target, 1.0))]
        elif fault.kind == "expire":
            timeline += [(fault.at, partial(cluster.expire, target))]
        elif fault.kind == "pause-commit":
            timeline += [(fault.at, partial(_pause_at_next_commit, cluster, observer, fault.lasts))]
        elif fault.kind in CRASH_POINTS:
            crash = partial(_crash, cluster, target, fault.lasts)
            timeline += [(fault.at, partial(observer.armed.append, (CRASH_POINTS[fault.kind], crash)))]
            if fault.kind == "crash-savepoint":  # a client asks for one then, in the background: it may wait
                timeline += [(fault.at, partial(_savepoint_later, cluster, client))]
    return timeline


def _savepoint_later(cluster: ChaosCluster, client: Any) -> None:
    """Start taking a savepoint (``streamlet savepoint``); the timeline goes on meanwhile."""
    folder = cluster.folder / "savepoints" / f"{len(cluster.savepoints)}"
    folder.mkdir(parents=True)
    taking = take_savepoint(client, JOB, folder, cluster.secret, cluster.trace)
    cluster.savepoints.append(asyncio.ensure_future(taking))


def _pause_at_next_commit(cluster: ChaosCluster, observer: _Observer, lasts: float) -> None:
    """Arm the leading master's session: its next commit stops it mid-request for ``lasts`` seconds."""
    leader = observer.leadership.leader
    process = cluster.processes.get(leader or "")
    if process is None or process.party.dead:
        return
    cluster.trace.add(f"pause at next commit armed: {leader}")

    def hold() -> None:
        cluster.pause(process.name)
        cluster.later(cluster.loop.time() + lasts, cluster.resume, process.name)

    process.session.hold_next_commit = hold


def _crash(cluster: ChaosCluster, target: str, lasts: float) -> None:
    """Kill ``target`` now (a crash point fired) and start it again ``lasts`` seconds later."""
    if target in cluster.down:
        return
    cluster.trace.add(f"crash point reached: {target}")
    cluster.kill(target)
    cluster.later(cluster.loop.time() + lasts, cluster.restart, target)


def _tear_down(cluster: ChaosCluster) -> None:
    """Stop every task of the run (dead and paused parties' too: they run again first) and close the loop."""
    loop = cluster.loop
    for process in cluster.processes.values():
        process.party.bury(loop)
    for party in cluster.buried:
        party.bury(loop)
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        with contextlib.suppress(SimulationStalled, RuntimeError):
            loop.run_until_complete(asyncio.wait(tasks, timeout=TEAR_DOWN_SECONDS))
    loop.close()


def _judge(
    seed: int,
    workload: Workload,
    cluster: ChaosCluster,
    faults: list[Fault],
    observer: _Observer,
    outcome: dict[str, Any],
    expected: dict[str, list[Record]],
    committed: dict[str, list[Record]],
) -> RunResult:
    state, reason = observer.job_states[-1] if observer.job_states else ("NONE", "never submitted")
    violations: list[str] = []
    if "stalled" in outcome:
        violations.append(f"the simulation stalled: {outcome['stalled']}")
    violations += checker.illegal_job_moves([state for state, _ in observer.job_states])
    for worker, moves in sorted(observer.worker_states.items()):
        violations += checker.illegal_worker_moves(worker, moves)
    violations += observer.leadership.problems
    healed = float(outcome.get("healed_at", cluster.loop.time()))
    violations += checker.liveness((state, reason), healed, observer.ended_at, FINISH_BOUND)
    violations += checker.compare_outputs(expected, committed, finished=state == JobState.FINISHED.value)
    return RunResult(
        seed=seed, workload=workload.name, trace_hash=outcome["trace_hash"], faults=faults, state=state,
        reason=reason, violations=violations, virtual_seconds=outcome["virtual_seconds"],
        committed=sum(map(len, committed.values())), trace_tail=list(cluster.trace.lines[-60:]),
        records_in=sum(map(len, workload.inputs.values())),
        changes_done=sum(1 for _, why in observer.job_states if why.startswith("change ") and " done: " in why),
        savepoints=sum(map(_written, cluster.savepoints)),
    )  # fmt: skip


def _written(taken: asyncio.Future[bool]) -> bool:
    """A savepoint the run asked for was written (not refused, not still waiting when the run ended)."""
    return taken.done() and not taken.cancelled() and taken.exception() is None and taken.result()
