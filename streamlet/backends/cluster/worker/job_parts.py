"""A worker's part of the cluster's jobs: follow assignments and job states, run the local instances, report.

Every poll the worker reads each job's assignment and state. A new attempt
that names this worker (from a leader at least as new as any it has seen)
starts its part: the spec's signature is checked before any of its code is
imported, the part is built, ``/jobs/<job>/started/<attempt>/<me>`` says so,
and when it ends the outcome goes to ``/jobs/<job>/done/<attempt>/<me>`` in
a transaction fenced on the assignment's version. A job whose state has
ended (KILLED, FAILED) or whose attempt was replaced is stopped at once.
A live change of a running attempt that puts an instance on this worker
while it runs no part of it makes it join the attempt (``joining``).
Assignments, joins and live changes carry the epoch of the leader that
wrote them: one older than the newest this worker has seen is ignored (a
live change's refusal is reported, so the leader does not wait for it).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from streamlet import job_code
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import EpochFence
from streamlet.backends.cluster.tree.jobs import topology_of
from streamlet.backends.cluster.tree.layouts import placed_instances, with_layout
from streamlet.backends.cluster.tree.lifecycle import state_of, worker_states
from streamlet.backends.cluster.tree.paths import Assignment, Reconfiguration, instance_id
from streamlet.backends.cluster.tree.registry import WorkerRegistration, workers
from streamlet.backends.cluster.tree.reports import dead_letters_report
from streamlet.backends.cluster.tree.signing import verify
from streamlet.backends.cluster.tree.store import ClusterStore, riding_out, write_fenced
from streamlet.backends.cluster.worker.checkpoint_agreement import AttemptInfo, RestoreScope, ZkAgreement
from streamlet.backends.cluster.worker.handoff import ClusterHandoff
from streamlet.backends.cluster.worker.joining import (
    attempt_workers,
    change_to_join,
    incarnations_of,
    joined_workers,
    tables_of,
)
from streamlet.backends.cluster.worker.part_replicator import PartReplicator, acknowledge_stored
from streamlet.backends.cluster.worker.replica_service import ReplicaService
from streamlet.backends.cluster.worker.termination import ClusterQuiescence, LoopAttempt
from streamlet.core.model import world
from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.channel import LocalChannel
from streamlet.core.runtime.clock import SystemClock
from streamlet.core.runtime.job import Job, JobResult
from streamlet.core.runtime.plan import Placement
from streamlet.core.runtime.reconfiguration import ReconfigurationPlan
from streamlet.core.state.rocks import backend_from
from streamlet.errors import (
    CoordinationError,
    JobError,
    NodeExists,
    PartLost,
    PeerUnreachable,
    SpecError,
    TaskError,
    UnusableCheckpoint,
    described,
    underlying,
)
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpChannel, TcpClient

log = structlog.get_logger("streamlet")
POLL = 0.2
SWEEP = 5.0  # seconds between sweeps of superseded checkpoint files
MAX_REPORT_BYTES = 1_000_000  # ZooKeeper's jute.maxbuffer is 1 MiB for the whole request: leave it some room


@dataclass(eq=False)
class JobPart:
    """This worker's part of one attempt of a job: everything kept for it, dropped together when it ends."""

    job: str
    attempt: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # cancelled: the part stops
    topology: Topology | None = None  # as this worker loaded it, with the parallelism live changes gave it
    placement: dict[str, str] = field(default_factory=dict)  # instance -> worker (live changes add to it)
    run: str = ""  # this attempt of this submission: names its channels and its sinks' staging
    addresses: dict[str, tuple[str, int]] = field(default_factory=dict)  # worker -> data-plane address
    agreement: ZkAgreement | None = None  # its share of the checkpoints, when the job keeps them
    built: Job | None = None  # its instances, once they exist

    def restartable(self, task: str) -> bool:
        """Whether a crash of ``task`` may be retried elsewhere (its error policy is ``restart``)."""
        return self.topology is not None and self.topology.nodes[task].on_error == "restart"


