"""A whole cluster in one process, for tests: a leader, workers, real TCP between them, and kills on cue.

:class:`SimulatedCluster` runs the cluster's own code (the leader's rounds,
each worker's :class:`~streamlet.backends.cluster.worker.job_parts.WorkerJobs`, the
checkpoint agreement, the loop termination detector) with every participant
on its own session of one in-memory store
(:class:`~streamlet.backends.cluster.tree.store.MemoryClusterStore`) instead of
ZooKeeper, and every worker serving its own ``DataServer`` on loopback, so
job parts on different workers talk over authenticated TCP exactly as on a
real cluster. Jobs are submitted by reference and signed with a secret the
harness makes; checkpoints go to a temporary directory.

Nothing waits on a clock: the leader runs a round, and each worker looks at
its assignments, as soon as the store changes where they look (the harness
watches every write), instead of polling.

A test kills a worker at a point it chooses, and then checks the output:

- ``await cluster.kill_worker("worker-0")`` at any moment;
- ``KillAt("worker-0", after_checkpoint=N)``: as soon as checkpoint ``N``
  (or a later one) of the job is complete;
- ``KillAt("worker-1", after_records=("count", N))``: as soon as the
  instances of ``count`` on that worker have taken ``N`` records in the
  attempt running there (counted per batch, so at the first batch boundary
  at or past ``N``).

A kill is abrupt, like SIGKILL: the worker's tasks are cancelled where they
stand (no drain, no report, nothing more written to the store), its data
server and connections close, and its session expires, so its ephemeral
registration disappears and the leader reacts as to a lost worker: the next
attempt runs on the live workers from the last completed checkpoint.

What comes back (:class:`JobOutcome`): the final state and reason, every
state on the way, each attempt with which worker ran which instance and what
each reported, the checkpoints completed, the kills, the records of each
``CollectSink`` as ``streamlet submit`` gets them, and the records each
:class:`ExactlyOnceSink` committed. The difference matters after a kill: a
``CollectSink`` keeps what its instance received in memory and the report
comes from the attempt that finished, so after a recovery it holds only what
that attempt wrote after its restore point. An ``ExactlyOnceSink`` stages
each checkpoint's records and publishes them when the checkpoint completes,
like ``FileSink``: over every attempt, each record exactly once.

Example:
    >>> import anyio
    >>> import streamlet as sl
    >>> def build_topology() -> sl.Topology:
    ...     topology = sl.Topology("squares")
    ...     numbers = topology.add_source("numbers", range(1000))
    ...     squares = topology.map("square", lambda r: (r.value % 3, r.value**2), parallelism=2)
    ...     totals = topology.reduce("sum", lambda a, b: a + b).set_input(
    ...         squares.set_input(numbers), partitioning=sl.SAME_KEY)
    ...     topology.add_sink("out", ExactlyOnceSink()).set_input(totals)
    ...     return topology
    >>> async def main() -> JobOutcome:
    ...     async with SimulatedCluster(workers=2, capacity=2) as cluster:
    ...         return await cluster.run(build_topology, kill=KillAt("worker-0", after_checkpoint=1))
    >>> outcome = anyio.run(main)
    >>> outcome.state, outcome.attempt, [kill.worker for kill in outcome.kills]
    ('FINISHED', 2, ['worker-0'])
    >>> len(outcome.committed["out"])  # one running sum per record, each exactly once
    1000
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import os
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import EllipsisType, TracebackType
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.abc
import structlog.testing

from streamlet.adaptation.settings import AdaptSettings
from streamlet.backends.cluster.client import job_commands, savepoints
from streamlet.backends.cluster.client.api import collected as reported_records
from streamlet.backends.cluster.leader.adaptation import AdaptationLoop
from streamlet.backends.cluster.leader.leader import Leader
from streamlet.backends.cluster.simulated import targets as simulated_targets
from streamlet.backends.cluster.tree import jobs as cluster_jobs
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import LeaderElection
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.paths import WorkerInfo
from streamlet.backends.cluster.tree.registry import process_load
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree, read_all
from streamlet.backends.cluster.worker.job_parts import WorkerJobs
from streamlet.backends.cluster.worker.load_meter import LoadMeter
from streamlet.backends.cluster.worker.serving import WorkerSeams, assemble_worker, serve_worker
from streamlet.core.model.record import Record, Records
from streamlet.core.model.sinks import RestorePoint, Sink, SinkContext, SinkWriter
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.instances import Instance
from streamlet.core.runtime.job import Job
from streamlet.errors import JobError
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient

__all__ = ("Attempt", "ExactlyOnceSink", "JobOutcome", "Kill", "KillAt", "SimulatedCluster", "SimulatedJob")

DEFAULT_CHECKPOINT_INTERVAL = 0.05  # seconds: several checkpoints even in a short test
DEFAULT_TIMEOUT = 30.0  # seconds a wait may take before it fails, naming the job's state (a safety net)

Target = str | Topology | Callable[[], Topology]
T = TypeVar("T")


# -- an exactly-once sink in memory ---------------------------------------------------------------------


@dataclass
class _Book:
    """One job's output: what each run staged per epoch, and what checkpoints published."""

    staged: dict[tuple[str, str, int, int], list[Record]] = field(default_factory=dict)  # (attempt, sink, index, epoch)
    published: dict[tuple[str, int, int], list[Record]] = field(default_factory=dict)  # (sink, index, epoch)


