"""The long-running cluster processes: a master (candidate, then leader) and a worker."""

from __future__ import annotations

import os
import socket
from typing import Any

import anyio
import structlog

from streamlet.backends.cluster.election import LeaderElection
from streamlet.backends.cluster.leader import Leader
from streamlet.backends.cluster.load import LoadMeter
from streamlet.backends.cluster.registry import WorkerRegistration
from streamlet.backends.cluster.store import ClusterStore
from streamlet.backends.cluster.worker import WorkerJobs
from streamlet.backends.cluster.zk import ZkStore
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient

log = structlog.get_logger("streamlet")
SESSION_TIMEOUT = 4.0


async def run_master(
    zk_hosts: str, cluster: str, name: str, secret: bytes, session_timeout: float = SESSION_TIMEOUT
) -> None:
    """Campaign for leadership and lead until the session is lost; then campaign again."""
    async with ZkStore(zk_hosts, cluster, session_timeout, secret=secret) as zk:
        identity = {"name": name, "pid": os.getpid(), "host": socket.gethostname()}
        while True:
            election = LeaderElection(zk, identity)
            epoch = await election.campaign()
            log.info("leading the cluster", cluster=cluster, master=name, epoch=epoch)
            async with anyio.create_task_group() as group:
                group.start_soon(Leader(zk, epoch, secret).run)
                await _lead_until_lost(zk)
                group.cancel_scope.cancel()
            log.warning("lost leadership", cluster=cluster, master=name, epoch=epoch)
            election.candidate = None  # the lost session took our candidate node too


async def _lead_until_lost(zk: ClusterStore) -> None:
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
        ZkStore(zk_hosts, cluster, session_timeout, secret=secret) as zk,
        DataServer(secret, host=host) as server,
        TcpClient(secret) as client,
    ):
        info: dict[str, Any] = {
            "host": host, "data_port": server.port, "capacity": capacity, "labels": labels or [], "pid": os.getpid(),
        }  # fmt: skip
        registration = WorkerRegistration(zk, worker_id, info)
        jobs = WorkerJobs(zk, registration, server, client, secret)
        registration.load = LoadMeter(jobs.queue_depths)
        await registration.register()
        log.info("worker registered", cluster=cluster, worker=worker_id, data=f"{host}:{server.port}")
        async with anyio.create_task_group() as group:
            group.start_soon(registration.run)
            group.start_soon(jobs.run)