class WorkerJobs:
    """Starts this worker's share of every assigned job, once, and reports how it ended."""

    def __init__(
        self,
        zk: ClusterStore,
        registration: WorkerRegistration,
        server: DataServer,
        client: TcpClient,
        secret: bytes,
        state_dir: Path,
        on_part_built: Callable[[tuple[str, int], Job], None] | None = None,
    ) -> None:
        """``on_part_built(key, job)``: told of each job part (job name, attempt) as soon as it is built, before
        it runs (a test harness arms its kill points there)."""
        self.zk = zk
        self.on_part_built = on_part_built
        self.secret = secret
        self.replicas = ReplicaService(state_dir, registration.worker_id, server, client)
        self.state_dir = state_dir
        self.replicas.on_stored = partial(acknowledge_stored, zk, registration.worker_id)
        self.registration = registration
        self.me = registration.worker_id
        self.server = server
        self.client = client
        self.fence = EpochFence()
        self.seen: dict[str, tuple[str, int]] = {}  # job -> (its uid, the attempt last looked at)
        self.parts: dict[tuple[str, int], JobPart] = {}  # (job, attempt) -> this worker's part, while it runs
        self.ended: set[str] = set()  # uids of jobs whose state ended: stop, report nothing more
        self.code: dict[str, tuple[str, str | None]] = {}  # job -> its target and code digest, forgotten at its end
        self.changes: set[tuple[str, int, str]] = set()  # live changes taken up: (job, attempt, id)

    @property
    def running(self) -> list[tuple[str, int]]:
        """The (job, attempt) of every part running here."""
        return list(self.parts)

    def _built(self) -> list[tuple[JobPart, Job]]:
        """The parts whose instances exist, each with its job."""
        return [(part, part.built) for part in self.parts.values() if part.built is not None]

    async def run(self, next_look: Callable[[], Awaitable[None]] | None = None) -> None:
        """Look at the jobs (:meth:`poll`) until cancelled: again every ``POLL`` seconds, or whenever
        ``next_look()`` returns (a harness that knows when the tree changed); serve other workers' checkpoint
        replicas and sweep superseded checkpoint files meanwhile."""
        async with anyio.create_task_group() as group:
            group.start_soon(self.replicas.run)  # other workers' checkpoint replicas, and fetches of them
            group.start_soon(self._sweep_files)
            while True:
                try:
                    await self.poll(group)
                except CoordinationError as exc:  # suspended or expired: kazoo reconnects, the next poll retries
                    log.debug("job poll skipped", worker=self.me, reason=str(exc))
                await (anyio.sleep(POLL) if next_look is None else next_look())

    async def poll(self, group: anyio.abc.TaskGroup) -> None:
        """Look once at every job: start this worker's part of a new attempt (in ``group``), stop parts of
        ended jobs or outdated attempts, take up live changes and shedding. :meth:`run` calls it every
        ``POLL`` seconds; a harness may call it whenever the tree changed."""
        for job in await self.zk.children(paths.JOBS):
            found, header = await self.zk.get(paths.assignment(job)), await self.zk.get(paths.job(job))
            if found is None or header is None:
                continue
            assignment, version = found
            uid, attempt = str((header[0] or {}).get("uid", "")), int(assignment["attempt"])
            self._stop_outdated(job, attempt)
            new_attempt = self.seen.get(job) != (uid, attempt)
            # only jobs this worker runs, or may start now, are worth asking about (ended ones are not)
            if (new_attempt or any(running == job for running, _ in self.parts)) and await self._ended(job, uid):
                self._cancel(job)
                continue
            if not new_attempt:
                await self._join_running(job, uid, found.data, found.version, group)
                continue
            self.seen[job] = (uid, attempt)
            if not self.fence.accept(int(assignment["epoch"])):
                log.warning("ignoring an assignment from a deposed leader", job=job, epoch=assignment["epoch"])
                continue
            instances: dict[str, str] = assignment["instances"]
            boot = assignment.get("boots", {}).get(self.me)
            if boot is not None and boot != self.registration.boot:
                continue  # given to this worker's previous process: the leader starts another attempt
            if self.me in instances.values():
                group.start_soon(self._run_job, job, attempt, version, assignment)
        for part, _ in self._built():
            job, attempt = part.job, part.attempt
            await self._take_up_changes(job, attempt, group)
            await self._follow_shedding(job, attempt)

    async def _sweep_files(self) -> None:
        """Every ``SWEEP`` seconds: delete the checkpoint files (own parts, replicas) no restore can need any
        more: those older than the job's last complete checkpoint and the one before it, older attempts'
        parts, and everything of jobs that ended or are gone."""
        while True:
            await anyio.sleep(SWEEP)
            for key in self.replicas.jobs():
                try:
                    job, _, uid = key.rpartition(".")
                    keep = await files_to_keep(self.zk, job, uid)
                    removed = await world.blocking(self.replicas.sweep, key, keep)
                except CoordinationError:
                    continue  # ZooKeeper away: sweep next time, never on a guess
                except Exception as exc:  # noqa: BLE001 - a stray file must not stop the worker: said, and left
                    log.warning("sweeping checkpoint files failed", folder=key, error=f"{type(exc).__name__}: {exc}")
                    continue
                if removed:
                    log.debug("superseded checkpoint files deleted", job=job, files=removed, worker=self.me)

    async def _join_running(
        self, job: str, uid: str, assignment: Assignment, version: int, group: anyio.abc.TaskGroup
    ) -> None:
        """Join the running attempt when a live change puts an instance on this worker (see ``joining``)."""
        attempt = int(assignment["attempt"])
        if (job, attempt) in self.parts or uid in self.ended:
            return
        state = await self.zk.get(paths.state(job))
        if state is None:
            return
        if state_of(state.data).ended:
            self.ended.add(uid)  # final: never asked again
            return
        change = await change_to_join(self.zk, job, attempt, self.me, state.data)
        if change is None or (job, attempt, paths.change_name(int(change["id"]))) in self.changes:
            return
        if not self.fence.accept(int(change["epoch"])):
            log.warning("ignoring a live change from a deposed leader", job=job, epoch=change["epoch"])
            return
        self.changes.add((job, attempt, paths.change_name(int(change["id"]))))  # carried out by the part itself
        log.info("joining a running job", job=job, attempt=attempt, change=change["id"], worker=self.me)
        group.start_soon(self._run_job, job, attempt, version, assignment, change)

    async def _take_up_changes(self, job: str, attempt: int, group: anyio.abc.TaskGroup) -> None:
        """Start this worker's part of every live change of a job part running here (``reconfigure``)."""
        for name in await self.zk.children(paths.reconfigurations(job)):
            if (job, attempt, name) in self.changes:
                continue
            found = await self.zk.get(paths.change(job, name))
            if found is None:
                continue
            self.changes.add((job, attempt, name))
            change: Reconfiguration = found.data
            if int(change["attempt"]) != attempt or self.me not in change["workers"]:
                continue  # another attempt's, or one from before this worker joined the attempt
            if not self.fence.accept(int(change["epoch"])):
                await self._refuse_change(job, name, change)
                continue
            if await self.zk.get(paths.child(paths.change_done(job, name), self.me)) is None:
                group.start_soon(self._reconfigure, job, attempt, change)

    async def _refuse_change(self, job: str, name: str, change: Reconfiguration) -> None:
        """Carry out nothing of a change from an older leader than one already obeyed, and say so: the leader
        then falls back to the next attempt instead of waiting for this worker's part for ever."""
        log.warning("ignoring a live change from a deposed leader", job=job, epoch=change["epoch"])
        why = f"change {change['id']} comes from leader epoch {change['epoch']}, older than {self.fence.highest}"
        with contextlib.suppress(NodeExists):
            await self.zk.create(paths.child(paths.change_done(job, name), self.me), {"error": f"refused: {why}"})

    async def _follow_shedding(self, job: str, attempt: int) -> None:
        """Shed at this part's sources the share the leader's shed policy set for the job (``paths.shedding``)."""
        part = self.parts.get((job, attempt))
        running = None if part is None else part.built
        qos = None if running is None else running.topology.qos
        if running is None or qos is None:
            return
        found = await self.zk.get(paths.shedding(job))
        ratio = 0.0 if found is None else min(float(found.data["ratio"]), qos.max_shed_ratio)
        if ratio != running.shed_ratio:
            running.shed(ratio)
            log.info("shedding", job=job, ratio=ratio, worker=self.me)

    async def _reconfigure(self, job: str, attempt: int, change: Reconfiguration) -> None:
        """Wire this worker's part of ``change``, wait until every worker has, run it, report; stop with
        the job part."""
        part = self.parts.get((job, attempt))
        running = None if part is None else part.built
        if running is None:
            return
        name = paths.change_name(int(change["id"]))
        report: dict[str, Any] = {"at": world.wall_time()}
        async with anyio.create_task_group() as group:

            async def until_ended() -> None:
                await running.ended()
                group.cancel_scope.cancel()  # the part is over (or replaced): so is its share of the change

            group.start_soon(until_ended)
            try:
                await self._carry_out_change(job, attempt, change, running, name)
            except Exception as exc:  # noqa: BLE001 - reported: the leader falls back to the next attempt
                log.warning("live change failed", job=job, change=change["id"], error=described(exc))
                report = {"error": described(exc)}
            group.cancel_scope.cancel()
        if (job, attempt) in self.parts:  # a part that ended or was replaced has nothing to report
            with contextlib.suppress(NodeExists):
                await self.zk.create(paths.child(paths.change_done(job, name), self.me), report)

    async def _carry_out_change(self, job: str, attempt: int, change: Reconfiguration, running: Job, name: str) -> None:
        part = self.parts[job, attempt]
        placement = part.placement
        # a part joining by this change may not be built yet: built now, it would take the change's placed
        # instances for its own from the start, beside those the change adds (one never fed, never ending)
        await running.built()
        before = dict(placement)
        placement.update(change["placed"])
        run, addresses = part.run, part.addresses
        task = change["task"]
        plan = ReconfigurationPlan(
            int(change["id"]), task, SegmentTable.from_data(change["old"]), SegmentTable.from_data(change["new"]),
            frozenset(int(index) for index in change.get("relocated", [])),
        )  # fmt: skip

        def worker_of(index: int) -> str:
            return placement[instance_id(task, index)]

        def source_of(index: int) -> str:
            return before.get(instance_id(task, index)) or placement[instance_id(task, index)]

        addresses.update(await self._addresses())  # a worker joining the attempt is reached at its address
        handoff = ClusterHandoff(run, plan, self.me, worker_of, addresses, self.server, self.client, source_of)
        handoff.register()

        wired = paths.change_wired(job, name)

        async def everyone_wired() -> None:
            with contextlib.suppress(NodeExists):
                await self.zk.create(paths.child(wired, self.me), {"at": world.wall_time()})
            changed = await self.zk.watch_children(wired)
            while not set(await self.zk.children(wired)) >= set(change["workers"]):
                await changed.wait()
                changed.clear()

        await running.reconfigure_part(plan, handoff, everyone_wired)
        agreement = part.agreement
        if agreement is not None:  # after the change: checkpoints in flight before it completed without them
            agreement.join(change["workers"])
        assert part.topology is not None  # loaded before the part was built
        await self._publish_endpoints(job, part.topology, placement, [*change["placed"]])

    async def _ended(self, job: str, uid: str) -> bool:
        """The job's state has ended (killed, failed): final, so remembered."""
        if uid in self.ended:
            return True
        found = await self.zk.get(paths.state(job))
        if found is not None and state_of(found.data).ended:
            self.ended.add(uid)
            return True
        return False

    async def drain(self) -> None:
        """Graceful stop: every checkpointed job part here takes a checkpoint before which all its workers'
        sources stop reading (so the next attempt resumes with nothing read twice); then every part stops."""
        async with anyio.create_task_group() as group:
            for part in list(self.parts.values()):
                if part.agreement is not None:
                    group.start_soon(self._drain_part, part)
        for part in list(self.parts.values()):
            part.scope.cancel()

    async def _drain_part(self, part: JobPart) -> None:
        """The stopping checkpoint of ``part``, unless its attempt was superseded (this worker was judged lost
        while cut off): then no other worker takes part in it, and it would never complete."""
        found = await riding_out(self.zk.get, paths.assignment(part.job))
        if found is None or int(found.data["attempt"]) != part.attempt:
            log.warning("nothing to drain: the attempt was superseded", job=part.job, attempt=part.attempt)
            return
        assert part.agreement is not None
        await part.agreement.stop_checkpoint()

    def _cancel(self, job: str) -> None:
        for part in self.parts.values():
            if part.job == job:
                part.scope.cancel()

    def queue_depths(self) -> dict[str, tuple[int, bool]]:
        """Every local receiving instance's queue: ``"job/node.index"`` -> (items queued, inbox full)."""
        depths = {}
        for part, running in self._built():
            for (node, index), depth in running.queue_depths().items():
                depths[f"{part.job}/{instance_id(node, index)}"] = depth
        return depths

    def instance_statistics(self) -> dict[str, dict[str, Any]]:
        """Every local instance's statistics snapshot: ``"job/node.index"`` -> its data (see ``load``)."""
        found = {}
        for part, running in self._built():
            for snapshot in running.instance_statistics():
                found[f"{part.job}/{instance_id(snapshot.node, snapshot.index)}"] = snapshot.to_data()
        return found

    def job_statistics(self) -> dict[str, dict[str, Any]]:
        """Every local job part's job-wide counters: ``job`` -> late, dead-lettered, dropped, discarded, shed,
        restarts, completed checkpoints and their durations (a histogram's counts), and the attempt."""
        found = {}
        for part, running in self._built():
            stats = running.statistics()
            found[part.job] = {
                "attempt": part.attempt, "late": stats.late, "dead_lettered": stats.dead_lettered,
                "dropped": stats.dropped, "discarded": stats.discarded, "shed": stats.shed,
                "restarts": stats.restarts, "checkpoints": stats.checkpoints,
                "checkpoint_durations": stats.checkpoint_durations,
            }  # fmt: skip
        return found

    def _stop_outdated(self, job: str, attempt: int) -> None:
        # a newer attempt replaces this one (a worker was lost): drop it without reporting
        for part in self.parts.values():
            if part.job == job and part.attempt < attempt:
                part.scope.cancel()

    async def _run_job(
        self, job: str, attempt: int, version: int, assignment: Assignment, joining: Reconfiguration | None = None
    ) -> None:
        """This worker's part of ``attempt``, until it ends; then its outcome reported. ``joining``: the live
        change that brings this worker into the running attempt (it builds its part, then carries it out).
        Every line logged meanwhile (its instances', its checkpoints') carries ``job`` and ``attempt``."""
        with structlog.contextvars.bound_contextvars(job=job, attempt=attempt):
            await self._run_part(job, attempt, version, assignment, joining)

    async def _refuse_a_part_started_before(self, job: str, attempt: int) -> None:
        """A part this worker's name started already in ``attempt`` was an earlier process's: it died with
        it. Running again here would leave the attempt waiting for what that process had (its instances'
        progress, its channels' places), so the leader must start another attempt."""
        if await self.zk.get(paths.child(paths.started(job, attempt), self.me)) is not None:
            raise PartLost(f"{self.me} restarted while running its part of attempt {attempt} of job '{job}'")

    async def _run_part(
        self, job: str, attempt: int, version: int, assignment: Assignment, joining: Reconfiguration | None
    ) -> None:
        part_log = log.bind(job=job, attempt=attempt, worker=self.me)
        part_log.info("job part starting", joining=joining is not None)
        part = self.parts[job, attempt] = JobPart(job, attempt)
        scope = part.scope
        self.changes = {taken for taken in self.changes if taken[0] != job or taken[1] >= attempt}  # older: over
        payload: dict[str, Any] | None = None
        try:
            with scope:
                await self._refuse_a_part_started_before(job, attempt)
                await self.registration.set_state(*worker_states(len(self.parts)))
                tcp_before = self.server.counts["records"]
                fetched_before = self.replicas.counts["fetched_bytes"]
                result, restored_from = await self._execute(job, attempt, version, assignment, joining)
                payload = {
                    "restored_from": restored_from,
                    "fetched_bytes": self.replicas.counts["fetched_bytes"] - fetched_before,
                    "sinks": reportable(result),
                    "statistics": _plain(asdict(result.statistics)),
                    "tcp_records_in": self.server.counts["records"] - tcp_before,
                }
                dead_letters = dead_letters_report(result.dead_letters)
                if dead_letters is not None:  # the count and the first few: the report is one ZooKeeper node
                    payload["dead_letters"] = dead_letters
        except Exception as caught:  # noqa: BLE001 - whatever stopped the job is reported to the submitter
            payload = _failure(underlying(caught), caught, part, part_log)
        finally:
            del self.parts[job, attempt]  # and with it everything kept for it
            if not any(running == job for running, _ in self.parts):  # its code goes with its last part
                job_code.forget(*self.code.pop(job, ("", None)))
        if payload is not None:  # None: cancelled (superseded by a newer attempt, or the job ended)
            _log_outcome(part_log, payload)
            await self._report(paths.done(job, attempt), fitting_report(payload), (paths.assignment(job), version))
        else:
            part_log.info("job part stopped", reason="the job ended or a newer attempt replaced this one")
        await self.registration.set_state(*worker_states(len(self.parts)))

    async def _report(self, directory: str, payload: dict[str, Any], fence: tuple[str, int]) -> None:
        """Report the attempt's outcome, fenced: only while the assignment is still the one this ran."""
        # retry through a suspended or re-established session: the outcome must reach ZooKeeper
        for _ in range(100):
            try:
                await self.zk.ensure(directory)
                if await write_fenced(self.zk, paths.child(directory, self.me), payload, None, fence):
                    return
                if await self.zk.get(paths.child(directory, self.me)) is None:
                    log.warning("dropping the outcome of a replaced attempt", path=directory)
                return  # reported already, or the job moved on to a newer attempt
            except CoordinationError:
                await anyio.sleep(0.2)
        log.error("could not report a job's outcome", path=directory)

    async def _execute(
        self, job: str, attempt: int, version: int, assignment: Assignment, joining: Reconfiguration | None
    ) -> tuple[JobResult, int | None]:
        """Run this worker's share of the attempt; the result and the checkpoint it resumed from."""
        part = self.parts[job, attempt]
        found = await self.zk.get(paths.spec(job))
        if found is None:
            raise SpecError(f"job '{job}' has no spec")
        spec = verify(job, found.data, self.secret)  # before anything of it is imported
        self.code[job] = (spec["target"], spec.get("module_sha256"))
        found_layout = await self.zk.get(paths.layout(job))
        layout = None if found_layout is None else found_layout.data
        topology = part.topology = with_layout(topology_of(spec, self.secret), layout)
        # live changes add instances to it; a joining worker starts from where they left them
        assigned = assignment["instances"]
        instances = part.placement = dict(assigned) if joining is None else placed_instances(assigned, layout, attempt)
        addresses = await self._addresses()
        _refuse_unregistered_peers(job, attempt, instances, addresses)
        run = f"{job}.{spec['uid']}.{attempt}"  # this attempt of this submission: never the same twice
        part.run, part.addresses = run, addresses
        held = anyio.Event()  # a joining part: open until the change that brings it in is over
        placement = Placement(
            job=run,  # channel ids per attempt: an old attempt's frames never mix in
            local=lambda node, index: instances[instance_id(node, index)] == self.me,
            remote=lambda name, node, index: self._channel(addresses, instances[instance_id(node, index)], name),
            expose=self.server.register,
            tables=tables_of(layout),
            incarnations={} if joining is None else incarnations_of(layout, attempt),
            hold_open=None if joining is None else held.wait,
        )
        await self._publish_endpoints(job, topology, instances)
        workers_ = attempt_workers(assignment, joined_workers(layout, attempt, joining))
        scope = RestoreScope(
            frozenset(instance for instance, worker in instances.items() if worker == self.me),
            {node.name: node.parallelism for node in topology.nodes.values()},
            {task: table.to_data() for task, table in tables_of(layout).items()},
        )
        settings = spec.get("checkpoint")
        uid = str(spec["uid"])
        checkpoints = self._checkpoints(job, uid, attempt, version, workers_, settings, scope, joining is not None)
        part.agreement = checkpoints
        running = Job(
            topology, channel_factory=LocalChannel, placement=placement,
            coordinator=None if checkpoints is None else checkpoints.coordinator(),
            job_id=f"{self.zk.cluster}.{job}", attempt=run, name=job,  # sinks stage per run; Kafka ids per job
            lineage=f"{job}.{spec['uid']}",  # every attempt of this submission: a fresh one cleans the others' staging
            quiescence=ClusterQuiescence(self.zk, LoopAttempt(job, attempt, self.me, attempt_workers(assignment))),
            state_backend=backend_from(spec.get("state"), self.state_dir / "rocksdb" / f"{job}.{attempt}"),
        )  # fmt: skip
        part.built = running
        if self.on_part_built is not None:
            self.on_part_built((job, attempt), running)
        with contextlib.suppress(NodeExists):
            started = {"at": world.wall_time(), "boot": self.registration.boot}
            await self.zk.create(paths.child(paths.started(job, attempt), self.me), started)
        if joining is None:
            result = await running.run()
        else:
            async with anyio.create_task_group() as group:

                async def join() -> None:
                    try:
                        await self._reconfigure(job, attempt, joining)
                    finally:
                        held.set()

                group.start_soon(join)
                result = await running.run()
        return result, None if checkpoints is None else checkpoints.restored_from

    def _channel(self, addresses: dict[str, tuple[str, int]], worker: str, name: str) -> TcpChannel:
        """A channel to ``name`` on ``worker`` (whose TLS certificate must name it)."""
        return self.client.channel(addresses[worker], name, peer=worker)

    async def _addresses(self) -> dict[str, tuple[str, int]]:
        """Every registered worker's data-plane address."""
        return {view.worker_id: (view.info["host"], int(view.info["data_port"])) for view in await workers(self.zk)}

    def _checkpoints(
        self,
        job: str,
        uid: str,
        attempt: int,
        version: int,
        workers_: list[str],
        settings: dict[str, Any] | None,
        scope: RestoreScope,
        joining: bool,
    ) -> ZkAgreement | None:
        if settings is None:
            return None
        info = AttemptInfo(job, attempt, self.me, workers_, version)
        wanted = settings.get("replicas")  # None: one copy when another worker is live
        replicas = 1 if wanted is None else int(wanted)
        replicator = PartReplicator(self.zk, self.replicas, job, attempt, replicas, uid=uid)
        replicator.insist = wanted is not None
        return ZkAgreement(
            self.zk, info, replicator, scope, settings.get("interval"), SystemClock(),
            settings.get("from_savepoint"), joining=joining, secret=self.secret,
        )  # fmt: skip

    async def _publish_endpoints(
        self, job: str, topology: Topology, instances: dict[str, str], only: list[str] | None = None
    ) -> None:
        """Seed 000: where each receiving instance port of this worker is served (``only``: of those instances;
        a live change publishes the ones it put here)."""
        address = "{}:{}".format(*self.server.address)  # advertised: what peers connect to
        for node in topology.nodes.values():
            for index in range(node.parallelism):
                instance = instance_id(node.name, index)
                if instances[instance] != self.me or (only is not None and instance not in only):
                    continue
                for port in range(node.inputs):
                    path = paths.channel(job, instance, port)
                    try:
                        await self.zk.create(path, address)
                    except NodeExists:
                        await self.zk.set(path, address)


