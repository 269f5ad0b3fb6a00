"""The long-running cluster processes: a master (candidate, then leader) and a worker."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import structlog

from streamlet.backends.cluster.leader.adaptation import AdaptationLoop
from streamlet.backends.cluster.leader.leader import Leader
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import LeaderElection
from streamlet.backends.cluster.tree.outline import Outlines
from streamlet.backends.cluster.tree.paths import WorkerInfo
from streamlet.backends.cluster.tree.registry import WorkerRegistration
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.backends.cluster.tree.zk import SESSION_TIMEOUT, StoreSettings, ZkStore, four_letter_tls
from streamlet.backends.cluster.worker.job_parts import WorkerJobs
from streamlet.backends.cluster.worker.serving import assemble_worker, serve_worker
from streamlet.errors import CoordinationError, NodeExists, NotAuthorized, VersionConflict

if TYPE_CHECKING:
    from streamlet.backends.monitor.worker_metrics import WorkerMetrics
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient
from streamlet.transport.tls import TlsSettings

log = structlog.get_logger("streamlet")
DASHBOARD_PORT = 8780  # the leader's dashboard (another free port when this one is taken)
CAMPAIGN_RETRY = 0.2  # seconds between campaigns while the store does not answer


class DashboardSettings(NamedTuple):
    """Where the leader serves its dashboard; ``token``: the token every request must carry (see
    :mod:`~streamlet.backends.monitor.access`; ``None``: none, for tests and embedding only)."""

    host: str = "127.0.0.1"
    port: int = DASHBOARD_PORT
    token: str | None = None


async def run_master(
    zk_hosts: str,
    cluster: str,
    name: str,
    secret: bytes,
    session_timeout: float = SESSION_TIMEOUT,
    dashboard: DashboardSettings | None = DashboardSettings(),  # noqa: B008 - an immutable tuple
    zk_tls: TlsSettings | None = None,
) -> None:
    """Campaign and lead until SIGTERM; closing the session then removes ``/leader`` at once, so a
    candidate takes over without waiting for the session to time out. While leading, serve the dashboard
    on ``dashboard`` (host, port; ``None``: no dashboard). ``zk_tls``: reach ZooKeeper's TLS client ports
    with this certificate."""
    async with (
        StoreSettings(zk_hosts, cluster, secret, session_timeout, zk_tls).open() as zk,
        anyio.create_task_group() as group,
    ):
        group.start_soon(campaign_and_lead, zk, cluster, name, secret, dashboard)
        await until_terminated(_nothing_to_drain)
        group.cancel_scope.cancel()
    log.info("master stopped", cluster=cluster, master=name)


async def _nothing_to_drain() -> None:
    """A master holds no data: it stops at once."""


async def campaign_and_lead(
    zk: ClusterStore,
    cluster: str,
    name: str,
    secret: bytes,
    dashboard: DashboardSettings | None,
    identity: dict[str, Any] | None = None,
) -> None:
    """Campaign for leadership and lead until the session is lost; then campaign again. ``identity``: what
    the candidate node says of this master (default: its name, process id and host)."""
    identity = identity or {"name": name, "pid": os.getpid(), "host": socket.gethostname()}
    while True:
        election = LeaderElection(zk, identity)
        epoch = await _campaign(election)
        log.info("leading the cluster", cluster=cluster, master=name, epoch=epoch)
        leader = Leader(zk, epoch, secret)
        async with anyio.create_task_group() as group:
            group.start_soon(leader.run)
            # the jobs' adaptation policies, fenced; each job's topology built once for all three
            group.start_soon(AdaptationLoop(zk, secret, leader.fence, outlines=leader.outlines).run)
            if dashboard is not None:  # it moves with leadership
                group.start_soon(serve_dashboard, zk, secret, name, dashboard, leader.outlines)
            await _lead_until_lost(zk)
            group.cancel_scope.cancel()
        log.warning("lost leadership", cluster=cluster, master=name, epoch=epoch)
        election.candidate = None  # the lost session took our candidate node too


async def serve_dashboard(
    zk: ClusterStore, secret: bytes, name: str, settings: DashboardSettings, outlines: Outlines | None = None
) -> None:
    """The dashboard, while this master leads; its URL in ``/dashboard`` (another port when ``port`` is
    taken). aiohttp is imported here: a standby master does not pay for it."""
    from streamlet.backends.monitor.cluster_source import ClusterSource
    from streamlet.backends.monitor.server import Dashboard, serving

    zookeepers, tls = (zk.hosts, four_letter_tls(zk.tls)) if isinstance(zk, ZkStore) else (None, None)

    def dashboard() -> Dashboard:  # one per attempt to bind: a failed bind's clean-up closes the one it had
        return Dashboard(ClusterSource(zk, secret, outlines, zookeepers, tls), token=settings.token)

    host, port = settings.host, settings.port
    try:
        async with serving(dashboard(), host, port) as url:
            await _publish_dashboard(zk, url, name)
    except OSError as exc:
        log.warning("dashboard port taken, serving on another", port=port, reason=str(exc))
        async with serving(dashboard(), host, 0) as url:
            await _publish_dashboard(zk, url, name)


async def _publish_dashboard(zk: ClusterStore, url: str, name: str) -> None:
    """Say where the dashboard is (an ephemeral node: it goes with this master's session), then serve on. A
    session that cannot write it (suspended, expired: leadership is about to go) only leaves it unsaid."""
    try:
        await zk.delete(paths.DASHBOARD)  # a former leader's, if its session lingers
        await zk.create(paths.DASHBOARD, {"url": url, "master": name}, ephemeral=True)
        log.info("dashboard", url=url, master=name)
    except CoordinationError as exc:
        log.warning("could not publish the dashboard's URL", url=url, error=str(exc))
    await anyio.sleep_forever()


async def _campaign(election: LeaderElection) -> int:
    """Campaign until leading. The session lost on the way (expired while this master was cut off, the
    connection dropped) does not end the master: it campaigns again once the store answers, with a new
    candidate node when the old one went with the old session."""
    while True:
        try:
            return await election.campaign()
        except (NodeExists, VersionConflict, NotAuthorized):
            raise  # a definitive answer: retrying gets the same
        except CoordinationError as exc:
            log.warning("campaign interrupted, campaigning again", reason=str(exc))
            await anyio.sleep(CAMPAIGN_RETRY)
            with contextlib.suppress(CoordinationError):  # still away: the next campaign finds out
                if election.candidate is not None and await election.zk.get(election.candidate) is None:
                    election.candidate = None


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
    heartbeat: float = 1.0,
    state_dir: Path | None = None,
    bandwidth: float = 1000.0,
    metrics_port: int | None = None,
    tls: TlsSettings | None = None,
    advertise: str | None = None,
    zk_tls: TlsSettings | None = None,
    metrics_token: str | None = None,
) -> None:
    """Serve data connections, register, and heartbeat (every ``heartbeat`` seconds) until stopped; keep
    files only under ``state_dir`` (default ``.streamlet/<worker_id>``). ``bandwidth``: Mbit/s, configured.
    ``metrics_port``: Prometheus ``/metrics`` of this worker on ``host`` (0: any free port; ``None``: off:
    prometheus_client and its HTTP server cost a worker about 6 MB, and the dashboard's covers every worker).
    ``tls``: its certificate (every data-plane and replica connection mutual TLS); ``None``: cleartext.
    ``advertise``: the address peers connect to, when not ``host`` (which the data server listens on).
    ``zk_tls``: reach ZooKeeper's TLS client ports with this certificate (``None``: plain, on 127.0.0.1).
    ``metrics_token``: the bearer token a scrape of ``/metrics`` must carry (``None``: none asked)."""
    state_dir = state_dir or Path(".streamlet") / worker_id
    state_dir.mkdir(parents=True, exist_ok=True)
    async with (
        StoreSettings(zk_hosts, cluster, secret, session_timeout, zk_tls).open() as zk,
        DataServer(secret, host=host, tls=tls, advertise=advertise) as server,
        TcpClient(secret, tls=tls, name=worker_id) as client,
    ):
        info: WorkerInfo = {
            "host": server.advertised, "data_port": server.port, "capacity": capacity, "labels": labels or [],
            "pid": os.getpid(), "bandwidth_mbit": bandwidth, "tls": tls is not None,
        }  # fmt: skip
        worker = assemble_worker(zk, worker_id, info, server, client, secret, state_dir, heartbeat)
        registration, jobs = worker.registration, worker.jobs
        metrics = None
        if metrics_port is not None:
            metrics = _worker_metrics(worker_id, host, metrics_port, registration, jobs, metrics_token)
        if metrics is not None:
            info["metrics_port"] = metrics.port
        try:
            async with anyio.create_task_group() as group:
                await group.start(serve_worker, worker)
                data = "{}:{}".format(*server.address)
                log.info("worker registered", cluster=cluster, worker=worker_id, data=data)
                await until_terminated(jobs.drain)
                group.cancel_scope.cancel()
        finally:
            if metrics is not None:
                metrics.close()
    log.info("worker stopped", cluster=cluster, worker=worker_id)


def _worker_metrics(
    worker_id: str, host: str, port: int, registration: WorkerRegistration, jobs: WorkerJobs, token: str | None
) -> WorkerMetrics:
    from streamlet.backends.monitor.worker_metrics import WorkerMetrics, worker_sample

    async def sample() -> dict[str, Any]:
        return worker_sample(
            worker_id, registration.last_load, jobs.instance_statistics(), jobs.job_statistics(), jobs.server.counts
        )

    return WorkerMetrics(sample, host, port, token)


async def until_terminated(graceful: Callable[[], Awaitable[None]]) -> None:
    """Return after SIGTERM (or SIGINT) and ``graceful()``; a second signal cuts ``graceful`` short."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            break
        log.warning("stopping gracefully (a second SIGTERM stops at once)")
        async with anyio.create_task_group() as stopping:

            async def on_second_signal() -> None:
                async for _ in signals:
                    log.warning("stopping at once")
                    stopping.cancel_scope.cancel()

            stopping.start_soon(on_second_signal)
            await graceful()
            stopping.cancel_scope.cancel()
