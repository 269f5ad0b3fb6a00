"""The leading master: schedules jobs, follows their outcomes, recovers them, and writes their state.

Each round the leader looks at every job once (:meth:`Leader.round`) and
moves it through the lifecycle (``lifecycle``), writing the state node in the
same transaction as whatever else the decision needs:

- SUBMITTED (or STALLED with nothing assigned): place the instances over the
  live workers and write attempt 1 -> SCHEDULED; no worker fits -> STALLED,
  with the reason, until one does. A spec that is not signed with the
  cluster secret, or code that cannot load -> FAILED.
- all workers of the attempt started their part -> RUNNING;
  all reported success -> FINISHED; a task error -> FAILED.
- Node failover: a worker of the attempt is gone (node or heartbeat) ->
  the next attempt over the live workers -> RECOVERING; nobody left that can
  take it -> STALLED, and a new attempt as soon as someone can.
- Instance failover: a crashed instance whose task asks for restarts ->
  the next attempt away from the workers where it crashed -> RECOVERING;
  past ``max_failures`` -> FAILED with a reason naming the instance.
- ``/kill`` present -> KILLED; workers stop the job when they read it.

Every write is a transaction conditional on the versions read and on
``/epoch`` still holding this leader's epoch (``election.LeaderFence``), so a
deposed leader that has not noticed yet changes nothing, even one stopped
between its read and its write; assignments and live changes carry the
leader's epoch, which workers check too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import structlog

from streamlet.backends.cluster.leader import live_changes
from streamlet.backends.cluster.leader.backup_control import BackupController
from streamlet.backends.cluster.leader.lost_workers import LostWorkers
from streamlet.backends.cluster.leader.scheduler import place, state_holders
from streamlet.backends.cluster.tree import layouts as reconfigure
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import LeaderFence
from streamlet.backends.cluster.tree.hints import cpu_bound_tasks
from streamlet.backends.cluster.tree.lifecycle import JobState, moved, state_of
from streamlet.backends.cluster.tree.loads import busy, fitting_workers, live, live_loads
from streamlet.backends.cluster.tree.outline import Outlines
from streamlet.backends.cluster.tree.paths import (
    Assignment,
    JobSpec,
    JobStateNode,
    Layout,
    Reconfiguration,
    ReconfigureRequest,
)
from streamlet.backends.cluster.tree.registry import WorkerView, workers
from streamlet.backends.cluster.tree.signing import verify
from streamlet.backends.cluster.tree.store import ClusterStore, Create, Delete, Found, Op, SetData, read_all
from streamlet.core.model import world
from streamlet.core.model.topology import Topology
from streamlet.errors import CoordinationError, DispatchError, ReconfigurationError, SpecError

log = structlog.get_logger("streamlet")
ROUND = 0.2  # seconds between rounds when nothing wakes the leader earlier
HOLDER_RETRY = 10.0  # seconds a job STALLED on a checkpoint without a live copy waits before it tries again
BACKUP_ROUND = 1.0  # seconds between runs of the backup location controller (it reruns only on changes)


@dataclass
class JobView:
    """What the leader reads of one job in a round."""

    name: str
    spec: dict[str, Any]
    state: JobStateNode
    state_version: int
    assignment: Found[Assignment] | None
    started: set[str]
    done: dict[str, dict[str, Any]]
    kill: dict[str, Any] | None
    request: tuple[ReconfigureRequest, int] | None = None  # a client's request for a live change
    change: Reconfiguration | None = None  # the newest live change of the job
    changed: dict[str, dict[str, Any]] = field(default_factory=dict)  # workers done with it: worker -> report
    layout: Found[Layout] | None = None
    started_boots: dict[str, str] = field(default_factory=dict)  # worker -> the boot that started its part

    @property
    def attempt(self) -> int:
        """The current attempt (0 before the first)."""
        return 0 if self.assignment is None else int(self.assignment.data["attempt"])

    @property
    def involved(self) -> set[str]:
        """Workers of the current attempt: those it was assigned to, and those live changes brought in."""
        if self.assignment is None:
            return set()
        workers = set(self.assignment.data["instances"].values())
        if self.layout is not None and self.layout.data["attempt"] == self.attempt:
            workers |= set(self.layout.data["placed"].values())
        if self.change is not None and int(self.change["attempt"]) == self.attempt:
            workers |= set(self.change["placed"].values())  # a worker joining it runs a part from the start
        return workers


async def read_view(store: ClusterStore, job: str) -> JobView | None:
    """One job as it now stands (``None`` for a job half-created or being removed)."""
    spec, state = await store.get(paths.spec(job)), await store.get(paths.state(job))
    if spec is None or state is None:
        return None
    assignment = await store.get(paths.assignment(job))
    attempt = 0 if assignment is None else int(assignment.data["attempt"])
    changes = await store.children(paths.reconfigurations(job))
    change = None if not changes else await store.get(paths.change(job, changes[-1]))
    changed = {} if change is None else await read_all(store, paths.change_done(job, changes[-1]))
    return JobView(
        name=job,
        spec=spec.data,
        state=state.data,
        state_version=state.version,
        assignment=assignment,
        started=set(started := await read_all(store, paths.started(job, attempt))),
        started_boots={worker: str(entry["boot"]) for worker, entry in started.items() if entry and entry.get("boot")},
        done=await read_all(store, paths.done(job, attempt)),
        kill=None if (found := await store.get(paths.kill(job))) is None else found.data,
        request=await store.get(paths.reconfigure_request(job)),
        change=None if change is None else change.data,
        changed=changed,
        layout=await store.get(paths.layout(job)),
    )


class Leader:
    """One leadership term: ``epoch`` fences everything it writes."""

    def __init__(
        self,
        store: ClusterStore,
        epoch: int,
        secret: bytes,
        clock: Callable[[], float] = world.wall_time,
        outlines: Outlines | None = None,
    ) -> None:
        self.store = store
        self.epoch = epoch
        self.secret = secret
        self.clock = clock
        #: The jobs' topologies, built away from this loop (``outline``); shared with the adaptation loop and
        #: the dashboard of this master.
        self.outlines = Outlines(secret=secret) if outlines is None else outlines
        self._builds: anyio.abc.TaskGroup | None = None  # run(): builds go on here while rounds go on
        self._building: set[str] = set()
        self.fence = LeaderFence(store, epoch)  # every write of this term goes through it
        self.backups = BackupController(store, self.fence, clock)
        self._backups_placed_at = -BACKUP_ROUND
        self._boots: dict[str, str] = {}  # live worker -> its boot, as of this round
        self._busy: dict[str, dict[str, Any]] = {}  # worker -> what holds its loop, while it is BUSY
        self.lost = LostWorkers(store, self.fence, clock, epoch)  # workers gone, kept listed as LOST
        # when this leader last began to see the store (its term began, or its connection came back): a
        # heartbeat missed before then (the store down, out of quorum, or out of this leader's reach) is not
        # held against a worker, which gets STALE_AFTER from then on to beat
        self.seeing_since = clock()

    async def run(self) -> None:
        """Rounds until cancelled: at once when a worker comes or goes, else every ``ROUND``."""
        workers_changed = await self.store.watch_children(paths.WORKERS)
        async with anyio.create_task_group() as builds:
            self._builds = builds
            seeing = True
            while True:
                workers_changed.clear()
                if self.store.state == "connected" and not seeing:
                    self.seeing_since = self.clock()
                seeing = self.store.state == "connected"
                if seeing:  # suspended: decide nothing until the session is back or lost
                    try:
                        await self.round()
                    except Exception as exc:  # noqa: BLE001 - the leader must outlive a bad round; the next retries
                        log.warning("leader round failed", error=f"{type(exc).__name__}: {exc}")
                with anyio.move_on_after(ROUND):
                    await workers_changed.wait()

    async def round(self) -> list[str]:
        """Look at every job once; returns a line per decision taken."""
        registered = await workers(self.store)
        views = live(registered, self.clock(), self.seeing_since)
        live_ids = {view.worker_id for view in views}
        self._boots = {view.worker_id: str(view.info.get("boot", "")) for view in views}
        self._note_busy(views)
        await self.lost.look(views, registered)
        decisions = []
        for job in await self.store.children(paths.JOBS):
            state = await self.store.get(paths.state(job))
            if state is None or state_of(state.data).ended:
                continue  # ended jobs cost one read a round, not the whole view
            view = await read_view(self.store, job)
            if view is None:
                continue
            decision = await self._step(view, live_ids)
            if decision is not None:
                log.info("job decision", job=job, decision=decision, epoch=self.epoch)
                decisions.append(f"{job}: {decision}")
        await self._place_backups()
        return decisions

    def _note_busy(self, views: list[WorkerView]) -> None:
        """Log each worker that turns BUSY (fresh heartbeats, its event loop held by user code) and each that
        stops being so. A busy worker is alive: nothing is restarted for it."""
        now_busy = {}
        for view in views:
            held = busy(view.load)
            if held is not None:
                now_busy[view.worker_id] = held
                if view.worker_id not in self._busy:
                    log.warning("worker BUSY", worker=view.worker_id, epoch=self.epoch, **held)
        for worker in self._busy.keys() - now_busy.keys():
            log.info("worker no longer BUSY", worker=worker, epoch=self.epoch)
        self._busy = now_busy

    async def _place_backups(self) -> None:
        """The backup location controller over the RUNNING jobs, at most every ``BACKUP_ROUND``."""
        now = self.clock()
        if now - self._backups_placed_at < BACKUP_ROUND:
            return
        self._backups_placed_at = now
        views = live(await workers(self.store), now, self.seeing_since)
        loads = None
        for job in await self.store.children(paths.JOBS):
            state = await self.store.get(paths.state(job))
            if state is None or state_of(state.data) != JobState.RUNNING:  # one read for a job not running
                self.backups.forget(job)
                continue
            spec, assignment = await self.store.get(paths.spec(job)), await self.store.get(paths.assignment(job))
            if spec is None or assignment is None:
                continue
            loads = loads or await live_loads(self.store, now, since=self.seeing_since)
            try:
                await self.backups.step(job, spec.data, assignment.data, views, loads)
            except CoordinationError as exc:  # another leader's write, a lost session: the next pass retries
                log.warning("placing backups failed", job=job, error=str(exc))

    async def _step(self, view: JobView, live_ids: set[str]) -> str | None:
        state = state_of(view.state)
        if view.kill is not None:
            return await self._move(view, JobState.KILLED, f"killed by {view.kill.get('by', 'a client')}")
        if view.assignment is None:
            return await self._schedule(view)
        if state == JobState.STALLED:
            if await self._waiting_for_a_holder(view):
                return None
            return await self._next_attempt(view, "a worker can take it again", {})
        errors = {worker: report for worker, report in view.done.items() if "error" in report}
        if errors:
            return await self._crashed(view, errors)
        if state in (JobState.SCHEDULED, JobState.RECOVERING) and view.involved <= view.started:
            # before FINISHED, even for a job quicker than a round: 'started' records when it ran
            return await self._move(view, JobState.RUNNING, f"running on {', '.join(sorted(view.involved))}")
        if view.involved <= set(view.done):
            return await self._move(view, JobState.FINISHED, f"every worker finished ({len(view.done)})")
        lost = sorted((view.involved - live_ids) | self._restarted(view))
        if lost and state == JobState.RECONFIGURING and view.change is not None:  # the client following it is told
            return await self._drop_change(view, f"lost {', '.join(lost)} during change {view.change['id']}")
        if lost:
            return await self._next_attempt(view, f"lost {', '.join(lost)}", {})
        if state == JobState.RECONFIGURING:
            return await self._follow_change(view)
        if state == JobState.RUNNING and view.request is not None:
            return await self._start_change(view)
        return None

    # -- decisions ------------------------------------------------------------------

    async def _move(
        self,
        view: JobView,
        target: JobState,
        reason: str,
        extra: list[Op] | None = None,
        attempt: int | None = None,
        reconfigured: bool = False,
    ) -> str | None:
        """Write the job's new state (with ``extra`` steps) if nobody changed it since it was read."""
        if view.state["state"] == target.value and view.state["reason"] == reason and not extra:
            return None
        node = moved(view.state, target, reason, view.attempt if attempt is None else attempt, self.clock())
        if reconfigured:
            node["reconfigurations"] = int(view.state.get("reconfigurations", 0)) + 1
        steps = [*(extra or []), SetData(paths.state(view.name), node, view.state_version)]
        if not await self.fence.commit(steps):
            return None  # someone else (a newer leader, a client) moved first: next round looks again
        return f"{target.value}: {reason}"

    async def _schedule(self, view: JobView) -> str | None:
        topology = await self._topology(view)
        if not isinstance(topology, Topology):
            return await self._cannot_run(view, topology)
        loads = await live_loads(self.store, self.clock(), since=self.seeing_since)
        hinted_tasks = await cpu_bound_tasks(self.store, topology.name)
        spread = self._spread(view, topology, hinted_tasks)
        try:
            mapping = place(topology, loads, spread=spread)
        except DispatchError as exc:
            return await self._move(view, JobState.STALLED, f"no live worker can take it: {exc}")
        assignment: Assignment = {
            "epoch": self.epoch, "attempt": 1, "instances": mapping, "boots": self._booted(mapping),
        }  # fmt: skip
        workers_ = ", ".join(sorted(set(mapping.values())))
        if view.spec.get("spread"):
            hinted = " (every node's instances spread: --spread)"
        else:
            hinted = f" ({', '.join(sorted(spread))} spread: CPU hint)" if spread else ""
        created = Create(paths.assignment(view.name), assignment)
        return await self._move(view, JobState.SCHEDULED, f"assigned to {workers_}{hinted}", [created], attempt=1)

    @staticmethod
    def _spread(view: JobView, topology: Topology, hinted: Collection[str]) -> set[str]:
        """The nodes whose instances go to different workers while some have room: those a CPU hint names,
        and with ``submit --spread`` every node (co-location otherwise keeps a job on as few workers as fit)."""
        return set(hinted) | (set(topology.nodes) if view.spec.get("spread") else set())

    async def _topology(self, view: JobView) -> Topology | str | None:
        """The job's topology as live changes left it, why it cannot run (a bad signature, code that does not
        load or takes too long), or ``None`` while it is being built: rounds go on meanwhile (run()), the
        job is decided on once its outline is in. A round called on its own waits for the build."""
        try:
            spec = verify(view.name, view.spec, self.secret)  # before anything of it runs anywhere
        except SpecError as exc:
            return f"cannot load the job: {type(exc).__name__}: {exc}"
        found = self.outlines.ready(spec)
        if found is None and self._builds is None:
            found = await self.outlines.build(spec)
        elif found is None:
            self._build_later(spec)
            return None
        if isinstance(found, str):
            return found
        return reconfigure.with_layout(found, None if view.layout is None else view.layout.data)

    def _build_later(self, spec: JobSpec) -> None:
        """Build ``spec``'s outline in the background (once): a slow build_topology holds no round up."""
        key = str(spec.get("signature"))
        if key in self._building:
            return
        self._building.add(key)
        assert self._builds is not None
        self._builds.start_soon(self.outlines.build, spec)

    async def _cannot_run(self, view: JobView, reason: str | None) -> str | None:
        """A job without a topology: FAILED with the reason, or nothing yet while it is being built."""
        return None if reason is None else await self._move(view, JobState.FAILED, reason)

    # -- live changes (``reconfigure``) ------------------------------------------------

    async def _start_change(self, view: JobView) -> str | None:
        """A client asked for a live change: plan it, hold checkpoints, RECONFIGURING; or refuse it."""
        assert view.request is not None
        assert view.assignment is not None
        request, version = view.request
        topology = await self._topology(view)
        if not isinstance(topology, Topology):
            return await self._cannot_run(view, topology)
        layout = None if view.layout is None else view.layout.data
        ident = 1 if view.change is None else int(view.change["id"]) + 1
        instances = reconfigure.placed_instances(view.assignment.data["instances"], layout, view.attempt)
        loads = await live_loads(self.store, self.clock(), exclude=view.name, since=self.seeing_since)
        task = topology.nodes.get(str(request.get("task")))
        fitting = fitting_workers(task, loads) if task is not None else set()  # its workers=/labels= constraints
        room = {load.worker_id: load.capacity - load.used for load in loads if load.worker_id in fitting}
        for worker in live_changes.running_instances(instances, topology).values():  # this job's, live-added too
            if worker in room:
                room[worker] -= 1
        try:
            change = live_changes.plan(
                ident, topology, layout, request, instances, view.attempt, self.epoch, room, set(view.done)
            )
        except ReconfigurationError as exc:
            answer = await self._answer_change(view, {"error": str(exc), "at": self.clock()})
            if not await self.fence.commit([Delete(paths.reconfigure_request(view.name), version), answer]):
                return None  # the request or the answer moved meanwhile, or this leader was deposed: look again
            return f"refused a live change: {exc}"
        change["boots"] = {worker: self._boots[worker] for worker in change["workers"] if worker in self._boots}
        await self.store.ensure(paths.reconfigurations(view.name))  # a transaction creates no parents
        steps: list[Op] = [
            Delete(paths.reconfigure_request(view.name), version),
            Create(paths.reconfiguration(view.name, ident), change),
        ]
        if view.spec.get("checkpoint") is not None:
            steps.append(await self._hold_trigger(view, ident))
        what = _describe_change(change)
        return await self._move(view, JobState.RECONFIGURING, f"change {ident} ({what})", steps)

    async def _hold_trigger(self, view: JobView, ident: int) -> Op:
        path = paths.trigger_path(view.name, view.attempt)
        found = await self.store.get(path)
        if found is None:
            return Create(path, live_changes.held(None, ident))
        return SetData(path, live_changes.held(found.data, ident), found.version)

    async def _answer_change(self, view: JobView, why: dict[str, Any]) -> Op:
        """The step that tells the client following a change why it is not done (refused, or dropped)."""
        refused = await self.store.get(paths.reconfigure_refused(view.name))
        if refused is None:
            return Create(paths.reconfigure_refused(view.name), why)
        return SetData(paths.reconfigure_refused(view.name), why, refused.version)

    async def _drop_change(self, view: JobView, why: str) -> str | None:
        """The change cannot finish: the next attempt, in the old shape, and (in the same transaction) the
        client following the change told why."""
        answer = await self._answer_change(view, {"error": why, "at": self.clock(), "dropped": True})
        return await self._next_attempt(view, why, {}, [answer])

    async def _follow_change(self, view: JobView) -> str | None:
        """Every worker done with the change: RUNNING again, one more reconfiguration, the new layout, the
        checkpoint trigger released. A worker that failed its part: the next attempt, from the last checkpoint."""
        change = view.change
        if change is None or int(change["attempt"]) != view.attempt:
            return await self._move(view, JobState.RUNNING, "no live change under way")
        gone = set(change["workers"]) - set(self._boots)  # a worker joining by the change died, say
        gone |= {w for w, boot in change.get("boots", {}).items() if self._boots.get(w, boot) != boot}  # or restarted
        if self._boots and gone:
            return await self._drop_change(view, f"lost {', '.join(sorted(gone))} during change {change['id']}")
        failed = {worker: report for worker, report in view.changed.items() if "error" in report}
        if failed:
            worker, report = sorted(failed.items())[0]
            return await self._drop_change(view, f"change {change['id']} failed on {worker}: {report['error']}")
        if not set(change["workers"]) <= set(view.changed):
            ended = sorted(set(change["workers"]) & set(view.done) - set(view.changed))
            if ended:  # its part ended first (the input ran out): the change can never complete on it
                why = f"change {change['id']} cannot complete: {', '.join(ended)} ended its part of it first"
                return await self._drop_change(view, why)
            return None
        topology = await self._topology(view)
        if not isinstance(topology, Topology):
            return await self._cannot_run(view, topology)
        layout = None if view.layout is None else view.layout.data
        new_layout = live_changes.next_layout(layout, change, topology)
        steps: list[Op] = [
            Create(paths.layout(view.name), new_layout)
            if view.layout is None
            else SetData(paths.layout(view.name), new_layout, view.layout.version)
        ]
        trigger = await self.store.get(paths.trigger_path(view.name, view.attempt))
        if trigger is not None and trigger.data.get("hold") is not None:
            released = {key: value for key, value in trigger.data.items() if key != "hold"}
            steps.append(SetData(paths.trigger_path(view.name, view.attempt), released, trigger.version))
        reason = f"change {change['id']} done: {_describe_change(change, done=True)}"
        return await self._move(view, JobState.RUNNING, reason, steps, reconfigured=True)

    def _restarted(self, view: JobView) -> set[str]:
        """Workers of the attempt that are live under a boot other than the one it was given to: a restarted
        process has none of its part (its instances, their progress, the ports its peers know)."""
        assert view.assignment is not None
        given = {**view.assignment.data.get("boots", {}), **view.started_boots}  # joiners: by their start
        return {worker for worker, boot in given.items() if boot and self._boots.get(worker, boot) != boot}

    def _booted(self, mapping: dict[str, str]) -> dict[str, str]:
        """The boot of each worker ``mapping`` places instances on (what :meth:`_restarted` compares)."""
        return {worker: self._boots[worker] for worker in sorted(set(mapping.values())) if worker in self._boots}

    async def _next_attempt(
        self, view: JobView, why: str, avoid: dict[str, set[str]], also: Sequence[Op] = ()
    ) -> str | None:
        """The next attempt over the live workers (RECOVERING), or STALLED when none can take it; ``also``:
        steps of the same transaction."""
        assert view.assignment is not None
        topology = await self._topology(view)
        if not isinstance(topology, Topology):
            return await self._cannot_run(view, topology)
        try:
            loads = await live_loads(self.store, self.clock(), exclude=view.name, since=self.seeing_since)
            holders = await state_holders(self.store, view.name, view.assignment.data)
            spread = self._spread(view, topology, await cpu_bound_tasks(self.store, topology.name))
            mapping = place(topology, loads, avoid, holders, spread)  # where the state is: a recovery moves little
        except DispatchError as exc:
            return await self._move(view, JobState.STALLED, f"{why}; no live worker can take it: {exc}", [*also])
        current, version = view.assignment
        attempt = int(current["attempt"]) + 1
        new: Assignment = {
            "epoch": self.epoch,
            "attempt": attempt,
            "instances": mapping,
            "boots": self._booted(mapping),
        }
        step = SetData(paths.assignment(view.name), new, version)
        return await self._move(view, JobState.RECOVERING, f"attempt {attempt}: {why}", [step, *also], attempt)

    async def _crashed(self, view: JobView, errors: dict[str, dict[str, Any]]) -> str | None:
        """A task failed: instance failover when every error asks for a retry, else the job fails."""
        worker, report = sorted(errors.items())[0]
        if all("lost" in entry for entry in errors.values()):  # a restarted worker, a cut link: not the code's fault
            lost = str(report["error"]).removeprefix("PartLost: ")
            return await self._next_attempt(view, f"a part of attempt {view.attempt} is lost: {lost}", {})
        if all("unusable" in entry for entry in errors.values()):
            return await self._move(view, JobState.STALLED, await self._unusable_reason(view, report, worker))
        if not all(entry.get("retry") for entry in errors.values()):
            return await self._move(view, JobState.FAILED, f"{report['error']} (on {worker})")
        instance = str(report["instance"])
        history = await self._record_failure(view, instance, worker, str(report["error"]))
        topology = await self._topology(view)
        if not isinstance(topology, Topology):
            return await self._cannot_run(view, topology)
        node = topology.nodes[paths.task_of(instance)]
        if len(history) > node.max_failures:
            where = ", ".join(sorted({entry["worker"] for entry in history}))
            reason = (
                f"instance '{instance}' failed {len(history)} times (max_failures={node.max_failures}) on {where}; "
                f"last error: {history[-1]['error']}"
            )
            return await self._move(view, JobState.FAILED, reason)
        avoid = {node.name: {entry["worker"] for entry in history}}
        return await self._next_attempt(view, f"{instance} crashed on {worker}", avoid)

    async def _unusable_reason(self, view: JobView, report: dict[str, Any], worker: str) -> str:
        epoch = int(report["unusable"])
        marker = await self.store.get(paths.unusable_epoch(view.name, epoch))
        held = "" if marker is None else f" (held by {', '.join(marker.data.get('holders', [])) or 'nobody'})"
        return (
            f"checkpoint {epoch} has an instance with no intact copy on a live worker ({worker}){held}; waiting "
            "for a worker that holds it: resuming from an earlier checkpoint would commit its output twice"
        )

    async def _waiting_for_a_holder(self, view: JobView) -> bool:
        """Whether the job is STALLED on its last checkpoint having no intact copy on a live worker and the
        registered workers (each under the same boot) are still those of that finding: a restore now would find
        the same. When every holder answered that it has no intact copy, the job waits for a worker to start or
        restart; when a holder did not answer (cut off, it may be back since) it is tried again every
        ``HOLDER_RETRY``."""
        completed = await self.store.get(paths.completed(view.name))
        if completed is None:
            return False
        marker = await self.store.get(paths.unusable_epoch(view.name, int(completed.data["epoch"])))
        if marker is None:
            return False
        registered = {view.worker_id: str(view.info.get("boot", "")) for view in await workers(self.store)}
        if registered != marker.data.get("boots"):
            return False
        recent = self.clock() - float(marker.data.get("at", 0.0)) < HOLDER_RETRY
        return recent or not marker.data.get("unreachable")

    async def _record_failure(self, view: JobView, instance: str, worker: str, error: str) -> list[dict[str, Any]]:
        # one entry per attempt: a leader that looks twice (or a new leader) does not count a crash twice
        directory = paths.failures(view.name, instance)
        entry = {"attempt": view.attempt, "worker": worker, "error": error}
        await self.store.ensure(directory)  # a transaction creates no parents
        await self.fence.commit([Create(paths.child(directory, str(view.attempt)), entry)])  # False: recorded already
        entries = list((await read_all(self.store, directory)).values())
        return sorted(entries, key=lambda entry: int(entry["attempt"]))


def _describe_change(change: Reconfiguration, done: bool = False) -> str:
    """``count: 128 segments over 3 instances`` / ``count.1 to worker-1`` (done: ``count runs 3 instances``,
    ``count.1 runs on worker-1``)."""
    if change.get("relocated"):
        [(instance, worker)] = change["placed"].items()
        return f"{instance} {'runs on' if done else 'to'} {worker}"
    task, instances = change["task"], change["new"]["instances"]
    if done:
        return f"{task} runs {instances} instances"
    return f"{task}: {len(change['old']['owners'])} segments over {instances} instances"
