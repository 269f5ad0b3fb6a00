"""Checkpoints of a job run in several worker processes: the core's ``Agreement``, with the parent leading.

Each worker process runs the core's aligned-barrier coordinator for its own
instances, given a :class:`PartAgreement`. The parent
(:class:`CheckpointLeader`) plays the part ZooKeeper and the first worker
play on a cluster:

1. every ``checkpoint_interval`` seconds, while none is in flight, it starts
   the next epoch in every process (``checkpoint``);
2. each process snapshots its instances at the barrier and sends its *part*
   (the encoded snapshots, by instance index: ``part``);
3. with every part in, the parent merges them (the cluster's
   ``merge_parts``) into the document a job in one process writes, saves it
   in the job's own checkpoint store (``checkpoint_dir=``: the same files,
   so a run with any number of processes, or in one, resumes from it), and
   tells every process to commit (``committed``): sinks publish, sources
   acknowledge;
4. once every process has said all its instances completed (``finished``),
   the parent starts the final epoch, as a job in one process does.

The restore point (the store's newest checkpoint, or a savepoint) is read by
the parent before the fork, so every process starts from the same document
without it being sent. Epochs go on after it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from streamlet.core.model.clock import Clock
from streamlet.core.model.histogram import LatencyHistogram
from streamlet.core.model.hooks import maybe_await
from streamlet.core.state.checkpoints import CheckpointInfo, Coordinator
from streamlet.core.state.parts import merge_parts
from streamlet.core.state.store import CheckpointStore, decode, encode

Send = Callable[[dict[str, Any]], Awaitable[None]]
RestorePoint = tuple[int, dict[str, Any]] | None


class PartStore:
    """Where a process's coordinator saves its part: kept here until it is sent to the parent."""

    def __init__(self) -> None:
        self.parts: dict[int, bytes] = {}

    def save(self, epoch: int, data: bytes) -> None:
        """Keep the part of ``epoch``."""
        self.parts[epoch] = data

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """Nothing: the parent reads the restore point."""
        return None

    def epochs(self) -> list[int]:
        """Epochs of parts not sent yet."""
        return sorted(self.parts)


class PartAgreement:
    """A worker process's side (core's ``Agreement``): follow the parent's epochs and commits, send parts."""

    def __init__(self, send: Send, restore: RestorePoint) -> None:
        self.send = send
        self.restore = restore
        self.store = PartStore()
        self._orders, self._inbox = anyio.create_memory_object_stream[dict[str, Any]](math.inf)
        self._final_done = anyio.Event()

    def coordinator(self, job: str, clock: Clock) -> Coordinator:
        """The core coordinator of this process's instances, agreeing through this."""
        return Coordinator(job, self.store, clock, None, agreement=self)

    def deliver(self, message: dict[str, Any]) -> None:
        """A ``checkpoint`` or ``committed`` message from the parent, taken up in order by :meth:`run`."""
        self._orders.send_nowait(message)

    async def restore_point(self) -> RestorePoint:
        """The checkpoint the parent read before the fork."""
        return self.restore

    async def run(self, coordinator: Coordinator) -> None:
        """Begin every epoch the parent starts, commit every one it completes."""
        async for message in self._inbox:
            epoch = int(message["epoch"])
            if message["kind"] == "checkpoint":
                await coordinator.begin(epoch, final=bool(message["final"]))
            else:
                await coordinator.commit_through(epoch)
                if message["final"]:
                    self._final_done.set()

    async def saved(self, epoch: int, size: int, finished: bool) -> None:
        """This process's part of ``epoch`` is saved here: send it to the parent."""
        await self.send({"kind": "part", "epoch": epoch, "data": self.store.parts.pop(epoch)})

    async def finished(self) -> None:
        """Every instance here has completed: return once the parent has committed the final checkpoint."""
        await self.send({"kind": "finished"})
        await self._final_done.wait()


class CheckpointLeader:
    """The parent's side: starts epochs, merges and saves the parts, has every process commit."""

    def __init__(
        self, store: CheckpointStore, interval: float | None, clock: Clock, send_all: Send, processes: int,
        restore: RestorePoint,
    ) -> None:  # fmt: skip
        self.store = store
        self.interval = interval
        self.clock = clock
        self.send_all = send_all
        self.processes = processes
        self.next_epoch = (0 if restore is None else restore[0]) + 1
        self.parts: dict[int, dict[int, dict[str, Any]]] = {}  # epoch -> process -> its part
        self.began: dict[int, float] = {}  # epochs in flight -> when they began
        self.finished: set[int] = set()  # processes whose instances have all completed
        self.final: int | None = None
        self.completed = 0
        self.last: CheckpointInfo | None = None
        self.durations = LatencyHistogram()

    async def run(self) -> None:
        """Every ``interval`` seconds a checkpoint, unless one is in flight; none after the final one."""
        if self.interval is None:
            return
        while True:
            await self.clock.sleep(self.interval)
            if self.final is not None:
                return
            if not self.began:
                await self._begin(final=False)

    async def take(self, process: int, message: dict[str, Any]) -> None:
        """A ``part`` or ``finished`` message from worker process ``process``."""
        if message["kind"] == "finished":
            self.finished.add(process)
            if len(self.finished) == self.processes and self.final is None:
                self.final = await self._begin(final=True)
            return
        epoch = int(message["epoch"])
        parts = self.parts.setdefault(epoch, {})
        parts[process] = decode(message["data"], f"part of checkpoint {epoch} from worker process {process + 1}")
        if len(parts) == self.processes:
            await self._complete(epoch)

    async def _begin(self, final: bool) -> int:
        epoch = self.next_epoch
        self.next_epoch += 1
        self.began[epoch] = time.perf_counter()
        await self.send_all({"kind": "checkpoint", "epoch": epoch, "final": final})
        return epoch

    async def _complete(self, epoch: int) -> None:
        parts = self.parts.pop(epoch)
        data = encode(merge_parts([parts[process] for process in sorted(parts)]))
        await maybe_await(self.store.save(epoch, data))
        seconds = time.perf_counter() - self.began.pop(epoch)
        self.completed += 1
        self.last = CheckpointInfo(epoch, len(data), seconds)
        self.durations.add(seconds)
        await self.send_all({"kind": "committed", "epoch": epoch, "final": epoch == self.final})
