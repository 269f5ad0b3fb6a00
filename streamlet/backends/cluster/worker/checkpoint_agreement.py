"""Checkpoints of a job whose instances run on several workers.

Each worker runs the core's aligned-barrier coordinator for its own
instances, given a :class:`ZkAgreement` (the core's ``Agreement`` seam) that
agrees with the other workers of the same attempt through ZooKeeper::

    /jobs/<job>/checkpoints/completed                     {"attempt", "epoch", "workers", "finished", "holders", ...}
    /jobs/<job>/checkpoints/attempt-<n>/trigger           {"epoch": e, "final": bool}
    /jobs/<job>/checkpoints/attempt-<n>/acks/<e>/<worker> the worker's part of epoch e is saved and replicated
    /jobs/<job>/checkpoints/attempt-<n>/acks/<e>/<w>~<b>  backup b stored its piece of w's part
    /jobs/<job>/checkpoints/attempt-<n>/finished/<worker> all of the worker's instances have completed

One worker (the first of the attempt) writes the trigger every interval
(or as soon as the previous checkpoint completed, when that took longer);
epochs never repeat across attempts: a new attempt numbers its checkpoints
after the highest any earlier attempt triggered. Every worker injects the barrier
at its local sources when it sees it. When all of a worker's instances
have snapshotted epoch e, it saves its *part* (the snapshots, by instance
index) on its own disk, sends each instance's piece to its backup workers
and, once they have it stored, acknowledges (``replication``: there is no
shared disk). The worker whose acknowledgement is the last one publishes
``completed`` — with who holds each instance's state, the layout it was
taken with and the checkpoint before it — in one ZooKeeper transaction with
a check that the job's assignment is still the one it runs: a worker of a
replaced attempt (a zombie) can never complete a checkpoint. Every worker
commits its sinks' output up to the published epoch when it sees it. A new
attempt restores each instance from a holder of the last complete
checkpoint that no restore found unusable.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import structlog

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.signing import export_folder
from streamlet.backends.cluster.tree.store import Check, ClusterStore, Create, Found, Op, SetData, riding_out
from streamlet.backends.cluster.worker.part_replicator import PartReplicator, instances_to_restore
from streamlet.core.model import world
from streamlet.core.model.clock import Clock
from streamlet.core.state.checkpoints import Coordinator
from streamlet.core.state.durable import write_file
from streamlet.core.state.parts import merge_parts
from streamlet.core.state.savepoints import read_savepoint
from streamlet.core.state.store import decode, encode
from streamlet.errors import NodeExists, SpecError, VersionConflict

log = structlog.get_logger("streamlet")


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """Which run of a job this worker takes part in, and how to tell it is still current."""

    job: str
    attempt: int
    worker: str
    workers: list[str]  # every worker of the attempt, sorted
    assignment_version: int  # the fence: the assignment node's version when the attempt began


@dataclass(frozen=True, slots=True)
class RestoreScope:
    """What a worker's part of an attempt runs: which instances (``node.index``), each task's parallelism,
    and the segment tables the job routes by now (``{task: table data}``, from its live changes)."""

    local: frozenset[str]
    parallelism: dict[str, int]
    tables: dict[str, Any]

    def wanted(self, completed: dict[str, Any]) -> set[str]:
        """The instances whose state this part reads from the completed checkpoint ``completed``."""
        taken = completed.get("layout") or {}
        regrouped = {task for task, table in self.tables.items() if taken.get(task) != table}
        return instances_to_restore(completed["holders"], set(self.local), self.parallelism, regrouped)


class ZkAgreement:
    """The checkpoint :class:`~streamlet.core.state.checkpoints.Agreement` of one worker's part of an attempt."""

    def __init__(
        self,
        zk: ClusterStore,
        info: AttemptInfo,
        replicator: PartReplicator,
        scope: RestoreScope,
        interval: float | None,
        clock: Clock,
        savepoint: str | None = None,
        joining: bool = False,
        secret: bytes | None = None,
    ) -> None:
        self.zk = zk
        self.secret = secret  # checks the folder a savepoint asks for (None: this worker exports nothing)
        self.info = info
        self.job = info.job
        self.replicator = replicator
        self.scope = scope
        self.store = replicator.service.parts(replicator.key, info.attempt)
        self.exports: dict[int, str] = {}  # epoch -> where a savepoint wants this worker's part too
        self.interval = interval
        self.clock = clock
        self.trigger = paths.trigger_path(info.job, info.attempt)
        self.restored_from: int | None = None
        self._published = 0  # the newest epoch known complete
        self._triggered = 0  # the newest epoch triggered, by this attempt or an earlier one
        self._progress = anyio.Event()  # set (and replaced) at every completion
        self._trigger_seen: tuple[dict[str, Any], int | None] | None = None  # the trigger node, as last seen
        self._final_done = anyio.Event()
        self.savepoint = savepoint  # the job starts from it while it has no checkpoint of its own
        self.joining = joining  # a worker joining the running attempt: nothing to restore, epochs go on

    def coordinator(self) -> Coordinator:
        """The core coordinator of this worker's instances, saving parts locally and agreeing through this."""
        return Coordinator(self.job, self.store, self.clock, None, agreement=self)

    # -- restoring --------------------------------------------------------------

    async def restore_point(self) -> tuple[int, dict[str, Any]] | None:
        """The state of this part's instances at the job's last usable complete checkpoint, as one document."""
        self._triggered = await self._highest_triggered()  # epochs of a new attempt never repeat an old one's
        found = await self.zk.get(paths.completed(self.job))
        if self.joining:
            await self._join(found)
            return None
        done = None if found is None else await self._usable(found.data)
        if done is None:
            return await self._savepoint()
        epoch = int(done["epoch"])
        pieces = await self.replicator.read(done, self.scope.wanted(done))
        self.restored_from = self._published = epoch
        self._triggered = max(self._triggered, epoch)
        document = merge_parts(pieces, done)
        # A later attempt resumes even from the job's final checkpoint: its sources at their ends, its sinks
        # publishing what that checkpoint staged. (A finished document otherwise means "run it all again",
        # which for an attempt would commit every record a second time.)
        document["finished"] = False
        return epoch, document

    async def _usable(self, completed: dict[str, Any]) -> dict[str, Any]:
        """The last complete checkpoint: the only one a job resumes from. Its sinks may have committed its
        output already, so resuming from the one before it would commit that output twice; when no live
        worker holds a copy of some instance, the restore says so (``UnusableCheckpoint``) and the leader
        holds the job STALLED until a worker that holds it is back."""
        return completed

    async def _join(self, completed: Found[dict[str, Any]] | None) -> None:
        """A part joining the running attempt restores nothing (it has no instances yet: a live change brings
        them, with their state) and takes part from the next epoch on; the ones triggered so far complete
        without it (the change waits for them, and checkpoints wait for the change)."""
        trigger = await self.zk.get(self.trigger)
        if trigger is not None:
            self._triggered = max(self._triggered, int(trigger.data["epoch"]))
        if completed is not None and int(completed.data["attempt"]) == self.info.attempt:
            self._published = int(completed.data["epoch"])

    def join(self, workers: list[str]) -> None:
        """Workers that joined the attempt by a live change: from now on a checkpoint completes with their
        parts too (the first worker, which triggers, stays the first)."""
        joined = [worker for worker in sorted(workers) if worker not in self.info.workers]
        if joined:
            self.info = replace(self.info, workers=[*self.info.workers, *joined])

    async def _savepoint(self) -> tuple[int, dict[str, Any]] | None:
        """The savepoint the job was submitted to start from (``None``: none), while it has no checkpoint."""
        if self.savepoint is None:
            return None
        epoch, document = await world.blocking(read_savepoint, self.savepoint)
        self.restored_from = self._published = epoch
        self._triggered = max(self._triggered, epoch)
        return epoch, document

    async def _highest_triggered(self) -> int:
        highest = 0  # over earlier attempts only: this attempt's first trigger may already be out
        for name in await self.zk.children(paths.checkpoints(self.job)):
            attempt = paths.attempt_of(name)
            if attempt is not None and attempt < self.info.attempt:
                found = await self.zk.get(paths.trigger_path(self.job, attempt))
                highest = max(highest, 0 if found is None else int(found.data["epoch"]))
        return highest

    # -- triggering -------------------------------------------------------------

    async def run(self, coordinator: Coordinator) -> None:
        """Follow triggers and completions; the attempt's first worker also triggers."""
        await riding_out(self.zk.ensure, paths.checkpoint_acks(self.job, self.info.attempt))
        async with anyio.create_task_group() as group:
            group.start_soon(self._follow_triggers, coordinator)
            group.start_soon(self._follow_completions, coordinator)
            if self.interval is not None and self.info.worker == self.info.workers[0]:
                group.start_soon(self._tick)

    async def _tick(self) -> None:
        """Keep one checkpoint in flight per ``interval``: the next once the interval has passed since the last
        began and the last is complete (one at a time; a slow one is not piled upon). When a checkpoint took
        longer than the interval, the worker completing it publishes the next trigger in the same transaction
        (see ``_publish_completed``), and this loop only follows."""
        assert self.interval is not None
        while not self._final_done.is_set():
            began = self.clock.now()
            epoch = await riding_out(self._publish_trigger, False)
            if epoch is None:
                return  # the final checkpoint is under way
            while self._published < max(epoch, self._triggered) and not self._final_done.is_set():
                await self._progress.wait()
            await self.clock.sleep(max(0.0, began + self.interval - self.clock.now()))

    async def stop_checkpoint(self) -> int | None:
        """Graceful stop: a checkpoint before which every worker's sources stop reading; returns its epoch once
        it is complete everywhere (``None``: the job is finishing anyway)."""
        epoch = await riding_out(self._publish_trigger, False, True)
        while epoch is not None and self._published < epoch and not self._final_done.is_set():
            await self._progress.wait()
        return epoch

    async def _publish_trigger(self, final: bool, pause: bool = False) -> int | None:
        """Write the next epoch's trigger; returns it (``None`` once the final one is under way). A periodic
        trigger while another epoch is still in flight writes nothing and returns that epoch."""
        path = self.trigger
        while True:
            found = await self.zk.get(path)
            if found is not None and found.data.get("hold") is not None:
                await self.zk.wait_changed(path, found.version)  # a live change holds checkpoints until it is over
                continue
            if found is not None and found.data["final"]:
                return None  # the final checkpoint is under way: nothing comes after it
            in_flight = 0 if found is None else int(found.data["epoch"])
            if not (final or pause) and in_flight > self._published:
                return in_flight
            epoch = max(self._triggered, self._published, in_flight) + 1
            try:
                previous = None if found is None else found.data
                trigger = paths.next_trigger(previous, epoch, final=final, pause=pause, at=world.wall_time())
                if found is None:
                    await self.zk.create(path, trigger)
                else:
                    await self.zk.set(path, trigger, found.version)
                return epoch
            except (NodeExists, VersionConflict):
                continue  # another worker moved it first: look again

    async def _follow_triggers(self, coordinator: Coordinator) -> None:
        version: int | None = None
        begun = self._triggered  # epochs up to here belong to earlier attempts (or to the restored checkpoint)
        while True:
            data, version = await riding_out(self.zk.wait_changed, self.trigger, version)
            if data is None:
                continue
            epoch = int(data["epoch"])
            if data.get("since"):  # epochs before it are earlier attempts', even one triggered after we began
                begun = max(begun, int(data["since"]) - 1)
            self._triggered = max(self._triggered, epoch)
            self._trigger_seen = (data, version)
            if data.get("export"):
                self._note_export(epoch, data)
            for missed in range(begun + 1, epoch + 1):  # a watch may fold several changes into one
                last = missed == epoch
                await coordinator.begin(
                    missed, final=last and bool(data["final"]), pause=last and bool(data.get("pause"))
                )
            begun = max(begun, epoch)

    def _note_export(self, epoch: int, trigger: dict[str, Any]) -> None:
        """A savepoint wants this worker's part of ``epoch`` in a folder: only one signed for it, else none."""
        if self.secret is None:
            log.error("savepoint folder refused", job=self.job, epoch=epoch, reason="this worker holds no secret")
            return
        try:
            self.exports[epoch] = str(export_folder(self.secret, self.job, epoch, trigger))
        except SpecError as exc:  # the savepoint then fails on the missing part, naming it
            log.error("savepoint folder refused", job=self.job, epoch=epoch, reason=str(exc))

    # -- completing -------------------------------------------------------------

    async def saved(self, epoch: int, size: int, finished: bool) -> None:
        """This worker's part of ``epoch`` is saved: replicate it, then say so; the last worker to say so
        publishes it complete."""
        data = await world.blocking(self.store.path(epoch).read_bytes)
        export = self.exports.pop(epoch, None)
        if export is not None:  # a savepoint: its parts go to the folder the client reads, whole (chunks in)
            whole = encode(await world.blocking(self.store.read, epoch))
            await world.blocking(write_file, Path(export) / f"{self.info.worker}.msgpack", whole)
        replicas = await self.replicator.replicate(epoch, data)
        part = decode(data, f"part {epoch}")
        # the run that took it and its job id: a worker restoring only sinks (no state) still needs them to
        # publish what that run staged for the checkpoint (a sink's staged output is part of the checkpoint)
        ack = {"bytes": size, "replicas": replicas, "layout": part.get("layout", {}), "run": part.get("attempt"),
               "job_id": part.get("job")}  # fmt: skip
        await riding_out(self._acknowledge, epoch, ack, finished)

    async def _acknowledge(self, epoch: int, ack: dict[str, Any], finished: bool) -> None:
        acks = paths.checkpoint_acks(self.job, self.info.attempt, epoch)
        with contextlib.suppress(NodeExists):
            await self.zk.create(paths.child(acks, self.info.worker), ack)
        if set(await self.zk.children(acks)) >= set(self.info.workers):
            await self._publish_completed(epoch, finished, await self._holders(acks))

    async def _holders(self, acks: str) -> dict[str, Any]:
        """Who holds each instance's state (owner first), and the layout, from every worker's acknowledgement."""
        holders: dict[str, list[str]] = {}
        sizes: dict[str, int] = {}  # bytes of each instance's state, as its part's size shared out (for placement)
        layout: dict[str, Any] = {}
        run: dict[str, Any] = {}
        for worker in self.info.workers:
            found = await self.zk.get(paths.child(acks, worker))
            ack = {} if found is None else found.data
            layout = layout or ack.get("layout", {})
            run = {"run": ack.get("run"), "job_id": ack.get("job_id")} if "run" in ack else run
            replicas = ack.get("replicas", {})
            for instance, backups in replicas.items():
                holders[instance] = [worker, *backups]
                sizes[instance] = int(ack.get("bytes", 0)) // len(replicas)
        return {"holders": holders, "sizes": sizes, "layout": layout, **run}

    async def _publish_completed(self, epoch: int, finished: bool, where: dict[str, Any]) -> None:
        path = paths.completed(self.job)
        fence = (paths.assignment(self.job), self.info.assignment_version)
        value = {
            "attempt": self.info.attempt,
            "epoch": epoch,
            "workers": self.info.workers,
            "finished": finished,
            "at": world.wall_time(),
            **where,
        }
        next_trigger = self._next_trigger_if_due(epoch, finished)
        while True:
            found = await self.zk.get(path)
            if found is not None and (found.data["attempt"], found.data["epoch"]) >= (self.info.attempt, epoch):
                return  # a later checkpoint is published already
            if found is not None:  # kept: a restore falls back to it when this one has an instance nowhere intact
                value["previous"] = {key: item for key, item in found.data.items() if key != "previous"}
            steps: list[Op] = [
                Check(*fence),
                Create(path, value) if found is None else SetData(path, value, found.version),
            ]
            if await self.zk.commit(steps + next_trigger):
                return
            if next_trigger:
                next_trigger = []  # the trigger moved meanwhile (a final or pausing one): complete without it
                continue
            current = await self.zk.get(fence[0])
            if current is None or current.version != self.info.assignment_version:
                return  # the job moved on to another attempt: this one completes nothing

    def _next_trigger_if_due(self, epoch: int, finished: bool) -> list[Op]:
        """The next periodic trigger, when ``epoch`` took longer than the interval: it goes out with the
        completion in one transaction, instead of after a round trip through the triggering worker."""
        if self.interval is None or finished or self._trigger_seen is None:
            return []
        data, version = self._trigger_seen
        if version is None or int(data["epoch"]) != epoch or data["final"] or data.get("pause") or data.get("hold"):
            return []
        if world.wall_time() - float(data.get("at", world.wall_time())) < self.interval:
            return []
        trigger = paths.next_trigger(data, epoch + 1, final=False, pause=False, at=world.wall_time())
        return [SetData(self.trigger, trigger, version)]

    async def _follow_completions(self, coordinator: Coordinator) -> None:
        version: int | None = None
        while True:
            data, version = await riding_out(self.zk.wait_changed, paths.completed(self.job), version)
            if data is None or int(data["attempt"]) != self.info.attempt:
                continue
            epoch = int(data["epoch"])
            await coordinator.commit_through(epoch)
            self._published = max(self._published, epoch)
            self._progress.set()
            self._progress = anyio.Event()
            if data["finished"]:
                self._final_done.set()

    async def finished(self) -> None:
        """All local instances completed: once every worker's have, the final checkpoint commits the rest."""
        await riding_out(self._announce_finished)
        await self._final_done.wait()

    async def _announce_finished(self) -> None:
        with contextlib.suppress(NodeExists):
            await self.zk.create(
                paths.child(paths.checkpoint_finished(self.job, self.info.attempt), self.info.worker), {}
            )
        if set(await self.zk.children(paths.checkpoint_finished(self.job, self.info.attempt))) >= set(
            self.info.workers
        ):
            await self._publish_trigger(final=True)  # None when another worker wrote it first
