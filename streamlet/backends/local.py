"""The embedded default: every instance in one event loop, in-memory channels."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio

from streamlet.adaptation.settings import AdaptSettings
from streamlet.core.model.clock import Clock
from streamlet.core.model.state import StateBackend
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.channel import ChannelFactory, LocalChannel
from streamlet.core.runtime.job import DEFAULT_BATCH_SIZE, DEFAULT_CHANNEL_CAPACITY, Job, JobResult, open_job
from streamlet.core.state.store import CheckpointStore, DirectoryCheckpointStore
from streamlet.errors import JobError


def run(
    topology: Topology,
    *,
    use_uvloop: bool = True,
    clock: Clock | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    channel_capacity: int = DEFAULT_CHANNEL_CAPACITY,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_interval: float | None = None,
    checkpoint_store: CheckpointStore | None = None,
    from_savepoint: str | os.PathLike[str] | None = None,
    cpu_scheduling: str | None = None,
    adapt: AdaptSettings | None = None,
    processes: int = 1,
    loop_warning: float | None = None,
    state_backend: StateBackend | None = None,
) -> JobResult:
    """Run ``topology`` to completion in a new event loop and return its result.

    With ``checkpoint_dir`` (or a ``checkpoint_store``) the job takes a
    checkpoint every ``checkpoint_interval`` seconds and, when the directory
    holds an unfinished job's checkpoint, resumes from the latest intact one;
    with ``from_savepoint`` it starts from that savepoint instead (see
    :meth:`Job.savepoint`). ``cpu_scheduling`` shares the event loop between
    instances: ``"queue-state"`` (an instance whose input queue is filling
    up takes more batches per turn), ``"turns"`` (one batch each) or ``None``
    (each runs until it waits; the default). ``adapt`` runs adaptation
    policies while the job runs (``balance``, ``autoscale``; see
    ``streamlet.backends.local_adaptation``).
    With ``processes=N`` (N > 1) the instances run in N forked worker
    processes over TCP on 127.0.0.1 (see ``streamlet.backends.processes``):
    the same result, computed on N cores. ``loop_warning``: a call of a task's
    plain ``def execute`` that holds the event loop longer than this many
    seconds (default 0.1, or ``STREAMLET_LOOP_WARNING``) is counted
    (``loop_held``) and warned of once per task (see ``run_in`` in
    ``Topology.add_task``). ``state_backend`` keeps the tasks' keyed state
    elsewhere than in memory (``streamlet.RocksDBState``; a task's own
    ``state_backend`` goes first).
    Call it from synchronous code; inside a running loop use :func:`start`.

    Example:
        >>> import streamlet as sl
        >>> t = sl.Topology("double")
        >>> src = t.add_source("numbers", [1, 2, 3])
        >>> twice = t.map("twice", lambda r: (r.key, r.value * 2)).set_input(src)
        >>> _ = t.add_sink("out", sl.CollectSink()).set_input(twice)
        >>> [r.value for r in sl.run(t).sink("out")]
        [2, 4, 6]
    """
    options = job_options(clock, batch_size, channel_capacity, checkpoint_dir, checkpoint_interval, checkpoint_store)
    options["from_savepoint"] = from_savepoint
    options["cpu_turns"] = cpu_turns(cpu_scheduling)
    options["loop_warning"] = loop_warning
    options["state_backend"] = state_backend
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise JobError("streamlet.run() was called inside a running event loop; use 'async with streamlet.start(...)'")
    if type(processes) is not int or processes != 1:
        from streamlet.backends.processes import run_in_processes

        return run_in_processes(topology, processes, options, loop_options(use_uvloop), adapt)
    check_adapt(adapt, topology)
    run_job = partial(_run_job, topology, options, adapt)
    return anyio.run(run_job, backend="asyncio", backend_options=loop_options(use_uvloop))


def job_options(
    clock: Clock | None,
    batch_size: int,
    channel_capacity: int,
    checkpoint_dir: str | os.PathLike[str] | None,
    checkpoint_interval: float | None,
    checkpoint_store: CheckpointStore | None,
) -> dict[str, Any]:
    """Keyword arguments for :class:`~streamlet.core.runtime.job.Job`."""
    if checkpoint_dir is not None:
        if checkpoint_store is not None:
            raise JobError("pass checkpoint_dir or checkpoint_store, not both")
        checkpoint_store = DirectoryCheckpointStore(checkpoint_dir)
    return {
        "clock": clock,
        "batch_size": batch_size,
        "channel_capacity": channel_capacity,
        "checkpoint_store": checkpoint_store,
        "checkpoint_interval": checkpoint_interval,
    }


def cpu_turns(scheduling: str | None) -> Callable[[float], int] | None:
    """The turn policy called ``scheduling`` (see ``streamlet.adaptation.cpu``); an unknown name is a
    :class:`JobError` naming the known ones."""
    if scheduling is None:
        return None
    from streamlet.adaptation.cpu import SCHEDULING

    if scheduling not in SCHEDULING:
        raise JobError(f"cpu_scheduling must be one of {sorted(SCHEDULING)} or None, not {scheduling!r}")
    return SCHEDULING[scheduling]


def check_adapt(adapt: AdaptSettings | None, topology: Topology) -> None:
    """Refuse what an embedded job cannot adapt by (before anything starts)."""
    between_workers = sorted({"migrate", "rebalance", "spread"} & set(adapt.policies if adapt is not None else ()))
    if between_workers:
        raise JobError(f"the {between_workers[0]} policy moves instances between workers: it needs a cluster")
    if adapt is not None and "shed" in adapt.policies and topology.qos is None:
        raise JobError(f"the shed policy keeps a QoS: topology '{topology.name}' has none (topology.set_qos(...))")


async def _run_job(topology: Topology, options: dict[str, Any], adapt: AdaptSettings | None) -> JobResult:
    if adapt is None:
        return await Job(topology, channel_factory=LocalChannel, **options).run()
    async with open_job(topology, channel_factory=LocalChannel, **options) as job, adapting(job, adapt):
        return await job.wait()


@asynccontextmanager
async def adapting(job: Job, adapt: AdaptSettings | None) -> AsyncIterator[None]:
    """Run ``adapt``'s policies on ``job`` for as long as the block lasts."""
    if adapt is None:
        yield
        return
    from streamlet.backends.local_adaptation import LocalAdaptation

    loop = LocalAdaptation(job, adapt)
    async with anyio.create_task_group() as group:
        group.start_soon(loop.run)
        try:
            yield
        finally:
            group.cancel_scope.cancel()


