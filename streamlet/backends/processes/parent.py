"""The calling process: fork the worker processes, follow them, gather their results, stop and reap them all.

The parent runs no instance. Before any event loop runs it draws the data
plane's secret and the run token, computes where every instance goes, makes
one socket pair per process and forks; then it follows the processes on an
event loop of its own (asyncio, after the fork):

1. every process says ``ready`` with its data port; the parent sends every
   process all the ports (``start``);
2. while they run, the parent leads the loops' rounds (``round``,
   ``counters``, ``quiet``: see ``loops``) and the checkpoints
   (``checkpoint``, ``part``, ``committed``, ``finished``: see
   ``checkpoints``);
3. each process reports its part (``records``, ``dead_letters``, ``done``);
   once every one is done the parent says ``exit`` and waits for them to end;
4. the first ``failed`` report, a checkpoint the store cannot save, or a
   process ending before it reported (killed, crashed) stops the run: the
   parent says ``stop`` to the others (each cancels its part, its sinks
   abort), then ``exit``; a process that has not ended within
   :data:`STOP_TIMEOUT` seconds is killed (SIGKILL). Then the parent raises
   the failure: the error the job would raise in one process, or a
   :class:`JobError` naming the process that ended and how.

Whatever happens (an error, Ctrl-C), every process is ended and reaped by
its PID before :func:`run_in_processes` returns or raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog

from streamlet.adaptation.settings import AdaptSettings
from streamlet.backends.processes.child import Launch, run_child
from streamlet.backends.processes.failures import rebuilt
from streamlet.backends.processes.loops import LoopRounds
from streamlet.backends.processes.part_agreement import CheckpointLeader, RestorePoint, Send
from streamlet.backends.processes.placement import spread
from streamlet.backends.processes.results import Checkpoints, PartReport, merged
from streamlet.backends.processes.wire import Control
from streamlet.core.model.topology import Topology
from streamlet.core.model.validation import surprising_defaults, unconsumed_ports
from streamlet.core.runtime.clock import SystemClock
from streamlet.core.runtime.cycles import refuse_checkpoints_with_cycles
from streamlet.core.runtime.job import JobResult, new_attempt
from streamlet.core.state.rocks import RocksDBState, forking_is_unsafe
from streamlet.core.state.savepoints import check_fits, read_savepoint
from streamlet.core.state.store import CheckpointStore
from streamlet.errors import JobError, StreamletError, TopologyError

log = structlog.get_logger("streamlet")
STOP_TIMEOUT = 10.0  # seconds a stopped process has to end before it is killed
_JOB_OPTIONS = (
    "clock",
    "batch_size",
    "channel_capacity",
    "cpu_turns",
    "loop_warning",
    "state_backend",  # each process opens its own instances' databases under the backend's folder
)  # what each process's Job is given


def run_in_processes(
    topology: Topology,
    processes: int,
    options: dict[str, Any],
    backend_options: dict[str, Any],
    adapt: AdaptSettings | None = None,
) -> JobResult:
    """Run ``topology`` in ``processes`` forked worker processes and return the result of the whole job.

    ``options`` are the :class:`~streamlet.core.runtime.job.Job`'s keyword
    arguments as :func:`streamlet.run` makes them (with a checkpoint store
    the parent leads the checkpoints: see ``checkpoints``); ``adapt``, whose
    policies steer a job in this process, is refused with a
    :class:`JobError` before anything starts. ``backend_options`` are
    anyio's for the worker processes' event loops (uvloop or not).
    """
    if adapt is not None:
        raise JobError("adapt= steers a job running in this process: it is not supported with processes > 1")
    resolved = _checked(topology, processes, options)
    for node, port in unconsumed_ports(resolved):  # as the job would in one process (a placed part does not)
        log.warning(
            "output port has no consumer", job=resolved.name, node=node, port=port,
            effect="records emitted there are dropped (counted in statistics.discarded)",
        )  # fmt: skip
    store: CheckpointStore | None = options.get("checkpoint_store")
    for event, fields in surprising_defaults(resolved, checkpointed=store is not None):
        log.warning(event, job=resolved.name, **fields)
    restore = None if store is None else _restore_point(store, options.get("from_savepoint"), resolved)
    job_options: dict[str, Any] = {name: options[name] for name in _JOB_OPTIONS if name in options}
    launch = Launch(
        topology, processes, spread(resolved, processes), secrets.token_bytes(32), new_attempt(), job_options,
        backend_options, loops=bool(resolved.back_edges()), checkpointed=store is not None, restore=restore,
    )  # fmt: skip
    leader = None
    if store is not None:
        clock = options.get("clock") or SystemClock()
        leader = partial(CheckpointLeader, store, options.get("checkpoint_interval"), clock, restore=restore)
    began = time.perf_counter()
    children = _fork_all(launch)
    try:
        supervisor = _Supervisor(launch, children, leader)
        parts = asyncio.run(supervisor.run())
        return merged(resolved, launch.where, parts, time.perf_counter() - began, supervisor.checkpoint_counts())
    finally:
        _reap(children)


def _checked(topology: Topology, processes: int, options: dict[str, Any]) -> Topology:
    """The validated topology, once everything a multi-process run cannot do is refused."""
    if type(processes) is not int or processes < 1:
        raise JobError(f"processes must be a whole number >= 1, got {processes!r}")
    if not hasattr(os, "fork"):
        raise JobError(f"processes={processes} forks worker processes: this platform ({sys.platform}) cannot fork")
    if not isinstance(topology, Topology):  # as a job in one process says it, and the checks below too
        raise TopologyError(f"a job runs a streamlet.Topology, got {type(topology).__name__}: {topology!r:.80}")
    resolved = topology.validate()
    if options.get("checkpoint_store") is None:
        if options.get("from_savepoint") is not None:
            raise JobError("from_savepoint needs checkpoint_dir= (where the job keeps its own checkpoints)")
        if options.get("checkpoint_interval") is not None:
            raise JobError("checkpoint_interval needs a checkpoint store (checkpoint_dir=...)")
    else:
        refuse_checkpoints_with_cycles(resolved)
    _refuse_rocksdb_after_fork(resolved, processes, options.get("state_backend"))
    return resolved


def _refuse_rocksdb_after_fork(topology: Topology, processes: int, backend: Any) -> None:
    """A job keeping state in RocksDB cannot be forked from a process that already ran RocksDB (its children
    would hang at their first flush): said before anything starts."""
    backends = [backend, *(node.state_backend for node in topology.nodes.values())]
    if any(isinstance(one, RocksDBState) for one in backends) and forking_is_unsafe():
        raise JobError(
            f"processes={processes} forks worker processes, and this process has run RocksDB state already: "
            "RocksDB's background threads do not survive a fork, so the children would hang. Run this job "
            "in a program of its own (or before any job of this program keeps state in RocksDB)"
        )


def _restore_point(
    store: CheckpointStore, savepoint: str | os.PathLike[str] | None, topology: Topology
) -> RestorePoint:
    """What the job resumes from, as a job in one process finds it: the savepoint (epochs going on after any
    the store holds), else the store's newest intact checkpoint."""
    if savepoint is not None:
        epoch, document = read_savepoint(savepoint)
        check_fits(document, topology, f"savepoint {savepoint}")
        return max([epoch, *store.epochs()]), document
    return store.latest()