class ExactlyOnceSink(Sink):
    """Keeps in memory what checkpoints commit: each record exactly once across failures and attempts.

    The transactional protocol of ``FileSink``, without files: the records
    written between two barriers are staged under the run (attempt) and the
    epoch at ``prepare_commit``, and published at ``commit``, once the
    checkpoint is complete everywhere. A restore publishes what the run that
    took the checkpoint staged up to it and drops what that run staged after
    it (the sources replay that); an epoch published twice is published once.
    Without checkpoints, everything is published when the input ends.

    Output is kept per job (``SinkContext.job_id``), in this process: a
    :class:`SimulatedCluster` returns it as ``JobOutcome.committed``; for any
    other job read it with :meth:`committed` and drop it with :meth:`forget`.

    Example:
        >>> import streamlet as sl
        >>> topology = sl.Topology("doubling")
        >>> numbers = topology.add_source("numbers", [1, 2, 3])
        >>> _ = topology.add_sink("out", ExactlyOnceSink()).set_input(numbers)
        >>> _ = sl.run(topology)
        >>> [r.value for r in ExactlyOnceSink.committed("local.doubling")["out"]]
        [1, 2, 3]
        >>> ExactlyOnceSink.forget("local.doubling")
    """

    _books: ClassVar[dict[str, _Book]] = {}

    def open(self, context: SinkContext) -> SinkWriter:
        """A writer for instance ``context.index`` of job ``context.job_id``, staging under ``context.attempt``."""
        return _ExactlyOnceWriter(self._books.setdefault(context.job_id, _Book()), context)

    @classmethod
    def committed(cls, job_id: str) -> dict[str, list[Record]]:
        """Every record published for job ``job_id``, by sink name, in epoch then instance order."""
        book = cls._books.get(job_id)
        merged: dict[str, list[Record]] = {}
        for sink, index, epoch in sorted((book.published if book else {}), key=lambda key: (key[0], key[2], key[1])):
            assert book is not None
            merged.setdefault(sink, []).extend(book.published[sink, index, epoch])
        return merged

    @classmethod
    def forget(cls, job_id: str) -> None:
        """Drop everything kept for job ``job_id``."""
        cls._books.pop(job_id, None)


class _ExactlyOnceWriter(SinkWriter):
    def __init__(self, book: _Book, context: SinkContext) -> None:
        self.book = book
        self.sink = context.node
        self.index = context.index
        self.attempt = context.attempt
        self.pending: list[Record] = []  # written since the last barrier: in no checkpoint yet

    def write(self, batch: Records) -> None:
        self.pending.extend(batch)

    def prepare_commit(self, epoch: int) -> None:
        self.book.staged[self.attempt, self.sink, self.index, epoch] = self.pending
        self.pending = []

    def commit(self, epoch: int) -> None:
        self._publish(self.attempt, epoch)

    def _publish(self, attempt: str, epoch: int) -> None:
        staged = self.book.staged.pop((attempt, self.sink, self.index, epoch), None)
        if staged is not None:  # gone: published already (by this run, or by a restore)
            self.book.published.setdefault((self.sink, self.index, epoch), staged)

    def restore(self, point: RestorePoint | None) -> None:
        if point is None or point.attempt is None:
            return  # nothing staged belongs to a completed checkpoint
        for attempt, sink, index, epoch in list(self.book.staged):
            if (attempt, sink, index) != (point.attempt, self.sink, self.index):
                continue
            if epoch <= point.epoch:
                self._publish(attempt, epoch)  # complete, but its run was cut short before it committed
            else:
                del self.book.staged[attempt, sink, index, epoch]  # never completed: the sources replay it

    def abort(self) -> None:
        self.pending = []  # in no checkpoint: nothing will publish it (staged epochs stay, for a restore)

    def close(self) -> None:
        if self.pending:  # no checkpoints: what was written becomes visible now (a rerun replaces it)
            self.book.published[self.sink, self.index, 0] = self.pending
            self.pending = []