def loop_options(use_uvloop: bool) -> dict[str, Any]:
    """anyio's asyncio backend options: uvloop's loop when asked for and installed (not on Windows)."""
    if not use_uvloop or sys.platform == "win32":
        return {}
    try:
        import uvloop  # noqa: F401 - only checking that it is there
    except ImportError:
        return {}
    return {"use_uvloop": True}


@asynccontextmanager
async def start(
    topology: Topology,
    *,
    clock: Clock | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    channel_capacity: int = DEFAULT_CHANNEL_CAPACITY,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_interval: float | None = None,
    checkpoint_store: CheckpointStore | None = None,
    channel_factory: ChannelFactory | None = None,
    from_savepoint: str | os.PathLike[str] | None = None,
    cpu_scheduling: str | None = None,
    adapt: AdaptSettings | None = None,
    monitor_port: int | None = None,
    loop_warning: float | None = None,
    state_backend: StateBackend | None = None,
) -> AsyncIterator[Job]:
    """Run ``topology`` inside the caller's event loop.

    ``channel_factory`` replaces the in-memory channels (for instance with
    TCP channels from :func:`streamlet.transport.tcp_client.open_loopback_transport`);
    ``cpu_scheduling`` and ``adapt`` are as for :func:`run`. With
    ``monitor_port`` (0: any free port) the job's dashboard view, its JSON and
    Prometheus ``/metrics`` are served on 127.0.0.1 while it runs; its URL is
    ``job.endpoints["monitor"]`` (needs ``pip install 'streamlet[monitor]'``).
    ``loop_warning`` is as for :func:`run`: a task whose plain ``def execute``
    holds the loop keeps the caller's own coroutines waiting too (give it
    ``run_in="thread"`` or ``"process"``). ``state_backend`` is as for
    :func:`run`.

    Example:
        >>> async def service(topology):
        ...     async with start(topology) as job:
        ...         await job.send("requests", "user42", 1)
        ...         await job.close_source("requests")
        ...         result = await job.wait()
    """
    options = job_options(clock, batch_size, channel_capacity, checkpoint_dir, checkpoint_interval, checkpoint_store)
    options["from_savepoint"] = from_savepoint
    options["cpu_turns"] = cpu_turns(cpu_scheduling)
    options["loop_warning"] = loop_warning
    options["state_backend"] = state_backend
    check_adapt(adapt, topology)
    factory = channel_factory or LocalChannel
    async with (
        open_job(topology, channel_factory=factory, **options) as job,
        adapting(job, adapt),
        monitoring(job, monitor_port),
    ):
        yield job


@asynccontextmanager
async def monitoring(job: Job, port: int | None) -> AsyncIterator[None]:
    """Serve the job's dashboard view on ``port`` while the block runs (``None``: nothing is served)."""
    if port is None:
        yield
        return
    try:
        from streamlet.backends.monitor.server import Dashboard, serving
        from streamlet.backends.monitor.sources import JobSource
    except ImportError as exc:  # aiohttp or prometheus_client missing
        raise JobError(f"monitor_port needs the monitor extra: pip install 'streamlet[monitor]' ({exc})") from exc
    async with serving(Dashboard(JobSource(job)), port=port) as url:
        job.endpoints["monitor"] = url
        yield
