"""A worker's part of a checkpoint, replicated to backup workers and read back at a restore.

Saving: the part is on the owner's disk first (``replicas.ReplicaService.parts``);
then each instance's piece goes to its backup workers: those the leader's
backup location controller chose (``/jobs/<job>/backups``, see
``adaptation.backup_placement``) while they are live, else the next live
workers after the owner in name order. A backup acknowledges a piece in
ZooKeeper once it is stored (``acks/<epoch>/<owner>~<backup>``); the owner
acknowledges its part, with the map of who holds what, only after all of
its backups did, so a checkpoint completes only when every part has its
replicas. A backup that has not acknowledged within :data:`ACK_TIMEOUT` is
replaced by another live worker.

Restoring: every instance of the new attempt takes its state from a holder
of the last complete checkpoint — its own disk when it holds a copy (the
leader redeploys lost instances where their replicas are), else the other
holders over the data plane, owner first. A copy that is missing or fails
its checksum is logged and the next holder is asked; when no holder has an
instance intact the checkpoint is marked unusable and the attempt fails, so
the next one restores from the checkpoint before it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import anyio
import msgpack
import structlog

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.paths import task_of
from streamlet.backends.cluster.tree.registry import workers
from streamlet.backends.cluster.tree.store import ClusterStore, riding_out
from streamlet.backends.cluster.worker.replica_service import (
    TRANSFER_TIMEOUT,
    Address,
    ReplicaService,
    instances_of,
    piece,
)
from streamlet.core.model import world
from streamlet.core.state.changelog import chunks_named
from streamlet.core.state.parts import instances_per_task
from streamlet.core.state.store import decode
from streamlet.errors import CheckpointError, NodeExists, UnusableCheckpoint

log = structlog.get_logger("streamlet")
Holders = dict[str, list[str]]  # instance -> the workers holding its state, owner first
ACK_TIMEOUT = 3 * TRANSFER_TIMEOUT  # seconds a backup has to store a piece and say so (a slow disk, a busy loop)


def backups_for(
    owner: str, instances: list[str], live: list[str], plan: Mapping[str, list[str]], replicas: int
) -> dict[str, list[str]]:
    """Each instance's backup workers: the plan's while they are live (never the owner), topped up with the
    next live workers after the owner in name order; at most ``replicas`` (fewer when too few are live)."""
    others = sorted(worker for worker in live if worker != owner)
    ring = [worker for worker in others if worker > owner] + [worker for worker in others if worker < owner]
    chosen = {}
    for instance in instances:
        planned = [worker for worker in plan.get(instance, []) if worker in others]
        topped = planned + [worker for worker in ring if worker not in planned]
        chosen[instance] = topped[:replicas]
    return chosen


def instances_to_restore(
    holders: Holders, local: set[str], parallelism: Mapping[str, int], regrouped: set[str]
) -> set[str]:
    """The instances whose state this worker needs: its own, and every instance of a task it runs whose
    state is regrouped (its parallelism or segment table changed since the checkpoint: keys move between
    instances, so all of them are read)."""
    counts = instances_per_task(holders)
    mine = {task_of(instance) for instance in local}
    whole = {task for task in mine if task in regrouped or counts.get(task) != parallelism.get(task, counts.get(task))}
    return {instance for instance in holders if instance in local or task_of(instance) in whole}


class PartReplicator:
    """Replicates one worker's parts of one job attempt, and reads them back for a restore."""

    def __init__(
        self, zk: ClusterStore, service: ReplicaService, job: str, attempt: int, replicas: int, uid: str = ""
    ) -> None:
        self.zk = zk
        self.service = service
        self.job = job
        self.key = job_key(job, uid)  # its folders: a job removed and submitted again starts with none
        self.attempt = attempt
        self.replicas = replicas
        self.insist = False  # the job asked for this many copies: say so each time fewer are live
        self.me = service.me
        #: The chunks (of incremental checkpoints) each backup acknowledged holding, by the boot of the backup
        #: that did: a piece carries only the chunks its backup lacks. A backup that fails to acknowledge, or
        #: that started again since (its disk may be new), is sent every chunk its piece names.
        self.sent: dict[str, tuple[str, set[str]]] = {}
        self._boots: dict[str, str] = {}

    # -- saving -------------------------------------------------------------------

    async def replicate(self, epoch: int, data: bytes) -> dict[str, list[str]]:
        """Send every instance's piece of this worker's part of ``epoch`` (``data``) to its backups and wait
        until each backup acknowledged it (under the attempt's ``paths.checkpoint_acks``); returns instance ->
        backups."""
        document = decode(data, f"part {epoch} of {self.me}")
        instances = instances_of(document)
        if self.replicas == 0 or not instances:
            return {instance: [] for instance in instances}
        failed: set[str] = set()
        while True:
            addresses = await self._live_addresses()
            live = [worker for worker in addresses if worker not in failed]
            chosen = backups_for(self.me, instances, live, await self._plan(), self.replicas)
            if self.insist and any(len(backups) < self.replicas for backups in chosen.values()):
                log.warning("too few live workers for every replica", job=self.job, epoch=epoch, want=self.replicas)
            lagging = await self._send(epoch, document, chosen, addresses)
            if not lagging:
                return chosen
            failed |= lagging
            log.warning("backup did not acknowledge a replica, choosing another", job=self.job, epoch=epoch,
                        backups=sorted(lagging))  # fmt: skip

    async def _send(
        self,
        epoch: int,
        document: dict[str, Any],
        chosen: dict[str, list[str]],
        addresses: dict[str, Address],
    ) -> set[str]:
        """Push each backup its piece and wait for the acknowledgements; returns the backups that failed."""
        by_backup: dict[str, list[str]] = {}
        for instance, backups in chosen.items():
            for backup in backups:
                by_backup.setdefault(backup, []).append(instance)
        failed: set[str] = set()
        acks = paths.checkpoint_acks(self.job, self.attempt, epoch)
        await riding_out(self.zk.ensure, acks)
        extra = {"owner": self.me, "job_name": self.job, "job_key": self.key, "attempt_number": self.attempt}
        pieces = {backup: {**piece(document, held), **extra} for backup, held in by_backup.items()}
        named = {backup: chunks_named(each) for backup, each in pieces.items()}
        for backup, each in pieces.items():
            lacking = named[backup] - self._held_by(backup)
            if lacking:
                each["chunks"] = await world.blocking(self.service.chunks_for, self.key, self.attempt, lacking)
        async with anyio.create_task_group() as group:
            for backup, each in pieces.items():
                group.start_soon(self._push_one, backup, addresses[backup], each, failed)
        waiting = set(by_backup) - failed
        with anyio.move_on_after(ACK_TIMEOUT):
            for backup in sorted(waiting):  # one-shot watches: each returns once its node exists
                await riding_out(
                    self.zk.wait_changed, paths.replica_ack(self.job, self.attempt, epoch, self.me, backup), None
                )
        lagging = failed | (waiting - _acknowledged(await riding_out(self.zk.children, acks), self.me))
        for backup in by_backup:
            if backup in lagging:
                self.sent.pop(backup, None)
            else:
                self.sent[backup] = (self._boots.get(backup, ""), self._held_by(backup) | named[backup])
        return lagging

    def _held_by(self, backup: str) -> set[str]:
        """The chunks ``backup`` acknowledged holding since it last started (none if it started again)."""
        boot, held = self.sent.get(backup, ("", set()))
        return held if boot == self._boots.get(backup, "") else set()

    async def _push_one(self, backup: str, address: Address, document: dict[str, Any], failed: set[str]) -> None:
        try:
            await self.service.push(address, document, backup)
        except (TimeoutError, OSError) as exc:
            log.warning("replica push failed", job=self.job, backup=backup, reason=str(exc))
            failed.add(backup)

    async def _plan(self) -> dict[str, list[str]]:
        found = await riding_out(self.zk.get, paths.backups(self.job))
        return {} if found is None else dict(found.data.get("backups", {}))

    async def _live_addresses(self) -> dict[str, Address]:
        # ridden out: a suspended session (the store out of reach a moment) must not fail the checkpoint
        views = await riding_out(workers, self.zk)
        self._boots = {view.worker_id: str(view.info.get("boot", "")) for view in views}
        return {view.worker_id: (view.info["host"], int(view.info["data_port"])) for view in views}

    # -- restoring ----------------------------------------------------------------

    async def read(self, completed: dict[str, Any], wanted: set[str]) -> list[dict[str, Any]]:
        """Pieces holding every instance of ``wanted`` at the completed checkpoint ``completed``: from this
        worker's own copies first, then from the other holders. ``CheckpointError`` when some instance has
        no intact copy anywhere (the checkpoint is marked unusable first)."""
        epoch, attempt = int(completed["epoch"]), int(completed["attempt"])
        holders: Holders = completed["holders"]
        owners = _owners(holders, wanted)
        views = await riding_out(workers, self.zk)  # ridden out: the store out of reach a moment fails nothing
        addresses = {view.worker_id: (view.info["host"], int(view.info["data_port"])) for view in views}
        boots = {view.worker_id: str(view.info.get("boot", "")) for view in views}
        pieces = []
        for owner, instances in sorted(owners.items()):
            pieces.extend(await self._read_owned(epoch, attempt, owner, instances, holders, addresses, boots))
        return pieces

    async def _read_owned(
        self,
        epoch: int,
        attempt: int,
        owner: str,
        instances: list[str],
        holders: Holders,
        addresses: dict[str, Address],
        boots: dict[str, str],
    ) -> list[dict[str, Any]]:
        """``instances`` (all of ``owner``'s part) from whoever holds them, this worker first."""
        remaining, found, unreachable = list(instances), [], set()
        candidates = sorted({h for i in instances for h in holders[i]}, key=lambda h: (h != self.me, h != owner, h))
        for holder in candidates:
            here = [instance for instance in remaining if holder in holders[instance]]
            if not here or (holder != self.me and holder not in addresses):
                continue
            try:
                found.append(await self._read_from(holder, epoch, attempt, owner, here, addresses))
            except (OSError, ValueError, TimeoutError, CheckpointError, msgpack.UnpackException) as exc:
                log.warning("checkpoint copy unusable, asking the next holder", job=self.job, epoch=epoch,
                            owner=owner, holder=holder, reason=f"{type(exc).__name__}: {exc}")  # fmt: skip
                if isinstance(exc, OSError | TimeoutError):  # no answer: it may still hold a copy
                    unreachable.add(holder)
                continue
            remaining = [instance for instance in remaining if instance not in here]
            if not remaining:
                return found
        held_by = sorted({h for i in remaining for h in holders[i]})
        await self._mark_unusable(epoch, {
            "instances": remaining, "holders": held_by, "workers": sorted(addresses), "boots": boots,
            "unreachable": sorted(unreachable), "at": world.wall_time(),
        })  # fmt: skip
        raise UnusableCheckpoint(
            f"checkpoint {epoch} of job '{self.job}': no live worker holds an intact copy of {', '.join(remaining)} "
            f"(held by {', '.join(sorted({h for i in remaining for h in holders[i]}))})",
            epoch,
        )

    async def _read_from(
        self, holder: str, epoch: int, attempt: int, owner: str, instances: list[str], addresses: dict[str, Address]
    ) -> dict[str, Any]:
        if holder == self.me:
            read = self.service.read_piece
            return await world.blocking(read, self.key, attempt, epoch, owner, instances)
        return await self.service.fetch(addresses[holder], holder, self.key, attempt, epoch, owner, instances)

    async def _mark_unusable(self, epoch: int, marker: dict[str, Any]) -> None:
        """Say which instances of checkpoint ``epoch`` no live worker could give, who holds them, which
        workers (which boot of each) were registered then and which holders did not answer: the leader tries
        again once the registered workers change, or after a while when a holder may have been cut off."""
        await riding_out(self.zk.ensure, paths.unusable(self.job))
        try:
            await riding_out(self.zk.create, paths.unusable_epoch(self.job, epoch), marker)
        except NodeExists:
            await riding_out(self.zk.set, paths.unusable_epoch(self.job, epoch), marker)


