"""A worker, assembled and served the one way: a worker process (``local.run.run_worker``) and the simulated
cluster's workers run this same code, and differ only in what they hand it (``WorkerSeams``): how the load
is sampled, who is told of each built job part, and when to look at the jobs again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from streamlet.backends.cluster.tree.paths import WorkerInfo
from streamlet.backends.cluster.tree.registry import WorkerRegistration, process_load
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.backends.cluster.worker.heart import HeartThread
from streamlet.backends.cluster.worker.job_parts import WorkerJobs
from streamlet.backends.cluster.worker.load_meter import LoadMeter
from streamlet.core.runtime.job import Job
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient


@dataclass(frozen=True)
class WorkerSeams:
    """What the runner of a worker chooses (a process takes the defaults).

    ``load_sample``: this process's CPU seconds and memory, for the heartbeat's load report;
    ``on_part_built``: told of each job part as soon as it is built; ``next_look``: returns when the jobs
    are worth looking at again (``None``: every ``POLL`` seconds); ``heart_thread``: the heartbeat is
    written from a thread of its own (``worker.heart``), so user code holding the loop cannot stop it (a
    simulated cluster, whose time is the loop's, beats from the loop).
    """

    load_sample: Callable[[], dict[str, Any]] = process_load
    on_part_built: Callable[[tuple[str, int], Job], None] | None = None
    next_look: Callable[[], Awaitable[None]] | None = None
    heart_thread: bool = True


@dataclass(frozen=True)
class Worker:
    """One worker's pieces: its registration (and heartbeat), its job parts, its load meter."""

    registration: WorkerRegistration
    jobs: WorkerJobs
    meter: LoadMeter
    next_look: Callable[[], Awaitable[None]] | None
    heart: HeartThread | None = None


def assemble_worker(
    store: ClusterStore,
    worker_id: str,
    info: WorkerInfo,
    server: DataServer,
    client: TcpClient,
    secret: bytes,
    state_dir: Path,
    heartbeat: float = 1.0,
    seams: WorkerSeams = WorkerSeams(),
) -> Worker:
    """The worker's pieces, wired: heartbeats carry its instances' statistics and queues."""
    registration = WorkerRegistration(store, worker_id, info, heartbeat=heartbeat)
    jobs = WorkerJobs(store, registration, server, client, secret, state_dir, on_part_built=seams.on_part_built)

    def sample() -> dict[str, Any]:  # the heartbeat also says how many strangers the data port turned away
        return {**seams.load_sample(), "tls_refused": server.counts["tls_refused"]}

    meter = LoadMeter(jobs.queue_depths, jobs.instance_statistics, jobs.job_statistics, sample=sample)
    registration.load = meter
    heart = HeartThread(registration, heartbeat) if seams.heart_thread else None
    return Worker(registration, jobs, meter, seams.next_look, heart)


async def serve_worker(worker: Worker, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Register (live at the leader's next round), then heartbeat and run job parts until cancelled."""
    await worker.registration.register()
    await worker.registration.beat()  # the first from the loop: the load node exists before the heart writes
    heart = worker.heart
    if heart is not None:
        worker.registration.beats_from_thread = True
        heart.start()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(worker.registration.run)  # the heartbeat (or, with a heart, its load) every period
            group.start_soon(worker.jobs.run, worker.next_look)
            task_status.started()
    finally:
        if heart is not None:
            heart.stop()
