"""Checkpoint coordination (Flink's asynchronous barrier snapshots, aligned).

The coordinator asks every source instance to inject ``Barrier(epoch)``;
each instance reports its snapshot when the barrier has arrived on all its
open channels; when every instance has reported, the checkpoint is complete:
it is saved to the :class:`~streamlet.core.state.store.CheckpointStore`
and only then are the sinks told to ``commit(epoch)`` and the sources'
readers ``checkpoint_complete(epoch, position)``. Instances that have
already completed report their final snapshot at once (a completed sink
stages what it still holds).

Alone (in one process) the coordinator triggers every ``interval`` and a
checkpoint is complete when its local instances have answered. Across
processes it is given an :class:`Agreement`: the agreement tells it which
epochs begin (``begin``) and which are complete everywhere
(``commit_through``); the coordinator saves its *part* (its own instances,
by index) and tells the agreement it is saved. The cluster implements the
agreement over ZooKeeper; this module knows nothing of that.

A checkpoint document::

    {"epoch": 7, "job": "wordcount", "finished": False,
     "attempt": "3f9c0a1b2d4e",                     # the run that took it (``Job(attempt=...)``)
     "sources": {"lines": [position, ...]},         # one entry per instance
     "tasks": {"count": [{"state": [[k, v], ...], "window": ..., "finished": False,
                          "timers": ...,             # pending timers (absent in older checkpoints)
                          "state_written": ...},     # with state_ttl: each key's last write time
                         ...]}}
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import anyio
import structlog

from streamlet.core.model import world
from streamlet.core.model.clock import Clock
from streamlet.core.model.encoding import encoding_error, first_unencodable
from streamlet.core.model.histogram import LatencyHistogram
from streamlet.core.model.hooks import maybe_await
from streamlet.core.state.changelog import store_increments
from streamlet.core.state.participant import SECTIONS, Participant
from streamlet.core.state.store import CheckpointStore, ChunkStore, encode, keeps_chunks
from streamlet.errors import EncodingError, JobError

log = structlog.get_logger("streamlet")


@dataclass
class _Pending:
    snapshots: dict[tuple[str, int], Any] = field(default_factory=dict)
    done: anyio.Event = field(default_factory=anyio.Event)
    began: float = field(default_factory=world.monotonic)
    abandoned: bool = False


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """The last completed checkpoint: epoch, bytes written (the document and its new chunks) and time from
    trigger to saved."""

    epoch: int
    size_bytes: int
    seconds: float


class Agreement(Protocol):
    """How one process's checkpoints agree with the other processes running the same job."""

    async def restore_point(self) -> tuple[int, dict[str, Any]] | None:
        """The job's last checkpoint complete everywhere, merged into one document; ``None``: a fresh start."""

    async def run(self, coordinator: Coordinator) -> None:
        """Until cancelled: call ``coordinator.begin(epoch, final)`` for every epoch that starts and
        ``coordinator.commit_through(epoch)`` once an epoch is complete everywhere (and trigger epochs)."""

    async def saved(self, epoch: int, size: int, finished: bool) -> None:
        """This process's part of ``epoch`` is saved (``size`` bytes)."""

    async def finished(self) -> None:
        """Every local instance has completed: return once the job's final checkpoint is committed."""