# -- kill points and what a run leaves ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KillAt:
    """Kill ``worker`` at a point of a job's run: give exactly one of the two.

    ``after_checkpoint=N``: as soon as the job's checkpoint ``N`` (or a later
    one: epochs go on across attempts) is complete.
    ``after_records=(node, N)``: as soon as the instances of ``node`` on that
    worker have taken ``N`` records in the attempt running there (checked per
    batch). Each fires once.

    Example:
        >>> KillAt("worker-0", after_checkpoint=2).cause
        'checkpoint 2 completed'
    """

    worker: str
    after_checkpoint: int | None = None
    after_records: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        if (self.after_checkpoint is None) == (self.after_records is None):
            raise JobError(
                f"KillAt({self.worker!r}) needs exactly one of after_checkpoint=N or after_records=(node, N)"
            )
        if self.after_checkpoint is not None and self.after_checkpoint < 1:
            raise JobError(f"KillAt({self.worker!r}): after_checkpoint must be >= 1, got {self.after_checkpoint}")
        if self.after_records is not None and self.after_records[1] < 1:
            raise JobError(f"KillAt({self.worker!r}): after_records needs a count >= 1, got {self.after_records[1]}")

    @property
    def cause(self) -> str:
        """What the kill waits for, as :attr:`Kill.cause` says it."""
        if self.after_records is not None:
            node, count = self.after_records
            return f"'{node}' took {count} records"
        return f"checkpoint {self.after_checkpoint} completed"


@dataclass(frozen=True, slots=True)
class Kill:
    """A worker killed: why (``"checkpoint 1 completed"``, ``"'count' took 3000 records"``, ``"kill_worker()"``),
    the job whose kill point it was (``None`` for ``kill_worker``) and the job parts it was running
    (job -> attempt)."""

    worker: str
    cause: str
    job: str | None
    running: dict[str, int]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job: which worker ran which instance (``"count.1"`` -> ``"worker-1"``), the workers
    that started their part, and what each worker reported when its part ended (nothing for a part that was
    killed or replaced by the next attempt)."""

    number: int
    instances: dict[str, str]
    started: list[str]
    reports: dict[str, dict[str, Any]]

    @property
    def workers(self) -> list[str]:
        """The workers the attempt was assigned to."""
        return sorted(set(self.instances.values()))

    @property
    def restored_from(self) -> int | None:
        """The checkpoint the attempt resumed from, as its workers reported it (``None``: from the start)."""
        found = [report.get("restored_from") for report in self.reports.values() if "restored_from" in report]
        return None if not found or found[0] is None else int(found[0])


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How a job run on a :class:`SimulatedCluster` ended, and how it got there.

    ``states`` is every (state, reason) the leader wrote, in order;
    ``checkpoints`` every completed checkpoint as (attempt, epoch);
    ``collected`` each ``CollectSink``'s records as the workers of the final
    attempt reported them (what ``streamlet submit`` returns: JSON, so tuples
    come back as lists); ``committed`` each :class:`ExactlyOnceSink`'s
    records published over all attempts.
    """

    job: str
    state: str
    reason: str
    attempts: list[Attempt]
    states: list[tuple[str, str]]
    checkpoints: list[tuple[int, int]]
    kills: list[Kill]
    collected: dict[str, list[Record]]
    committed: dict[str, list[Record]]

    @property
    def attempt(self) -> int:
        """The number of the last attempt (0: never scheduled)."""
        return self.attempts[-1].number if self.attempts else 0

    @property
    def restored_from(self) -> int | None:
        """The checkpoint the last attempt resumed from (``None``: it started from the beginning)."""
        return self.attempts[-1].restored_from if self.attempts else None

    @property
    def ran_on(self) -> dict[str, str]:
        """Instance -> worker in the last attempt."""
        return dict(self.attempts[-1].instances) if self.attempts else {}


# -- the harness ------------------------------------------------------------------------------------------


@dataclass
class _Tree(MemoryTree):
    """The shared tree, telling the harness about every node written or removed."""

    listener: Callable[[str], None] | None = None

    def touched(self, path: str) -> None:
        super().touched(path)
        if self.listener is not None:
            self.listener(path)

    def data(self, path: str) -> Any:
        """What the node at ``path`` holds now (``None`` when it is gone)."""
        node = self.nodes.get(path)
        return None if node is None or not node.raw else json.loads(node.raw)