async def files_to_keep(zk: ClusterStore, job: str, uid: str) -> dict[int, int] | None:
    """The checkpoints of submission ``uid`` of ``job`` a restore may still read, epoch -> attempt (the last
    complete one and the one before it); ``None`` when the job ended, is gone, or is another submission now
    (nothing of it is needed)."""
    header, state = await zk.get(paths.job(job)), await zk.get(paths.state(job))
    if header is None or state is None or state_of(state.data).ended or str((header[0] or {}).get("uid")) != uid:
        return None
    found = await zk.get(paths.completed(job))
    if found is None:
        return {0: 0}  # none complete yet: every file may be of the first one
    records = [found.data, found.data.get("previous")]
    return {int(record["epoch"]): int(record["attempt"]) for record in records if record is not None}


def _log_outcome(part_log: Any, payload: dict[str, Any]) -> None:
    """One line for how a part ended (a task's failure was logged with its task and instance already)."""
    if "error" not in payload:
        letters = payload.get("dead_letters", {}).get("count", 0)
        part_log.info("job part finished", dead_letters=letters, restored_from=payload["restored_from"])
    elif "instance" not in payload:
        part_log.warning("job part failed", error=payload["error"])


def fitting_report(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload``, or an error saying why when it is too big for a ZooKeeper node (which refuses it and drops
    the connection, again at every retry): collected sink records are reported through ZooKeeper."""
    size = len(json.dumps(payload).encode())
    if size <= MAX_REPORT_BYTES:
        return payload
    collected = ", ".join(f"'{name}' {len(rows)}" for name, rows in payload.get("sinks", {}).items())
    return {
        "error": f"JobError: this worker's report is {size} bytes, over the {MAX_REPORT_BYTES} a ZooKeeper node "
        f"holds (records collected by sinks: {collected or 'none'}); collect less, or write large outputs with "
        "a FileSink or KafkaSink",
    }


def reportable(result: JobResult) -> dict[str, list[list[Any]]]:
    """Collected sink records as JSON-ready rows; a record JSON cannot hold is a :class:`JobError` naming it."""
    rows = {}
    for name, records in result.collected().items():
        for record in records:
            try:
                json.dumps([record.key, record.value, record.ts])
            except (TypeError, ValueError) as exc:
                raise JobError(
                    f"sink '{name}' collected a record (key {record.key!r}) that cannot be reported as JSON: {exc}"
                ) from exc
        rows[name] = [[r.key, r.value, r.ts] for r in records]
    return rows


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


def _refuse_unregistered_peers(
    job: str, attempt: int, instances: dict[str, str], addresses: dict[str, tuple[str, int]]
) -> None:
    """A worker of the attempt that is no longer registered lost its session: its instances are gone, so this
    attempt cannot run; the leader starts the next one over the workers that are live."""
    missing = sorted({worker for worker in instances.values() if worker not in addresses})
    if missing:
        raise PartLost(f"{', '.join(missing)}, which runs part of attempt {attempt} of job '{job}', is not registered")


def _failure(exc: BaseException, caught: BaseException, part: JobPart, part_log: Any) -> dict[str, Any]:
    """The report of a part that ``exc`` stopped (``caught``: what was raised, an exception group perhaps, which
    is described by the error in it: a reason that says ``ExceptionGroup`` tells nobody what failed)."""
    if isinstance(exc, PartLost | PeerUnreachable):  # the leader starts another attempt, from the last checkpoint
        return {"error": described(caught), "lost": True}
    if isinstance(exc, UnusableCheckpoint):  # the leader holds the job until a worker holding the state is back
        return {"error": f"CheckpointError: {exc}", "unusable": exc.epoch}
    if isinstance(exc, TaskError):  # an instance crashed: the leader may restart it elsewhere
        part_log.error("task failed", task=exc.task, instance=exc.instance, error=str(exc))
        return {
            "error": f"TaskError: {exc}", "instance": instance_id(exc.task, exc.instance),
            "retry": part.restartable(exc.task),
        }  # fmt: skip
    return {"error": described(caught)}