@dataclass(eq=False)
class _Child:
    index: int
    pid: int
    sock: socket.socket
    part: PartReport
    control: Control | None = None
    final: str | None = None  # its last report: done, failed or stopped
    ended: bool = False  # its end of the socket closed: it is exiting (or gone)
    status: int | None = None  # its wait status, once reaped


def _fork_all(launch: Launch) -> list[_Child]:
    """Fork every worker process, each with its own end of a socket pair (the others' ends closed)."""
    pairs = [socket.socketpair() for _ in range(launch.processes)]
    children: list[_Child] = []
    for stream in (sys.stdout, sys.stderr):  # what the caller has buffered is printed once, not once per child
        if stream is not None:
            stream.flush()
    try:
        for index, (_, theirs) in enumerate(pairs):
            pid = os.fork()
            if pid == 0:
                for other_ours, other_theirs in pairs:
                    other_ours.close()
                    if other_theirs is not theirs:
                        other_theirs.close()
                run_child(launch, index, theirs)  # never returns
            where = f"worker process {index + 1} of {launch.processes} (pid {pid})"
            children.append(_Child(index, pid, pairs[index][0], PartReport(where)))
    except BaseException:
        _reap(children)
        for ours, _ in pairs[len(children) :]:
            ours.close()
        raise
    finally:
        for _, theirs in pairs:
            theirs.close()
    return children


