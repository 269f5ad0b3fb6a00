"""Checkpoints of a job whose instances run on several workers.

Each worker runs a :class:`ClusterCheckpoints`: the core's aligned-barrier
coordinator for its own instances, made to agree with the other workers of
the same attempt through ZooKeeper::

    /jobs/<job>/checkpoints/completed                     {"attempt", "epoch", "workers", "finished"}
    /jobs/<job>/checkpoints/attempt-<n>/trigger           {"epoch": e, "final": bool}
    /jobs/<job>/checkpoints/attempt-<n>/acks/<e>/<worker> the worker's part of epoch e is saved
    /jobs/<job>/checkpoints/attempt-<n>/finished/<worker> all of the worker's instances have completed

One worker (the first of the attempt) writes the trigger every interval,
after the previous checkpoint completed; every worker injects the barrier
at its local sources when it sees it. When all of a worker's instances
have snapshotted epoch e, it saves its *part* (the snapshots, by instance
index) under ``<directory>/<job>/attempt-<n>/<worker>/`` and acknowledges.
The worker whose acknowledgement is the last one publishes ``completed``,
in one ZooKeeper transaction with a check that the job's assignment is
still the one it runs: a worker of a replaced attempt (a zombie) can never
complete a checkpoint. Every worker commits its sinks' output up to the
published epoch when it sees it. A new attempt restores from the parts of
the last completed epoch, merged into one checkpoint document.

The directory must be reachable by every worker under the same path (on
one machine it is; across machines, a shared filesystem).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio

from streamlet.backends.cluster import paths
from streamlet.backends.cluster.store import (
    ClusterStore,
    CoordinationError,
    NodeExists,
    VersionConflict,
    write_fenced,
)
from streamlet.core.checkpoint import Coordinator, _Pending
from streamlet.core.checkpoint_store import DirectoryCheckpointStore, decode, encode
from streamlet.core.clock import Clock
from streamlet.core.instance import SourceInstance, _maybe_await
from streamlet.core.task_instance import TaskInstance
from streamlet.errors import JobError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """Which run of a job this worker takes part in, and how to tell it is still current."""

    job: str
    attempt: int
    worker: str
    workers: list[str]  # every worker of the attempt, sorted
    assignment_version: int  # the fence: the assignment node's version when the attempt began


def completed_path(job: str) -> str:
    """Where the job's last completed checkpoint is published."""
    return f"{paths.checkpoints(job)}/completed"


def part_store(directory: Path, job: str, attempt: int, worker: str) -> DirectoryCheckpointStore:
    """Where ``worker`` keeps its parts of ``attempt``'s checkpoints."""
    return DirectoryCheckpointStore(directory / job / f"attempt-{attempt}" / worker)