@dataclass
class _History:
    """What the harness saw of one job in the store, as it happened (nodes that are overwritten included)."""

    armed: list[KillAt]
    states: list[tuple[str, str]] = field(default_factory=list)
    assignments: dict[int, dict[str, str]] = field(default_factory=dict)
    checkpoints: list[tuple[int, int]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set, and replaced, at every new state

    def moved(self, state: str, reason: str) -> None:
        """The leader wrote the job's state."""
        if not self.states or self.states[-1] != (state, reason):
            self.states.append((state, reason))
            self.changed.set()
            self.changed = asyncio.Event()


@dataclass(eq=False)
class _Worker:
    worker_id: str
    capacity: int
    labels: list[str]
    session: MemoryClusterStore
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # cancelled: the worker is gone
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set when an assignment or a job state changed
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # set once its tasks and sockets are gone
    parts: WorkerJobs | None = None
    group: anyio.abc.TaskGroup | None = None
    alive: bool = True
    meter: LoadMeter | None = None  # its heartbeats' load report
    cpu_share: float = 0.0  # the share of a core its heartbeats report (set_cpu); they all share this process

    async def next_change(self) -> None:
        """Return once an assignment or a job state changed since the last return (``WorkerJobs.run``'s next
        look: instead of polling)."""
        await self.wake.wait()
        self.wake.clear()

    def load_sample(self) -> dict[str, Any]:
        """This process's memory, and CPU seconds as if the worker used ``cpu_share`` of a core all along."""
        return {**process_load(), "cpu_seconds": self.cpu_share * time.monotonic()}


class SimulatedCluster:
    """A leader and ``workers`` workers in this process, on one in-memory store (an async context manager).

    ``capacity`` is each worker's instance capacity (the scheduler spreads
    instances once a worker is full: a small capacity puts a job's parts on
    several workers). Jobs take a checkpoint every ``checkpoint_interval``
    seconds (``None``: no checkpoints); each worker keeps its files (its
    checkpoint parts, other workers' replicas) under ``checkpoint_dir/<worker-id>/``
    (default: a temporary directory removed at the end), as each machine of a
    real cluster has its own disk. Waits fail with a
    :class:`~streamlet.errors.JobError` naming the job's state after
    ``timeout`` seconds. With ``capture_logs`` (the default) the cluster's
    log entries are kept in :attr:`logs` instead of printed.

    Leaving the block stops every worker and the leader; no task, socket or
    temporary file is left behind.

    Example:
        >>> import anyio
        >>> import streamlet as sl
        >>> def build_topology() -> sl.Topology:
        ...     topology = sl.Topology("plain")
        ...     numbers = topology.add_source("numbers", range(5))
        ...     topology.add_sink("out", sl.CollectSink()).set_input(numbers)
        ...     return topology
        >>> async def main() -> JobOutcome:
        ...     async with SimulatedCluster(workers=1, checkpoint_interval=None) as cluster:
        ...         return await cluster.run(build_topology)
        >>> outcome = anyio.run(main)
        >>> outcome.state, [r.value for r in outcome.collected["out"]], outcome.ran_on
        ('FINISHED', [0, 1, 2, 3, 4], {'numbers.0': 'worker-0', 'out.0': 'worker-0'})
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        capacity: int = 8,
        checkpoint_interval: float | None = DEFAULT_CHECKPOINT_INTERVAL,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        secret: bytes | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        capture_logs: bool = True,
    ) -> None:
        if workers < 0 or capacity < 1:
            raise JobError(f"a simulated cluster needs workers >= 0 and capacity >= 1, got {workers} and {capacity}")
        self.name = f"simulated-{uuid.uuid4().hex[:8]}"  # the store's cluster name: job ids never clash
        self.secret = secrets.token_bytes(32) if secret is None else secret
        self.capacity = capacity
        self.checkpoint_interval = checkpoint_interval
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.timeout = timeout
        self.tree = _Tree(listener=self._touched)
        self.store = MemoryClusterStore(self.tree, self.name)  # the client's session: submit, status, kill
        self.kills: list[Kill] = []
        self.logs: list[MutableMapping[str, Any]] = []
        self._initial_workers = workers
        self._capture_logs = capture_logs
        self._workers: dict[str, _Worker] = {}
        self._histories: dict[str, _History] = {}
        self._leader_wake = asyncio.Event()
        self._references: list[str] = []  # targets handed over in-process, forgotten at the end
        self._stack: contextlib.AsyncExitStack | None = None
        self._group: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._sessions: list[MemoryClusterStore] = [self.store]

    # -- starting and stopping --------------------------------------------------------------------------

    async def __aenter__(self) -> SimulatedCluster:
        if self._group is not None or self._closing:
            raise JobError("a SimulatedCluster runs once: make a new one")
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            if self.checkpoint_dir is None:
                self.checkpoint_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamlet-sim-")))
            if self._capture_logs:
                self.logs = stack.enter_context(structlog.testing.capture_logs())
            stack.push_async_callback(self._release)
            self._group = await stack.enter_async_context(anyio.create_task_group())
            await self._group.start(self._lead)
            for index in range(self._initial_workers):
                await self.add_worker(f"worker-{index}")
        except BaseException:
            await stack.__aexit__(*sys.exc_info())
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None
        assert self._group is not None
        self._closing = True
        for worker in self._workers.values():
            worker.alive = False
            worker.scope.cancel()  # its sockets close as its task ends
        if error is not None and not self._group.cancel_scope.cancel_called:
            # the test's own error (an assertion): raised as itself, not inside the task group's exception group
            self._group.cancel_scope.cancel()
            await stack.__aexit__(None, None, None)
            return False
        self._group.cancel_scope.cancel()  # the leader; the group's exit waits for every task
        return await stack.__aexit__(kind, error, trace)

    async def _release(self) -> None:
        """After every task: close the sessions, drop what was handed over and the jobs' sink output."""
        for session in self._sessions:
            await session.aclose()
        for reference in self._references:
            simulated_targets.forget(reference)
        for job in self._histories:
            ExactlyOnceSink.forget(self.job_id(job))
        self._group = None

    def _require_group(self) -> anyio.abc.TaskGroup:
        if self._group is None or self._closing:
            raise JobError("the simulated cluster is not running (use 'async with SimulatedCluster() as cluster')")
        return self._group

    # -- the leader -------------------------------------------------------------------------------------

    async def _lead(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        session = MemoryClusterStore(self.tree, self.name)
        self._sessions.append(session)
        identity = {"name": "master-0", "pid": os.getpid(), "host": "simulated"}
        leader = Leader(session, await LeaderElection(session, identity).campaign(), self.secret)
        # the jobs' adaptation policies, on the leader's outlines
        adaptation = AdaptationLoop(session, self.secret, leader.fence, outlines=leader.outlines)
        self._require_group().start_soon(adaptation.run)
        task_status.started()
        while True:  # a round whenever a worker, a job or a report changed; an error fails the whole harness
            self._leader_wake.clear()
            await leader.round()
            await self._leader_wake.wait()

    # -- workers ----------------------------------------------------------------------------------------

    @property
    def workers(self) -> list[str]:
        """The live workers' ids."""
        return [worker_id for worker_id, worker in self._workers.items() if worker.alive]

    async def add_worker(
        self, worker_id: str | None = None, *, capacity: int | None = None, labels: Sequence[str] = ()
    ) -> str:
        """Start a worker (registered and heartbeating when this returns); returns its id.

        The default id is ``worker-<n>``, the first ``n`` not taken from the number of workers started so far
        on. The id of a killed worker may be used again: a restarted worker.
        """
        group = self._require_group()
        if worker_id is None:
            number = len(self._workers)
            while f"worker-{number}" in self._workers:
                number += 1
            worker_id = f"worker-{number}"
        known = self._workers.get(worker_id)
        if known is not None:
            if known.alive:
                raise JobError(f"the simulated cluster has a live worker called '{worker_id}' already")
            await known.stopped.wait()
        session = MemoryClusterStore(self.tree, self.name)
        self._sessions.append(session)
        worker = _Worker(worker_id, capacity or self.capacity, list(labels), session)
        self._workers[worker_id] = worker
        await group.start(self._host, worker)
        return worker_id

    def set_cpu(self, worker_id: str, share: float) -> None:
        """Make a live worker's heartbeats report ``share`` of a core from now on. Every simulated worker runs
        in this process, so their CPU cannot tell them apart: a test says which one is busy. The worker's
        OVERLOADED verdict then follows the real rule (CPU at 90 % of a core or more, and a full queue)."""
        worker = self._workers.get(worker_id)
        if worker is None or worker.meter is None or not worker.alive:
            raise JobError(f"no live worker called '{worker_id}' (live: {', '.join(self.workers) or 'none'})")
        worker.cpu_share = share
        worker.meter.restart()  # the next beat measures the new share afresh

    async def _host(
        self, worker: _Worker, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """One worker, as ``streamlet worker`` runs it, until killed or stopped."""
        try:
            async with DataServer(self.secret) as server, TcpClient(self.secret) as client:
                info: WorkerInfo = {
                    "host": server.host, "data_port": server.port, "capacity": worker.capacity,
                    "labels": worker.labels, "pid": os.getpid(),
                }  # fmt: skip
                assert self.checkpoint_dir is not None
                seams = WorkerSeams(  # CPU as set_cpu says (every worker shares this process); look on changes
                    load_sample=worker.load_sample, on_part_built=partial(self._part_built, worker),
                    next_look=worker.next_change, heart_thread=False,
                )  # fmt: skip
                served = assemble_worker(
                    worker.session, worker.worker_id, info, server, client, self.secret,
                    self.checkpoint_dir / worker.worker_id, seams=seams,
                )  # fmt: skip
                worker.parts, worker.meter = served.jobs, served.meter
                with worker.scope:
                    async with anyio.create_task_group() as group:
                        worker.group = group
                        await group.start(serve_worker, served)  # as a worker process serves
                        task_status.started()
        finally:
            worker.alive = False
            worker.stopped.set()

    async def kill_worker(self, worker_id: str) -> None:
        """Kill a live worker now, as SIGKILL would; returns once its tasks and sockets are gone."""
        worker = self._workers.get(worker_id)
        if worker is None or not worker.alive:
            raise JobError(f"no live worker called '{worker_id}' (live: {', '.join(self.workers) or 'none'})")
        self._kill(worker, "kill_worker()", None)
        await worker.stopped.wait()

    def _kill(self, worker: _Worker, cause: str, job: str | None) -> None:
        """Cancel every task of the worker where it stands; its session ends right after the current step."""
        if not worker.alive:
            return
        worker.alive = False
        running = {} if worker.parts is None else {name: attempt for name, attempt in worker.parts.running}
        self.kills.append(Kill(worker.worker_id, cause, job, running))
        worker.scope.cancel()
        # not inside this step: a kill point may fire in the middle of a store transaction, which completes first
        asyncio.get_running_loop().call_soon(self._end_session, worker)

    def _end_session(self, worker: _Worker) -> None:
        """The dead worker's session expires (its ephemeral nodes go) and never comes back."""
        if worker.session.state == "closed":
            return
        worker.session.expire()
        worker.session.suspend()

    # -- jobs -------------------------------------------------------------------------------------------

    async def submit(
        self,
        target: Target,
        *,
        job: str | None = None,
        parallelism: dict[str, int] | None = None,
        checkpoint_interval: float | EllipsisType | None = ...,
        kill: KillAt | Sequence[KillAt] = (),
        from_savepoint: str | os.PathLike[str] | None = None,
        adapt: AdaptSettings | None = None,
    ) -> SimulatedJob:
        """Submit a job, signed, as ``streamlet submit`` does; returns at once.

        ``target`` is a reference (``"module:name"``, ``"path/to/file.py:name"``,
        loaded from its signed bytes as a module of its own, as on a real
        cluster), or a function returning a Topology or a Topology object
        (handed to the workers in this process as it is, so the job shares
        the test's objects). ``job`` names it (default:
        the topology's name); ``parallelism`` overrides nodes' parallelism;
        ``checkpoint_interval`` overrides the cluster's; ``kill`` arms kill
        points for this job; ``from_savepoint`` starts it from a savepoint
        (as ``streamlet submit --from-savepoint``); ``adapt`` the adaptation
        policies it runs under (as ``streamlet submit --adapt``).
        """
        self._require_group()
        triggers = [kill] if isinstance(kill, KillAt) else list(kill)
        for trigger in triggers:
            if trigger.worker not in self._workers:
                raise JobError(f"KillAt names worker '{trigger.worker}'; the workers are {sorted(self._workers)}")
        interval = self.checkpoint_interval if isinstance(checkpoint_interval, EllipsisType) else checkpoint_interval
        checkpoint: dict[str, Any] | None = None if interval is None else {"interval": interval, "replicas": None}
        adapting = None if adapt is None else adapt.to_data()
        spec = job_commands.new_spec(self._reference(target), dict(parallelism or {}), checkpoint, adapting)
        if from_savepoint is not None:
            if checkpoint is None:
                raise JobError("from_savepoint needs checkpoints (a checkpoint_interval)")
            checkpoint["from_savepoint"] = savepoints.check_for_submit(Path(from_savepoint), spec)
        name = job_commands.check_job_name(job or cluster_jobs.topology_of(spec).name)
        if await self.store.get(paths.job(name)) is None:
            self._histories[name] = _History(triggers)  # before the job exists: its first state is seen too
        await job_commands.submit(self.store, name, spec, self.secret)
        return SimulatedJob(self, name)

    async def run(
        self,
        target: Target,
        *,
        job: str | None = None,
        parallelism: dict[str, int] | None = None,
        checkpoint_interval: float | EllipsisType | None = ...,
        kill: KillAt | Sequence[KillAt] = (),
    ) -> JobOutcome:
        """Submit a job (see :meth:`submit`) and wait until it has ended; returns how it went."""
        submitted = await self.submit(
            target, job=job, parallelism=parallelism, checkpoint_interval=checkpoint_interval, kill=kill
        )
        return await submitted.outcome()

    def _reference(self, target: Target) -> str:
        if isinstance(target, str):
            return target
        if isinstance(target, Topology):
            factory: Callable[[], Topology] = partial(_copy_of, target)
        elif callable(target):
            # every "process" is this one: the function itself, not a fresh copy of its module loaded by
            # name (job code is run from its signed bytes as a module of its own, see streamlet.job_code),
            # so a test and its job share the module's objects (events, counters) as they would in-process
            factory = target
        else:
            raise JobError(
                "a job is a reference ('module:name', 'path/to/file.py:name'), a function returning a Topology "
                f"or a Topology, got {type(target).__name__}"
            )
        reference = simulated_targets.register(factory)
        self._references.append(reference)
        return reference

    def job_id(self, job: str) -> str:
        """What the workers give the sinks of ``job`` as ``SinkContext.job_id``."""
        return f"{self.name}.{job}"

    def history(self, job: str) -> _History:
        """What the harness saw of ``job`` (its states, checkpoints, armed kill points) since it was submitted."""
        return self._histories.get(job) or _History([])

    # -- what the harness sees in the store ------------------------------------------------------------------

    def _touched(self, path: str) -> None:
        """A node was written or removed: wake whoever acts on it, record what tests look at, fire kill points."""
        parts = path.split("/")
        if len(parts) < 3:
            return
        if parts[1] in ("workers", "loads"):
            self._leader_wake.set()
            return
        if parts[1] != "jobs":
            return
        job, what = parts[2], "/".join(parts[3:])
        top = what.split("/")[0]
        if top in ("", "spec", "state", "assignment", "started", "done", "kill", "reconfigure", "reconfigurations"):
            self._leader_wake.set()
        if top in ("", "state", "assignment", "reconfigurations", "shed"):
            for worker in self._workers.values():
                worker.wake.set()
        history = self._histories.get(job)
        if history is None or what not in ("state", "assignment", "checkpoints/completed"):
            return
        data = self.tree.data(path)
        if data is None:
            return
        if what == "state":
            history.moved(str(data["state"]), str(data["reason"]))
        elif what == "assignment":
            history.assignments[int(data["attempt"])] = dict(data["instances"])
        else:
            history.checkpoints.append((int(data["attempt"]), int(data["epoch"])))
            for trigger in list(history.armed):
                if trigger.after_checkpoint is not None and int(data["epoch"]) >= trigger.after_checkpoint:
                    history.armed.remove(trigger)
                    self._kill(self._workers[trigger.worker], f"checkpoint {data['epoch']} completed", job)

    def _part_built(self, worker: _Worker, key: tuple[str, int], job: Job) -> None:
        """A worker built its part of an attempt: watch the records its instances take, if a kill point asks."""
        history = self._histories.get(key[0])
        if history is None or worker.group is None:
            return
        if any(t.after_records is not None and t.worker == worker.worker_id for t in history.armed):
            worker.group.start_soon(self._count_records, worker, key[0], job, history)

    async def _count_records(self, worker: _Worker, name: str, job: Job, history: _History) -> None:
        plan = await job.built()  # its instances exist (not yet running)
        if plan is None:
            return  # it failed before its instances were built
        for trigger in [t for t in history.armed if t.after_records is not None and t.worker == worker.worker_id]:
            assert trigger.after_records is not None
            node, count = trigger.after_records
            instances = plan.instances.get(node, [])
            if instances:  # else none of the node's instances runs there in this attempt: maybe in the next
                _watch_records(instances, count, partial(self._records_taken, worker, name, history, trigger))

    def _records_taken(self, worker: _Worker, name: str, history: _History, trigger: KillAt, taken: int) -> None:
        if trigger in history.armed:
            history.armed.remove(trigger)
            node = trigger.after_records[0] if trigger.after_records else "?"
            self._kill(worker, f"'{node}' took {taken} records", name)


class SimulatedJob:
    """A job submitted to a :class:`SimulatedCluster`: follow its states, kill it, or wait for how it ended."""

    def __init__(self, cluster: SimulatedCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self._history = cluster.history(name)
        self._seen = 0  # states before this index were passed by an earlier wait_for

    def __repr__(self) -> str:
        return f"SimulatedJob({self.name!r} on {self.cluster.name})"

    async def state(self) -> tuple[str, str]:
        """The job's (state, reason) now."""
        status = await cluster_jobs.job_status(self.cluster.store, self.name)
        return str(status["state"]), str(status["reason"])

    async def instances(self) -> dict[str, str]:
        """Instance -> worker in the current attempt (empty before the first): whom to kill, say."""
        found = await self.cluster.store.get(paths.assignment(self.name))
        return {} if found is None else dict(found.data["instances"])

    async def wait_for(self, *states: str | JobState) -> tuple[str, str]:
        """Wait until the job is in one of ``states``; returns (state, reason).

        Successive calls follow the job's path in order, each from where the
        previous one returned, so a state the job passes through quickly
        (RECOVERING) is not missed: ``wait_for("STALLED")`` then
        ``wait_for("RUNNING")`` is the next RUNNING after that STALLED. Raises
        :class:`~streamlet.errors.JobError` when the job ends in another
        state, or after the cluster's ``timeout``, naming the states so far.
        """
        wanted = {JobState(state) for state in states}

        def found() -> tuple[str, str] | None:
            for index in range(self._seen, len(self._history.states)):
                state, reason = self._history.states[index]
                if JobState(state) in wanted:
                    self._seen = index + 1
                    return state, reason
                if JobState(state).ended:
                    never = _names(wanted)
                    raise JobError(f"job '{self.name}' ended {state} ({reason}), never {never}; {self._path()}")
            return None

        return await self._until(found, _names(wanted))

    async def kill(self) -> None:
        """Ask the cluster to stop the job, as ``streamlet kill`` does (it ends KILLED)."""
        await job_commands.kill(self.cluster.store, self.name, by="the test")

    async def outcome(self) -> JobOutcome:
        """Wait until the job has ended (FINISHED, FAILED or KILLED); then how it went."""

        def ended() -> bool | None:
            states = self._history.states
            return True if states and JobState(states[-1][0]).ended else None

        await self._until(ended, "ended")
        store, cluster = self.cluster.store, self.cluster
        status = await cluster_jobs.job_status(store, self.name)
        history = self._history
        attempts = [
            Attempt(
                number,
                dict(history.assignments.get(number, {})),
                await store.children(paths.started(self.name, number)),
                await read_all(store, paths.done(self.name, number)),
            )
            for number in range(1, int(status["attempt"]) + 1)
        ]
        return JobOutcome(
            job=self.name,
            state=str(status["state"]),
            reason=str(status["reason"]),
            attempts=attempts,
            states=list(history.states),
            checkpoints=list(history.checkpoints),
            kills=[kill for kill in cluster.kills if kill.job == self.name or self.name in kill.running],
            collected={sink: [Record(*row) for row in rows] for sink, rows in reported_records(status).items()},
            committed=ExactlyOnceSink.committed(cluster.job_id(self.name)),
        )

    async def _until(self, found: Callable[[], T | None], what: str) -> T:
        """``found()`` once it is not ``None``, looking again at every state the leader writes."""
        with anyio.move_on_after(self.cluster.timeout):
            while True:
                changed = self._history.changed
                result = found()
                if result is not None:
                    return result
                await changed.wait()
        raise JobError(f"job '{self.name}' is not {what} after {self.cluster.timeout:g} s; {self._path()}")

    def _path(self) -> str:
        states = self._history.states
        if not states:
            return "the harness saw no state of it"
        went = " -> ".join(state for state, _ in states)
        return f"it is {states[-1][0]}: {states[-1][1]} (states: {went})"


# -- helpers --------------------------------------------------------------------------------------------------


def _names(states: set[JobState]) -> str:
    return " or ".join(sorted(state.value for state in states))


def _copy_of(topology: Topology) -> Topology:
    """A copy whose nodes a worker may change (parallelism overrides) without touching the original."""
    copied = copy.copy(topology)
    copied.nodes = {name: dataclasses.replace(node) for name, node in topology.nodes.items()}
    copied.edges = list(topology.edges)
    return copied


def _watch_records(instances: Sequence[Instance], threshold: int, reached: Callable[[int], None]) -> None:
    """Call ``reached(total)`` once the records ``instances`` took reach ``threshold`` (checked at every batch
    counted in: the instances' counters' ``observer``), so an instance already running is watched from its next
    batch on."""
    fired = False

    def total() -> int:
        return sum(instance.counters.records_in for instance in instances)

    def check(_: int) -> None:
        nonlocal fired
        if not fired and total() >= threshold:
            fired = True
            reached(total())

    for instance in instances:
        instance.counters.observer = check
    check(0)  # taken before the watch began