def _reap(children: list[_Child]) -> None:
    """Reap every child not reaped yet: one that closed its control socket (it is exiting) gets until
    :data:`STOP_TIMEOUT` seconds after the reaping began to end, then it is killed (SIGKILL) like the rest.
    A child reaped already elsewhere (the thread of an :func:`_exit_status` that timed out) is left as it is."""
    deadline = time.monotonic() + STOP_TIMEOUT
    for child in children:
        if child.status is not None:
            continue
        with contextlib.suppress(ChildProcessError):
            status = _exited_by(child.pid, deadline) if child.ended else None
            if status is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
                status = os.waitpid(child.pid, 0)[1]
            child.status = status
    for child in children:
        child.sock.close()


def _exited_by(pid: int, deadline: float) -> int | None:
    """The wait status of ``pid`` if it exits by ``deadline`` (``time.monotonic``), reaped; else ``None``.
    Waits on its pidfd where there is one (Linux 5.3+), else polls every 10 ms."""
    try:
        descriptor: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        descriptor = None
    try:
        while True:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if descriptor is None:
                time.sleep(min(left, 0.01))
            else:
                select.select([descriptor], [], [], left)
    finally:
        if descriptor is not None:
            os.close(descriptor)


class _Supervisor:
    """Follows every process through the run (see the module docstring)."""

    def __init__(
        self, launch: Launch, children: list[_Child], leader: Callable[[Send, int], CheckpointLeader] | None = None
    ) -> None:
        self.launch = launch
        self.children = children
        self.events: asyncio.Queue[tuple[_Child, dict[str, Any] | None]] = asyncio.Queue()
        self.rounds = LoopRounds(self._send_all, len(children)) if launch.loops else None
        self.checkpoints = None if leader is None else leader(self._send_all, len(children))
        self.tasks: list[asyncio.Task[None]] = []  # the readers, the loop rounds, the checkpoint ticks
        self.failure: BaseException | None = None  # what stops the run: raised once every process is stopped

    async def run(self) -> list[PartReport]:
        try:
            for child in self.children:
                child.control = Control(*await asyncio.open_unix_connection(sock=child.sock))
                self.tasks.append(asyncio.create_task(self._read(child)))
            failure = await self._follow()
            if failure is not None:
                await self._stop()
                raise failure
            return [child.part for child in self.children]
        finally:
            for child in self.children:  # a process still running is killed by _reap
                if child.control is not None:
                    child.control.close()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _follow(self) -> BaseException | None:
        """Start the processes, collect their reports and let them exit; the run's failure, if any."""
        if await self._start():
            for background in (self.rounds, self.checkpoints):
                if background is not None:
                    self.tasks.append(asyncio.create_task(background.run()))
            await self._collect()
        if self.failure is None:
            await self._exit()
        return self.failure

    async def _read(self, child: _Child) -> None:
        assert child.control is not None
        while True:
            try:
                message = await child.control.receive()
            except JobError as exc:  # a message this parent cannot read: the process is treated as ended
                log.error("bad control message", process=child.part.where, error=str(exc))
                message = None
            await self.events.put((child, message))
            if message is None:
                return

    async def _next(self) -> tuple[_Child, dict[str, Any] | None]:
        """The next message from any process (``None``: that process's socket closed)."""
        child, message = await self.events.get()
        if message is None:
            child.ended = True
        elif message["kind"] in ("done", "failed", "stopped"):
            child.final = message["kind"]
        return child, message

    async def _next_expected(self) -> tuple[_Child, dict[str, Any]] | None:
        """The next message while the run goes well; ``None`` once a process failed or ended early (the
        run's failure is then :attr:`failure`)."""
        child, message = await self._next()
        if message is None:
            self.failure = await self._ended_early(child)
        elif message["kind"] == "failed":
            self.failure = rebuilt(message["error"], child.part.where)
        elif message["kind"] == "stopped":  # nobody asked it to: it lost its control channel's other end
            name = self.launch.topology.name
            self.failure = JobError(f"{child.part.where} of job '{name}' stopped before its part of the job ended")
        else:
            return child, message
        return None

    async def _start(self) -> bool:
        """Every process's port, then every process started; ``False`` when one failed first."""
        ports: dict[int, int] = {}
        while len(ports) < len(self.children):
            found = await self._next_expected()
            if found is None:
                return False
            child, message = found
            if message["kind"] == "ready":
                ports[child.index] = int(message["port"])
        for child in self.children:
            await self._send(child, {"kind": "start", "ports": [ports[index] for index in range(len(ports))]})
        return True

    async def _collect(self) -> None:
        """Every process's report, the loops' answers and the checkpoints' parts, until all are done or the
        run fails."""
        while any(child.final != "done" for child in self.children):
            found = await self._next_expected()
            if found is None:
                return
            child, message = found
            if message["kind"] == "counters" and self.rounds is not None:
                self.rounds.take(child.index, message)
            elif message["kind"] in ("part", "finished") and self.checkpoints is not None:
                try:
                    await self.checkpoints.take(child.index, message)
                except StreamletError as exc:  # the store could not save it: the job's error, as in one process
                    self.failure = exc
                    return
            else:
                child.part.take(message)

    def checkpoint_counts(self) -> Checkpoints:
        """Checkpoints completed, the last one and the histogram of their durations (``None``: none taken)."""
        leader = self.checkpoints
        return None if leader is None else (leader.completed, leader.last, list(leader.durations.counts))

    async def _stop(self) -> None:
        """Stop every process still running its part, let them report, then make them exit."""
        for child in self.children:
            if child.final is None and not child.ended:
                await self._send(child, {"kind": "stop"})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_TIMEOUT):
                while any(child.final is None and not child.ended for child in self.children):
                    await self._next()
        await self._exit()

    async def _exit(self) -> None:
        """Tell every process to exit and wait until they have (at most :data:`STOP_TIMEOUT` seconds; ``_reap``
        kills the rest)."""
        for child in self.children:
            if not child.ended:
                await self._send(child, {"kind": "exit"})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_TIMEOUT):
                while not all(child.ended for child in self.children):
                    await self._next()

    async def _send_all(self, message: dict[str, Any]) -> None:
        for child in self.children:
            await self._send(child, message)

    async def _send(self, child: _Child, message: dict[str, Any]) -> None:
        assert child.control is not None
        with contextlib.suppress(OSError):  # it is gone: its end of the socket says so
            await child.control.send(message)

    async def _ended_early(self, child: _Child) -> JobError:
        """The error for a process that ended before its part did, saying how it ended."""
        status = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_TIMEOUT):
                status = child.status = await _exit_status(child.pid)
        if status is None:
            how = "it closed its control channel"
        elif os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            how = f"killed by signal {number} ({signal.Signals(number).name})"
        else:
            how = f"exit code {os.waitstatus_to_exitcode(status)}"
        name = self.launch.topology.name
        return JobError(f"{child.part.where} of job '{name}' ended before its part of the job did: {how}")


async def _exit_status(pid: int) -> int:
    """Reap ``pid`` once it has exited; its wait status."""
    try:
        descriptor = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux 5.3+: in a thread, then
        return (await asyncio.to_thread(os.waitpid, pid, 0))[1]
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(descriptor, readable)
    try:
        await exited
    finally:
        loop.remove_reader(descriptor)
        os.close(descriptor)
    return os.waitpid(pid, 0)[1]  # noqa: ASYNC222 - it has exited (its pidfd is readable): this does not wait