async def acknowledge_stored(zk: ClusterStore, me: str, piece: dict[str, Any], owner: str, size: int) -> None:
    """A backup's acknowledgement (``ReplicaService.on_stored``): ``owner``'s piece is stored on ``me``; the
    owner waits for it before it acknowledges its part."""
    job, attempt, epoch = str(piece["job_name"]), int(piece["attempt_number"]), int(piece["epoch"])
    with contextlib.suppress(NodeExists):
        path = paths.replica_ack(job, attempt, epoch, owner, me)
        await riding_out(zk.create, path, {"bytes": size})


def job_key(job: str, uid: str) -> str:
    """The name of a job's folders on a worker: the job's name and its submission's uid (epochs restart at 1
    when a removed job's name is used again; its old files must never be taken for the new one's)."""
    return f"{job}.{uid}" if uid else job


def _acknowledged(children: list[str], owner: str) -> set[str]:
    """The backups that acknowledged a piece of ``owner``'s part, from the ack node's children."""
    prefix = f"{owner}~"
    return {name.removeprefix(prefix) for name in children if name.startswith(prefix)}


def _owners(holders: Holders, wanted: set[str]) -> dict[str, list[str]]:
    """Wanted instances grouped by the worker whose part holds them (the first holder)."""
    owners: dict[str, list[str]] = {}
    for instance in sorted(wanted):
        owners.setdefault(holders[instance][0], []).append(instance)
    return owners
