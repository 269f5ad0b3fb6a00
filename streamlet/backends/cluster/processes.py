"""The long-running cluster processes: a master (candidate, then leader) and a worker."""

from __future__ import annotations

import os
import socket
from typing import Any

import anyio
import structlog

from streamlet.backends.cluster.coordinator import ZkCoordinator
from streamlet.backends.cluster.election import LeaderElection
from streamlet.backends.cluster.failover import recover
from streamlet.backends.cluster.jobs import schedule_pending
from streamlet.backends.cluster.load import LoadMeter
from streamlet.backends.cluster.registry import WORKERS, WorkerRegistration
from streamlet.backends.cluster.runner import WorkerJobs
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient

log = structlog.get_logger("streamlet")
SESSION_TIMEOUT = 4.0
ROUND = 0.2  # seconds between the leader's scheduling rounds


async def run_master(zk_hosts: str, cluster: str, name: str, session_timeout: float = SESSION_TIMEOUT) -> None:
    """Campaign for leadership and lead until the session is lost; then campaign again."""
    async with ZkCoordinator(zk_hosts, cluster, session_timeout) as zk:
        identity = {"name": name, "pid": os.getpid(), "host": socket.gethostname()}
        while True:
            election = LeaderElection(zk, identity)
            epoch = await election.campaign()
            log.info("leading the cluster", cluster=cluster, master=name, epoch=epoch)
            async with anyio.create_task_group() as group:
                group.start_soon(_schedule_forever, zk, epoch)
                await _lead_until_lost(zk)
                group.cancel_scope.cancel()
            log.warning("lost leadership", cluster=cluster, master=name, epoch=epoch)
            election.candidate = None  # the lost session took our candidate node too


async def _schedule_forever(zk: ZkCoordinator, epoch: int) -> None:
    # a worker that goes away wakes the leader at once; new jobs and reports are picked up within a round
    workers_changed = await zk.watch_children(WORKERS)
    while True:
        workers_changed.clear()
        if zk.state == "suspended":  # as ZooKeeper advises: decide nothing until the session is back or lost
            await anyio.sleep(ROUND)
            continue
        try:
            for job in await schedule_pending(zk, epoch):
                log.info("job assigned", job=job, epoch=epoch)
            for job in await recover(zk, epoch):
                log.warning("job recovered", job=job, epoch=epoch)
        except Exception as exc:  # noqa: BLE001 - a bad job must not stop the leader; the next round retries
            log.warning("scheduling failed", error=f"{type(exc).__name__}: {exc}")
        with anyio.move_on_after(ROUND):
            await workers_changed.wait()


async def _lead_until_lost(zk: ZkCoordinator) -> None:
    lost, reconnected = anyio.Event(), anyio.Event()

    def follow(state: str) -> None:
        if state == "lost":
            lost.set()
        elif state == "connected" and lost.is_set():
            reconnected.set()

    zk.on_state(follow)
    await lost.wait()
    await reconnected.wait()  # kazoo opens a new session; campaign again in it


async def run_worker(
    zk_hosts: str,
    cluster: str,
    worker_id: str,
    host: str,
    secret: bytes,
    capacity: int,
    labels: list[str] | None = None,
    session_timeout: float = SESSION_TIMEOUT,
) -> None:
    """Serve data connections, register, and heartbeat until stopped."""
    async with (
        ZkCoordinator(zk_hosts, cluster, session_timeout) as zk,
        DataServer(secret, host=host) as server,
        TcpClient(secret) as client,
    ):
        info: dict[str, Any] = {
            "host": host, "data_port": server.port, "capacity": capacity, "labels": labels or [], "pid": os.getpid(),
        }  # fmt: skip
        registration = WorkerRegistration(zk, worker_id, info)
        jobs = WorkerJobs(zk, registration, server, client)
        registration.load = LoadMeter(jobs.queue_depths)
        await registration.register()
        log.info("worker registered", cluster=cluster, worker=worker_id, data=f"{host}:{server.port}")
        async with anyio.create_task_group() as group:
            group.start_soon(registration.run)
            group.start_soon(jobs.run)