class Coordinator:
    """Triggers checkpoints, collects the instances' snapshots, saves and commits."""

    def __init__(
        self,
        job: str,
        store: CheckpointStore,
        clock: Clock,
        interval: float | None,
        agreement: Agreement | None = None,
    ) -> None:
        self.job = job
        self.store = store
        self.clock = clock
        self.interval = interval
        self.agreement = agreement
        self.instances: Sequence[Participant] = []
        self.next_epoch = 1
        self.published = 0  # the newest epoch complete everywhere (with an agreement)
        self.attempt = "0"  # the run whose instances are attached (set by attach)
        self.completed = 0
        self.last: CheckpointInfo | None = None
        self.durations = LatencyHistogram()  # seconds from each checkpoint's start to its completion
        self._pending: dict[int, _Pending] = {}
        self._reporting = anyio.Lock()  # completed instances answer one epoch at a time, in order
        self._saved: dict[int, int] = {}  # epoch -> size of the part saved, awaiting commit_through
        self._finishing: int | None = None
        self._closed = False
        self._ready = anyio.create_memory_object_stream[int](100)
        self.failure: Exception | None = None  # what stopped run(): a save, a commit or a sink's staging failed
        self._paused = 0  # reconfigurations under way: no checkpoint may begin (they are cuts of their own)
        self._resumed = anyio.Event()
        #: The segment table of every task, as plain data, for the checkpoint document (a restore re-splits
        #: state when the layout it resumes with differs). Set by the job.
        self.layout: Callable[[], dict[str, Any]] = dict
        #: A savepoint to start from instead of the store's newest checkpoint (set by the job).
        self.start_from: tuple[int, dict[str, Any]] | None = None

    @property
    def incremental(self) -> bool:
        """Whether a checkpoint may hold only what changed in a state (its store keeps chunks)."""
        return keeps_chunks(self.store)

    def attach(self, instances: Sequence[Participant], last_epoch: int | None, attempt: str) -> None:
        """The instances of run ``attempt`` of the job; epochs continue after ``last_epoch``."""
        self.instances = instances
        self.next_epoch = (last_epoch or 0) + 1
        self.published = last_epoch or 0
        self.attempt = attempt

    # -- triggering -----------------------------------------------------------

    @asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No checkpoint in flight inside the block: the ones pending complete first, none begins until the
        block is left (a reconfiguration changes instances and channels: barriers must not cross it)."""
        self._paused += 1
        try:
            while self._pending:
                await next(iter(self._pending.values())).done.wait()
            yield
        finally:
            self._paused -= 1
            if not self._paused:
                self._resumed.set()
                self._resumed = anyio.Event()

    async def checkpoint(self) -> int:
        """Take a checkpoint now and wait until it is complete; returns its epoch."""
        while self._paused:
            await self._resumed.wait()
        if self._closed:
            raise JobError(f"job '{self.job}' has ended: no more checkpoints")
        epoch = await self.trigger()
        pending = self._pending[epoch]
        await pending.done.wait()
        if pending.abandoned and self.failure is not None:
            raise self.failure  # the reason the job ended, not only that it did
        if pending.abandoned:
            raise JobError(f"checkpoint {epoch} of job '{self.job}' did not complete: the job ended first")
        return epoch

    def close(self) -> None:
        """The job is over: checkpoints still pending will never complete."""
        self._closed = True
        self._ready[0].close()
        self._ready[1].close()
        for pending in self._pending.values():
            pending.abandoned = True
            pending.done.set()

    async def trigger(self) -> int:
        """Start checkpoint ``epoch`` (the next one) without waiting for it."""
        epoch = self.next_epoch
        await self._begin(epoch)
        return epoch

    async def begin(self, epoch: int, final: bool = False, pause: bool = False) -> None:
        """Checkpoint ``epoch`` starts (``final``: the last one, once every instance has completed;
        ``pause``: the sources stop reading first, so that it holds everything read: a graceful stop)."""
        if final:
            self._finishing = epoch
        if pause:
            for instance in self.instances:
                instance.pause()
        await self._begin(epoch)

    async def _begin(self, epoch: int) -> None:
        """Ask the sources for barrier ``epoch``; completed instances answer at once."""
        self.next_epoch = max(self.next_epoch, epoch + 1)
        self._pending.setdefault(epoch, _Pending())
        if not self.instances and not self._closed:  # a part of a job with nothing here (all moved away): done
            self._ready[0].send_nowait(epoch)
        for instance in self.instances:
            if instance.completed:
                await self.report_completed(instance, epoch)
            else:
                instance.request_barrier(epoch)

    async def report_completed(self, instance: Participant, epoch: int | None = None) -> None:
        """``instance`` has completed: answer every pending epoch up to ``epoch`` (or all of them), oldest
        first, with its final snapshot.

        The instance itself calls this when it completes, and a checkpoint beginning meanwhile calls it
        too: one lock, and epochs always in order, so a sink stages each epoch once and never a later
        epoch before an earlier one (whose restore would then drop what the later one holds).
        """
        async with self._reporting:
            epochs = sorted(e for e in self._pending if epoch is None or e <= epoch)
            for pending_epoch in epochs:
                pending = self._pending.get(pending_epoch)
                if pending is None or (instance.node.name, instance.index) in pending.snapshots:
                    continue
                await instance.prepare_commit(pending_epoch)  # a completed sink stages what it still holds
                self.ack(pending_epoch, instance.node.name, instance.index, instance.final_snapshot())

    def unanswered(self, node: str, index: int) -> list[int]:
        """The epochs under way that participant ``(node, index)`` has not answered, oldest first."""
        return sorted(epoch for epoch, pending in self._pending.items() if (node, index) not in pending.snapshots)

    def ack(self, epoch: int, node: str, index: int, snapshot: Any) -> None:
        """Participant ``(node, index)`` has its snapshot for ``epoch``."""
        pending = self._pending_for(epoch)
        if pending is None:
            return
        pending.snapshots[node, index] = snapshot
        if len(pending.snapshots) == len(self.instances) and not self._closed:
            self._ready[0].send_nowait(epoch)

    def _pending_for(self, epoch: int) -> _Pending | None:
        if self.agreement is None:
            return self._pending.get(epoch)  # alone, every epoch starts with trigger()
        # a barrier from another process may arrive before the agreement has said that its epoch began
        return None if epoch <= self.published else self._pending.setdefault(epoch, _Pending())

    async def restore_point(self) -> tuple[int, dict[str, Any]] | None:
        """The checkpoint a job resumes from: ``(epoch, document)``, or ``None`` for a fresh start."""
        if self.agreement is not None:
            return await self.agreement.restore_point()
        if self.start_from is not None:
            epoch, document = self.start_from
            stored = await world.blocking(self.store.epochs)
            return max([epoch, *stored]), document  # epochs go on after any the store holds already
        return await world.blocking(self.store.latest)

    # -- completing -------------------------------------------------------------

    async def run(self) -> None:
        """Save and commit checkpoints as they complete; trigger one every ``interval`` (or follow the agreement)."""
        async with anyio.create_task_group() as group:
            if self.agreement is not None:
                group.start_soon(self._stopping_on_failure, self._follow_agreement, group.cancel_scope)
            elif self.interval is not None:
                group.start_soon(self._stopping_on_failure, self._tick, group.cancel_scope)
            await self._stopping_on_failure(self._complete_ready, group.cancel_scope)
            group.cancel_scope.cancel()  # no checkpoint can complete any more: stop triggering and following
        if self.failure is not None:
            raise self.failure

    async def _follow_agreement(self) -> None:
        assert self.agreement is not None
        await self.agreement.run(self)

    async def _stopping_on_failure(self, step: Callable[[], Awaitable[None]], scope: anyio.CancelScope) -> None:
        try:
            await step()
        except Exception as exc:  # noqa: BLE001 - raised by run() as itself, not inside an exception group
            self.failure = self.failure or exc
            scope.cancel()

    async def _complete_ready(self) -> None:
        async for epoch in self._ready[1]:
            await self._complete(epoch, finished=epoch == self._finishing)

    async def _tick(self) -> None:
        assert self.interval is not None
        while True:
            await self.clock.sleep(self.interval)
            if self._finishing is not None:
                return  # after the final checkpoint the sinks close: another would stage into a closed writer
            if not self._pending and not self._paused:  # one at a time, and never across a reconfiguration
                await self.trigger()

    async def _complete(self, epoch: int, finished: bool = False) -> None:
        pending = self._pending[epoch]
        document = self._document(epoch, pending, finished)
        chunks = store_increments(document, cast(ChunkStore, self.store).save_chunk) if self.incremental else 0
        try:
            data = encode(document)  # on the loop: the state is bytes already
        except (TypeError, ValueError, OverflowError) as exc:  # a value in a window or a position: say whose
            raise _unencodable(epoch, pending.snapshots) from exc
        # Not in a worker thread: while the loop keeps the GIL busy, a thread waits ~5 ms to get it back
        # after each system call (the convoy effect), which made a 2 ms save take most of a second.
        await maybe_await(self.store.save(epoch, data))
        if self.agreement is not None:
            self._saved[epoch] = len(data)  # committed when the agreement says every process has its part
            await self.agreement.saved(epoch, len(data), finished)
            return
        await self._commit(epoch)
        self._completed(epoch, len(data) + chunks)

    async def commit_through(self, epoch: int) -> None:
        """Every process has saved its part of ``epoch``: commit it and every earlier local part."""
        for saved in sorted(e for e in self._saved if e <= epoch):
            await self._commit(saved)
            self._completed(saved, self._saved.pop(saved))
        self.published = max(self.published, epoch)

    async def _commit(self, epoch: int) -> None:
        """Checkpoint ``epoch`` is complete: the sinks publish its output, then the sources hear of it."""
        pending = self._pending[epoch]
        for instance in self.instances:
            await instance.publish(epoch)
        for instance in self.instances:  # after the sinks: a source acknowledges input whose output is out
            await instance.acknowledge(epoch, pending.snapshots[instance.node.name, instance.index])

    def _completed(self, epoch: int, size: int) -> None:
        pending = self._pending.pop(epoch)
        self.completed += 1
        self.last = CheckpointInfo(epoch, size, world.monotonic() - pending.began)
        self.durations.add(self.last.seconds)
        pending.done.set()

    def _document(self, epoch: int, pending: _Pending, finished: bool) -> dict[str, Any]:
        sections: dict[str, dict[str, list[Any]]] = {section: {} for section in SECTIONS}
        for instance in self.instances:
            if instance.section is None:
                continue
            snapshot = pending.snapshots[instance.node.name, instance.index]
            if self.agreement is not None:  # a part holds some instances of a node: say which
                snapshot = [instance.index, snapshot]
            sections[instance.section].setdefault(instance.node.name, []).append(snapshot)
        return {
            "epoch": epoch, "job": self.job, "finished": finished, "attempt": self.attempt, **sections,
            "layout": self.layout(),
        }  # fmt: skip

    async def finish(self) -> None:
        """The job ended normally: a final checkpoint commits what sinks still hold, then they close."""
        if self.agreement is not None:
            await self.agreement.finished()  # the agreement begins the final epoch once every process is done
            await self._close_sinks()
            return
        epoch = self.next_epoch
        self._finishing = epoch
        await self.trigger()  # every instance has completed, so every answer comes at once
        await self._pending[epoch].done.wait()
        await self._close_sinks()

    async def _close_sinks(self) -> None:
        for instance in self.instances:
            await instance.close_output()


def _unencodable(epoch: int, snapshots: dict[tuple[str, int], Any]) -> EncodingError:
    """The error naming the first instance whose snapshot for ``epoch`` cannot be encoded."""
    for (node, index), snapshot in snapshots.items():
        if first_unencodable(snapshot) is not None:
            return encoding_error(snapshot, f"checkpoint {epoch}: the snapshot of '{node}' instance {index}")
    return EncodingError(f"checkpoint {epoch} cannot be encoded", value_type="unknown")