class ClusterCheckpoints(Coordinator):
    """Aligned checkpoints for the instances of one worker, agreed with the others through ZooKeeper."""

    def __init__(
        self, zk: ClusterStore, info: AttemptInfo, directory: Path, interval: float | None, clock: Clock
    ) -> None:
        super().__init__(info.job, part_store(directory, info.job, info.attempt, info.worker), clock, interval)
        self.zk = zk
        self.info = info
        self.directory = directory
        self.base = f"{paths.checkpoints(info.job)}/attempt-{info.attempt}"
        self.restored_from: int | None = None
        self._published = 0  # the newest epoch known complete
        self._triggered = 0
        self._sizes: dict[int, int] = {}
        self._final_done = anyio.Event()

    # -- restoring --------------------------------------------------------------

    async def restore_point(self) -> tuple[int, dict[str, Any]] | None:
        """The parts of the job's last completed checkpoint, merged into one document."""
        found = await self.zk.get(completed_path(self.job))
        if found is None:
            return None
        done = found[0]
        epoch, attempt = int(done["epoch"]), int(done["attempt"])

        def read_parts() -> list[dict[str, Any]]:
            stores = [part_store(self.directory, self.job, attempt, worker) for worker in done["workers"]]
            return [decode(store.path(epoch).read_bytes()) for store in stores]

        try:
            parts = await anyio.to_thread.run_sync(read_parts)
        except (OSError, ValueError) as exc:
            raise JobError(f"checkpoint {epoch} of job '{self.job}' cannot be read: {exc}") from exc
        self.restored_from = self._published = self._triggered = epoch
        return epoch, merge_parts(parts)

    # -- triggering -------------------------------------------------------------

    async def run(self) -> None:
        """Follow triggers and completions; the attempt's first worker also triggers."""
        await self.zk.ensure(f"{self.base}/acks")
        async with anyio.create_task_group() as group:
            group.start_soon(self._follow_triggers)
            group.start_soon(self._follow_completions)
            if self.interval is not None and self.info.worker == self.info.workers[0]:
                group.start_soon(self._tick)
            async for epoch in self._ready[1]:
                await self._complete(epoch, finished=epoch == self._finishing)
            group.cancel_scope.cancel()

    async def _tick(self) -> None:
        assert self.interval is not None
        while self._finishing is None:
            await self.clock.sleep(self.interval)
            if self._published >= self._triggered:  # one checkpoint at a time
                await _riding_out(self._publish_trigger, False)

    async def _publish_trigger(self, final: bool) -> None:
        path = f"{self.base}/trigger"
        while True:
            found = await self.zk.get(path)
            if found is not None and found[0]["final"]:
                return  # the final checkpoint is under way: nothing comes after it
            epoch = (self._published if found is None else int(found[0]["epoch"])) + 1
            try:
                if found is None:
                    await self.zk.create(path, {"epoch": epoch, "final": final})
                else:
                    await self.zk.set(path, {"epoch": epoch, "final": final}, found[1])
                return
            except (NodeExists, VersionConflict):
                continue  # another worker moved it first: look again

    async def _follow_triggers(self) -> None:
        version: int | None = None
        while True:
            data, version = await _riding_out(self.zk.wait_changed, f"{self.base}/trigger", version)
            if data is None:
                continue
            epoch = int(data["epoch"])
            if data["final"]:
                self._finishing = epoch
            self._triggered = max(self._triggered, epoch)
            for missed in range(self.next_epoch, epoch + 1):  # a watch may fold several changes into one
                await self._begin(missed)

    def _pending_for(self, epoch: int) -> _Pending | None:
        # a barrier from another worker may arrive before this worker has seen the trigger
        if epoch <= self._published:
            return None
        return self._pending.setdefault(epoch, _Pending())

    # -- completing -------------------------------------------------------------

    async def _complete(self, epoch: int, finished: bool = False) -> None:
        data = encode(self._part(epoch, self._pending[epoch], finished))
        await _maybe_await(self.store.save(epoch, data))
        self._sizes[epoch] = len(data)
        await _riding_out(self._acknowledge, epoch, len(data), finished)

    async def _acknowledge(self, epoch: int, size: int, finished: bool) -> None:
        """Say this worker's part of ``epoch`` is saved; the last worker to say so publishes it complete."""
        acks = f"{self.base}/acks/{epoch}"
        with contextlib.suppress(NodeExists):
            await self.zk.create(f"{acks}/{self.info.worker}", {"bytes": size})
        if set(await self.zk.children(acks)) >= set(self.info.workers):
            await self._publish_completed(epoch, finished)

    def _part(self, epoch: int, pending: _Pending, finished: bool) -> dict[str, Any]:
        sources: dict[str, list[Any]] = {}
        tasks: dict[str, list[Any]] = {}
        for instance in self.instances:
            entry = [instance.index, pending.snapshots[instance.node.name, instance.index]]
            if isinstance(instance, SourceInstance):
                sources.setdefault(instance.node.name, []).append(entry)
            elif isinstance(instance, TaskInstance):
                tasks.setdefault(instance.node.name, []).append(entry)
        return {"epoch": epoch, "job": self.job, "finished": finished, "sources": sources, "tasks": tasks}

    async def _publish_completed(self, epoch: int, finished: bool) -> None:
        path = completed_path(self.job)
        fence = (paths.assignment(self.job), self.info.assignment_version)
        value = {
            "attempt": self.info.attempt,
            "epoch": epoch,
            "workers": self.info.workers,
            "finished": finished,
            "at": time.time(),
        }
        while True:
            found = await self.zk.get(path)
            if found is not None and (found[0]["attempt"], found[0]["epoch"]) >= (self.info.attempt, epoch):
                return  # a later checkpoint is published already
            if await write_fenced(self.zk, path, value, None if found is None else found[1], fence):
                return
            current = await self.zk.get(fence[0])
            if current is None or current[1] != self.info.assignment_version:
                return  # the job moved on to another attempt: this one completes nothing

    async def _follow_completions(self) -> None:
        version: int | None = None
        while True:
            data, version = await _riding_out(self.zk.wait_changed, completed_path(self.job), version)
            if data is None or int(data["attempt"]) != self.info.attempt:
                continue
            epoch = int(data["epoch"])
            for saved in sorted(e for e in self._sizes if e <= epoch):
                await self._commit(saved)
                self._completed(saved, self._sizes.pop(saved))
            self._published = max(self._published, epoch)
            if data["finished"]:
                self._final_done.set()

    async def finish(self) -> None:
        """All local instances completed: once every worker's have, the final checkpoint commits the rest."""
        await _riding_out(self._announce_finished)
        await self._final_done.wait()
        await self._close_sinks()

    async def _announce_finished(self) -> None:
        with contextlib.suppress(NodeExists):
            await self.zk.create(f"{self.base}/finished/{self.info.worker}", {})
        if set(await self.zk.children(f"{self.base}/finished")) >= set(self.info.workers):
            await self._publish_trigger(final=True)


async def _riding_out(call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``call(*args)``, retried while the ZooKeeper session is suspended or being re-established.

    A worker whose session is gone for good is replaced by a newer attempt, which cancels this one.
    """
    while True:
        try:
            return await call(*args)
        except CoordinationError:
            await anyio.sleep(0.2)


def merge_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One checkpoint document from the workers' parts: each node's snapshots in instance order."""
    merged: dict[str, Any] = {
        "epoch": parts[0]["epoch"],
        "job": parts[0]["job"],
        "finished": all(part["finished"] for part in parts),
    }
    for section in ("sources", "tasks"):
        by_node: dict[str, dict[int, Any]] = {}
        for part in parts:
            for name, entries in part[section].items():
                by_node.setdefault(name, {}).update({int(index): snapshot for index, snapshot in entries})
        merged[section] = {}
        for name, snapshots in by_node.items():
            if sorted(snapshots) != list(range(len(snapshots))):
                raise JobError(f"checkpoint {merged['epoch']}: instances of '{name}' are missing from its parts")
            merged[section][name] = [snapshots[index] for index in range(len(snapshots))]
    return merged
