"""The ``streamlet`` command: ``streamlet run path/to/file.py[:name]`` in-process, and the cluster commands."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import click

from streamlet.backends.local import run as run_topology
from streamlet.config_file import config_option
from streamlet.core.runtime.job import DEFAULT_BATCH_SIZE
from streamlet.core.state.rocks import RocksDBState
from streamlet.core.state.store import DirectoryCheckpointStore
from streamlet.errors import ClusterError, StreamletError
from streamlet.gc_policy import tune_gc
from streamlet.loading import PARAM_RULE, load_topology
from streamlet.logs import FORMAT_ENV, FORMATS, LEVEL_ENV, LEVELS, LogSettings, configure_logging
from streamlet.run_report import DEFAULT_ROWS, SORT_CHOICES, ReportOptions, print_report, to_json

if TYPE_CHECKING:
    from streamlet.backends.cluster.client.terminal import SubmitProgress
    from streamlet.backends.cluster.tree.zk import StoreSettings
    from streamlet.transport.tls import TlsSettings


@click.group()
@click.version_option(package_name="streamlet")
@click.option(
    "--log-level", type=click.Choice(LEVELS), default="warning", show_default=True, envvar=LEVEL_ENV,
    help=f"log lines at this level and above go to stderr (or set {LEVEL_ENV})",
)  # fmt: skip
@click.option(
    "--log-format", type=click.Choice(FORMATS), default="console", show_default=True, envvar=FORMAT_ENV,
    help=f"console: readable; json: one JSON object per line (or set {FORMAT_ENV})",
)  # fmt: skip
@click.pass_context
def main(context: click.Context, log_level: str, log_format: str) -> None:
    """streamlet: asyncio-native stream processing."""
    # The command is an application, so it may set up logging (the library never does).
    context.obj = LogSettings(log_level, log_format)
    configure_logging(context.obj)


def _log_settings(context: click.Context) -> LogSettings | None:
    """The log settings given to ``streamlet`` (as options or in the environment); ``None``: the defaults."""
    root = context.find_root()
    sources = [root.get_parameter_source(name) for name in ("log_level", "log_format")]
    if all(source == click.core.ParameterSource.DEFAULT for source in sources):
        return None
    settings: LogSettings = root.obj
    return settings


DEFAULT_CHECKPOINT_INTERVAL = 1.0  # seconds; --state-dir alone should still leave something to resume from


@main.command("run")
@click.argument("target")
@click.option(
    "--param", "params", multiple=True, metavar="NAME=VALUE", callback=lambda _c, _p, v: _parse_params(v),
    help=f"pass NAME=VALUE to the function that builds the topology (repeatable). {PARAM_RULE}",
)  # fmt: skip
@click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="keep the job's checkpoints here (one job per directory); a rerun of a job that did not finish "
    "resumes from its latest checkpoint",
)  # fmt: skip
@click.option(
    "--checkpoint-interval", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
    help=f"seconds between checkpoints (needs --state-dir; default {DEFAULT_CHECKPOINT_INTERVAL:g})",
)  # fmt: skip
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=DEFAULT_BATCH_SIZE, show_default=True, metavar="N",
    help="records per batch a source reads and a task emits",
)  # fmt: skip
@click.option(
    "--rows", type=click.IntRange(min=0), default=None, metavar="N",
    help=f"records shown per collecting sink (default {DEFAULT_ROWS}; with --json, all)",
)  # fmt: skip
@click.option(
    "--sort", type=click.Choice(SORT_CHOICES), default=None,
    help="order each sink's records by key, value or ts (-FIELD: descending; ties by key, value, ts) "
    "before taking the first --rows (default: the order the sink received them)",
)  # fmt: skip
@click.option(
    "--processes", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
    help="run the instances in N worker processes of this machine (its cores), over TCP on 127.0.0.1",
)  # fmt: skip
@click.option(
    "--state-backend", type=click.Choice(["memory", "rocksdb"]), default="memory", show_default=True,
    help="where tasks keep keyed state: in memory, or in RocksDB for state bigger than memory (its databases "
    "under --state-dir/rocksdb, else in a temporary folder; see the State backends page)",
)  # fmt: skip
@click.option(
    "--state-cache-mb", type=click.IntRange(min=1), default=64, show_default=True, metavar="MB",
    help="RocksDB's block cache, with --state-backend rocksdb",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print the same report as JSON, for scripts")
def run_command(
    target: str, params: dict[str, str], state_dir: Path | None, checkpoint_interval: float | None,
    batch_size: int, rows: int | None, sort: str | None, processes: int, state_backend: str, state_cache_mb: int,
    as_json: bool,
) -> None:  # fmt: skip
    """Run TARGET (path/to/file.py[:NAME]) in-process and show what it produced.

    NAME may be a Topology object or a function returning one; without it the
    file's single module-level Topology is used, or else its function
    build_topology. The report shows each CollectSink's first records,
    then records in and out per node, the job's counters, its wall time and
    the rate from the sources.
    """
    if checkpoint_interval is not None and state_dir is None:
        raise click.UsageError("--checkpoint-interval needs --state-dir (where the checkpoints go)")
    try:
        topology = load_topology(target, params=params)
        resumed_from = _resume_point(state_dir, topology.name)
        job_options: dict[str, Any] = {}
        if state_dir is not None:
            interval = checkpoint_interval or DEFAULT_CHECKPOINT_INTERVAL
            job_options = {"checkpoint_dir": state_dir, "checkpoint_interval": interval}
        if state_backend == "rocksdb":
            place = None if state_dir is None else state_dir / "rocksdb"
            job_options["state_backend"] = RocksDBState(place, cache_mb=state_cache_mb)
        tune_gc()  # this process is streamlet's own: the streaming GC policy (see streamlet.gc_policy)
        if processes == 1 and not as_json and sys.stderr.isatty():  # someone watches: a progress line meanwhile
            result = _run_watched(topology, batch_size=batch_size, **job_options)
        else:
            result = run_topology(topology, batch_size=batch_size, processes=processes, **job_options)
    except Exception as exc:  # noqa: BLE001 - user code too: one line and a non-zero exit, never a traceback
        _fail(exc)
    options = ReportOptions(rows, sort, resumed_from, state_dir)
    if as_json:
        click.echo(json.dumps(to_json(result, options), indent=2))
    else:
        print_report(result, options)


def _parse_params(items: tuple[str, ...]) -> dict[str, str]:
    """``("events=2000", ...)`` -> ``{"events": "2000"}``; the values are converted against the function later."""
    params: dict[str, str] = {}
    for item in items:
        name, equals, value = item.partition("=")
        name = name.strip()
        if not equals or not name.isidentifier():
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="'--param'")
        if name in params:
            raise click.BadParameter(f"{name} given twice", param_hint="'--param'")
        params[name] = value
    return params


def _parse_secret_params(items: tuple[str, ...]) -> dict[str, str]:
    """``("dsn=@/etc/app/dsn",)`` -> ``{"dsn": <the file's text, without its trailing newline>}``. A value on
    the command line is refused: it would show in ``ps`` and the shell's history."""
    params: dict[str, str] = {}
    for item in items:
        name, equals, value = item.partition("=")
        name = name.strip()
        if not equals or not name.isidentifier() or not value.startswith("@"):
            raise click.BadParameter(
                f"expected NAME=@FILE (the value read from FILE: on the command line it would show in ps and the "
                f"shell's history), got {name + '=...' if equals else repr(item)}",
                param_hint="'--secret-param'",
            )
        if name in params:
            raise click.BadParameter(f"{name} given twice", param_hint="'--secret-param'")
        try:
            params[name] = Path(value[1:]).read_text(encoding="utf-8").rstrip("\n")
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {value[1:]}: {exc.strerror}", param_hint="'--secret-param'"
            ) from None
    return params


def _run_watched(topology: Any, **options: Any) -> Any:
    """Run in this process with a progress line on stderr (see ``streamlet.run_progress``)."""
    from rich.console import Console

    from streamlet.backends.local import loop_options
    from streamlet.run_progress import run_showing_progress

    watched = partial(run_showing_progress, topology, Console(stderr=True), **options)
    return anyio.run(watched, backend="asyncio", backend_options=loop_options(True))


def _resume_point(state_dir: Path | None, job: str) -> int | None:
    """The epoch a run with ``state_dir`` resumes from; refuses a directory holding another job's checkpoints."""
    if state_dir is None:
        return None
    latest = DirectoryCheckpointStore(state_dir).latest()
    if latest is None:
        return None
    epoch, document = latest
    if document["job"] != job:
        raise StreamletError(
            f"{state_dir} holds checkpoints of job '{document['job']}', not '{job}': give each job its own --state-dir"
        )
    return None if document["finished"] else epoch


DEFAULT_STATE_DIR = ".streamlet"
ZK_TLS_HELP = "reach ZooKeeper on its TLS client ports (secureClientPort) with this process's certificate"
UNSPECIFIED = ("0.0.0.0", "::")  # wildcard addresses: a server listens on all, nobody connects to them
WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _secret(secret_file: Path | None) -> bytes:
    from streamlet.backends.cluster.local.local_cluster import process_secret

    try:
        return process_secret(secret_file)
    except StreamletError as exc:
        _fail(exc)


SECRET_FILE_HELP = (
    "file holding the cluster secret, readable by its owner only (mode 0600; 'cluster up' passes its own); "
    "without it, STREAMLET_SECRET (hex), removed from the environment at start"
)


def _client_secret(action: str, state_dir: Path) -> bytes:
    """The secret a command that changes the cluster needs: from the environment, else the state dir."""
    from streamlet.backends.cluster.local.local_cluster import find_secret

    secret = find_secret(state_dir)
    if secret is None:
        raise StreamletError(
            f"{action} needs the cluster secret: set STREAMLET_SECRET (hex) or run it with the --state-dir "
            f"that 'streamlet cluster up' wrote (looked in {state_dir})"
        )
    return secret


def _reader_secret(state_dir: Path) -> bytes | None:
    """The secret a command that only reads uses when it finds one (job data is readable with it only; without
    it, the read of a job's node says what to do)."""
    from streamlet.backends.cluster.local.local_cluster import find_secret

    return find_secret(state_dir)


def _monitor_token(state_dir: Path) -> str:
    """The bearer token of a dashboard or a worker's ``/metrics``, on any address (loopback too: any local user
    reaches it): the state dir's (made on first use, 0600)."""
    from streamlet.backends.monitor.access import TOKEN_FILE, load_or_make_token

    return load_or_make_token(state_dir / TOKEN_FILE)


def _certificates(folder: Path, process_id: str) -> TlsSettings:
    """This process's TLS files (issued here when the CA's key is in ``folder``), or the error saying what to do."""
    from streamlet.backends.cluster.local.certificates import process_tls

    try:
        return process_tls(folder, process_id)
    except StreamletError as exc:  # no certificate: say what to do
        _fail(exc)


@main.command("master")
@config_option
@click.option("--zk", required=True, help="ZooKeeper HOST:PORT")
@click.option("--name", default="default", show_default=True, help="cluster name")
@click.option("--id", "master_id", default=None, help="this master's name (default: master-<pid>)")
@click.option(
    "--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(file_okay=False, path_type=Path),
    help="its files go under STATE_DIR/<id>/",
)  # fmt: skip
@click.option(
    "--dashboard-port", default=8780, show_default=True, type=click.IntRange(min=0, max=65535),
    help="while leading, serve the dashboard and the cluster's /metrics here (0: any free port; "
    "another when taken; 'cluster status' gives the URL)",
)  # fmt: skip
@click.option("--dashboard-host", default="127.0.0.1", show_default=True, help="address the dashboard listens on")
@click.option("--no-dashboard", is_flag=True, help="serve no dashboard")
@click.option("--secret-file", default=None, type=click.Path(dir_okay=False, path_type=Path), help=SECRET_FILE_HELP)
@click.option(
    "--tls-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
    help="the cluster CA's ca.pem and this master's <id>.pem and <id>.key (default: STATE_DIR/tls), for --zk-tls",
)  # fmt: skip
@click.option("--zk-tls", is_flag=True, help=ZK_TLS_HELP)
def master_command(
    zk: str, name: str, master_id: str | None, state_dir: Path, dashboard_port: int, dashboard_host: str,
    no_dashboard: bool, secret_file: Path | None, tls_dir: Path | None, zk_tls: bool,
) -> None:  # fmt: skip
    """Run one master: a candidate that leads the cluster when elected."""
    from streamlet.backends.cluster.local.run import DashboardSettings, run_master

    master_id = master_id or f"master-{os.getpid()}"
    (state_dir / master_id).mkdir(parents=True, exist_ok=True)
    token = _monitor_token(state_dir)
    dashboard = None if no_dashboard else DashboardSettings(dashboard_host, dashboard_port, token)
    certificates = _certificates(tls_dir or state_dir / "tls", master_id) if zk_tls else None
    run = partial(run_master, dashboard=dashboard, zk_tls=certificates)
    tune_gc()
    anyio.run(run, zk, name, master_id, _secret(secret_file), backend_options={"use_uvloop": True})


@main.command("worker")
@config_option
@click.option("--zk", required=True, help="ZooKeeper HOST:PORT")
@click.option("--name", default="default", show_default=True, help="cluster name")
@click.option("--id", "worker_id", default=None, help="this worker's name (default: worker-<pid>)")
@click.option(
    "--host", default="127.0.0.1", show_default=True,
    help="address its data plane listens on, and the one other workers reach it on unless --advertise says",
)  # fmt: skip
@click.option(
    "--advertise", default=None,
    help="address other workers reach this one on, when not --host (a --host of 0.0.0.0, a NAT)",
)  # fmt: skip
@click.option("--capacity", default=8, show_default=True, type=click.IntRange(min=1), help="instances it takes")
@click.option("--label", "labels", multiple=True, help="a label tasks can ask for (add_task(labels=...)), repeatable")
@click.option(
    "--heartbeat", default=1.0, show_default=True, type=click.FloatRange(min=0.1, max=2.0),
    help="seconds between heartbeats (the adaptation loop's finest window)",
)  # fmt: skip
@click.option(
    "--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(file_okay=False, path_type=Path),
    help="its files (checkpoints, other workers' replicas) go under STATE_DIR/<id>/, on its own disk",
)  # fmt: skip
@click.option(
    "--bandwidth", default=1000.0, show_default=True, type=click.FloatRange(min=0, min_open=True), metavar="MBIT/S",
    help="its network bandwidth, as configured (the backup location controller weighs links by it)",
)  # fmt: skip
@click.option(
    "--metrics-port", default=None, type=click.IntRange(min=0, max=65535),
    help="serve this worker's Prometheus /metrics on its --host (0: any free port; 'cluster status' gives the "
    "URL); the dashboard's /metrics covers every worker without it",
)  # fmt: skip
@click.option("--secret-file", default=None, type=click.Path(dir_okay=False, path_type=Path), help=SECRET_FILE_HELP)
@click.option(
    "--tls-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
    help="the cluster CA's ca.pem and this worker's <id>.pem and <id>.key (default: STATE_DIR/tls)",
)  # fmt: skip
@click.option("--no-tls", is_flag=True, help="cleartext data plane (a loopback-only cluster; every process alike)")
@click.option("--zk-tls", is_flag=True, help=ZK_TLS_HELP)
def worker_command(
    zk: str, name: str, worker_id: str | None, host: str, advertise: str | None, capacity: int,
    labels: tuple[str, ...], heartbeat: float, state_dir: Path, bandwidth: float, metrics_port: int | None,
    secret_file: Path | None, tls_dir: Path | None, no_tls: bool, zk_tls: bool,
) -> None:  # fmt: skip
    """Run one worker: it registers, heartbeats and runs the instances assigned to it."""
    from streamlet.backends.cluster.local.certificates import TLS_FOLDER
    from streamlet.backends.cluster.local.run import run_worker

    worker_id = worker_id or f"worker-{os.getpid()}"
    if not WORKER_ID.fullmatch(worker_id):  # it names folders and acknowledgements ('owner~backup')
        raise click.BadParameter(f"{worker_id!r}: use 1-64 letters, digits, '_', '-' or '.'", param_hint="--id")
    if advertise is None and host in UNSPECIFIED:  # peers cannot connect to "every address"
        raise click.BadParameter(f"{host} listens on every address: say which one peers reach with --advertise")
    certificates = None if no_tls and not zk_tls else _certificates(tls_dir or state_dir / TLS_FOLDER, worker_id)
    run = partial(
        run_worker, heartbeat=heartbeat, state_dir=state_dir / worker_id, bandwidth=bandwidth,
        metrics_port=metrics_port, tls=None if no_tls else certificates, advertise=advertise,
        zk_tls=certificates if zk_tls else None,
        metrics_token=None if metrics_port is None else _monitor_token(state_dir),
    )  # fmt: skip
    tune_gc()
    secret = _secret(secret_file)
    anyio.run(run, zk, name, worker_id, host, secret, capacity, sorted(labels), backend_options={"use_uvloop": True})


@main.group("cluster")
def cluster_group() -> None:
    """A ZooKeeper-coordinated cluster of processes on this machine."""


@cluster_group.command("up")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--masters", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--zk", default=None, help="use this ZooKeeper instead of starting one")
@click.option(
    "--zookeepers", default=1, show_default=True, type=click.Choice(["1", "3", "5"]),
    help="ZooKeeper servers to start: 1, or an ensemble of 3 or 5 (a majority must serve)",
)  # fmt: skip
@click.option("--name", default="default", show_default=True)
@click.option("--capacity", default=8, show_default=True, type=click.IntRange(min=1), help="instances per worker")
@click.option("--label", "labels", multiple=True, help="WORKER=LABEL, e.g. worker-1=gpu; repeatable")
@click.option(
    "--loopback-hosts", is_flag=True,
    help="each worker on its own loopback address (127.0.0.2, 127.0.0.3, ...), as separate machines",
)  # fmt: skip
@click.option(
    "--no-tls", is_flag=True,
    help="the data plane in cleartext (a loopback-only cluster, e.g. for benchmarks); default: mutual TLS",
)  # fmt: skip
@click.option(
    "--dashboard-port", default=8780, show_default=True, type=click.IntRange(min=0, max=65535),
    help="where the leading master serves the dashboard (0: any free port; another when this one is taken)",
)  # fmt: skip
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path))
@click.pass_context
def cluster_up(
    context: click.Context,
    workers: int,
    masters: int,
    zk: str | None,
    zookeepers: str,
    name: str,
    capacity: int,
    labels: tuple[str, ...],
    loopback_hosts: bool,
    no_tls: bool,
    dashboard_port: int,
    state_dir: Path,
) -> None:
    """Start ZooKeeper (unless --zk), the masters and the workers in the background; print the status once
    the leader serves the dashboard (its URL carries the token every request needs)."""
    from streamlet.backends.cluster.client.status import format_status, wait_until_ready
    from streamlet.backends.cluster.local import local_cluster
    from streamlet.backends.monitor.access import with_token

    try:
        by_worker = _labels_by_worker(labels, workers)
        local_cluster.refuse_if_recorded(state_dir)  # before anything starts: a running cluster stays untouched
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    try:
        state = local_cluster.up(
            state_dir, name, workers, masters, zk, capacity, by_worker, loopback_hosts=loopback_hosts,
            logs=_log_settings(context), zookeepers=int(zookeepers), tls=not no_tls, dashboard_port=dashboard_port,
        )  # fmt: skip
        status = anyio.run(partial(wait_until_ready, state.settings(), workers, dashboard=True))
        status["dashboard"] = with_token(status["dashboard"], state_dir)
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        if (state_dir / local_cluster.STATE_FILE).exists():
            local_cluster.down(state_dir)  # what this command started, and nothing else: it refused above
        _fail(exc)
    click.echo(f"ZooKeeper at {state.zk}; state in {state_dir}")
    for process in state.processes:
        click.echo(f"  {process['role']:<9} {process['id']:<10} pid {process['pid']}")
    click.echo(format_status(status))


def _labels_by_worker(labels: tuple[str, ...], workers: int) -> dict[str, list[str]]:
    names = [f"worker-{index}" for index in range(workers)]
    by_worker: dict[str, list[str]] = {}
    for item in labels:
        worker, _, label = item.partition("=")
        if not worker or not label:
            raise click.BadParameter(f"expected WORKER=LABEL, got {item!r}")
        if worker not in names:
            raise click.BadParameter(f"--label {item}: no worker called '{worker}' (workers: {', '.join(names)})")
        by_worker.setdefault(worker, []).append(label)
    return by_worker


@cluster_group.command("add-worker")
@click.option("--capacity", default=8, show_default=True, type=click.IntRange(min=1), help="instances it takes")
@click.option("--label", "labels", multiple=True, help="a label tasks can ask for, repeatable")
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path))
@click.pass_context
def cluster_add_worker(context: click.Context, capacity: int, labels: tuple[str, ...], state_dir: Path) -> None:
    """Start one more worker for the local cluster and wait until it is live; new work (new jobs, next attempts,
    stalled jobs, live changes, a rebalance) goes to it."""
    from streamlet.backends.cluster.client.status import wait_for_worker
    from streamlet.backends.cluster.local import local_cluster

    try:
        worker_id = local_cluster.add_worker(state_dir, capacity, list(labels), logs=_log_settings(context))
        state = local_cluster.ClusterState.load(state_dir)
        # live when this returns: rebalance sees it
        anyio.run(wait_for_worker, state.settings(), worker_id)
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    click.echo(f"started {worker_id} (capacity {capacity})")


@cluster_group.command("rotate-certificates")
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path))
def cluster_rotate_certificates(state_dir: Path) -> None:
    """Issue every worker of the local cluster a new certificate from its CA, in place: each worker's next
    connections use it, links up now stay up, no job stops."""
    from streamlet.backends.cluster.local import certificates, local_cluster

    try:
        state = local_cluster.ClusterState.load(state_dir)
        if not state.tls:
            raise click.ClickException("this cluster runs without TLS (--no-tls): no certificates to rotate")
        folder = state_dir / certificates.TLS_FOLDER
        rotated = [p["id"] for p in state.processes if p["role"] == "worker"]
        for worker in rotated:
            certificates.issue(folder, worker)
    except click.ClickException:
        raise
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    click.echo(f"issued new certificates for {', '.join(rotated)} (valid {certificates.DAYS} days)")


@cluster_group.command("status")
@click.option("--zk", default=None)
@click.option("--name", default=None)
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def cluster_status(zk: str | None, name: str | None, state_dir: Path, as_json: bool) -> None:
    """Leader and epoch, candidates, workers with state and load, jobs (with the cluster secret, from
    STREAMLET_SECRET or --state-dir: the jobs and the heartbeats are readable with it only)."""
    from streamlet.backends.cluster.client.status import format_status
    from streamlet.backends.cluster.tree.quorum import refuse_without_quorum
    from streamlet.backends.cluster.tree.status import read_status
    from streamlet.backends.cluster.tree.zk import four_letter_tls
    from streamlet.backends.monitor.access import with_token

    async def show(settings: StoreSettings) -> str:
        tls = four_letter_tls(settings.tls)
        modes = await anyio.to_thread.run_sync(refuse_without_quorum, settings.hosts, tls)  # NoQuorum names them
        async with settings.open() as store:
            status = await read_status(store)
        status["zookeeper"] = [{"address": address, "mode": mode} for address, mode in modes]
        status["dashboard"] = with_token(status["dashboard"], state_dir)
        return json.dumps(status, indent=2) if as_json else format_status(status)

    try:
        click.echo(anyio.run(show, _settings(zk, name, state_dir, _reader_secret(state_dir))))
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)


@cluster_group.command("forget-worker")
@click.argument("worker")
@click.option("--zk", default=None, help="ZooKeeper HOST:PORT (default: the cluster in --state-dir)")
@click.option("--name", "cluster", default=None, help="cluster name")
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path))
def forget_worker_command(worker: str, zk: str | None, cluster: str | None, state_dir: Path) -> None:
    """Stop listing WORKER as LOST (a worker that will not come back; one that does is listed again anyway)."""
    from streamlet.backends.cluster.tree.lost import forget

    async def forget_it(settings: StoreSettings) -> bool:
        async with settings.open() as store:
            return await forget(store, worker)

    try:
        forgotten = anyio.run(forget_it, _settings(zk, cluster, state_dir, _client_secret("forget-worker", state_dir)))
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    click.echo(f"forgot lost worker '{worker}'" if forgotten else f"no lost worker '{worker}' is listed")


@cluster_group.command("down")
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path))
def cluster_down(state_dir: Path) -> None:
    """Stop every process 'cluster up' started, by PID: the workers drain (30 s at most), the masters and
    ZooKeeper quit (5 s each); whatever has not exited by then is killed (SIGKILL), so it returns within 40 s."""
    from streamlet.backends.cluster.local import local_cluster

    try:
        stopped = local_cluster.down(state_dir)
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    names = [f"{p['id']} ({p['pid']}{', killed' if p['how'] == 'killed' else ''})" for p in stopped]
    click.echo(f"stopped {len(stopped)} processes: " + ", ".join(names))


def _cluster_options(command: Any) -> Any:
    for option in (
        click.option("--zk", default=None, help="ZooKeeper HOST:PORT (default: the cluster in --state-dir)"),
        click.option("--name", "cluster", default=None, help="cluster name"),
        click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path)),
    ):
        command = option(command)
    return command


@main.command("submit")
@click.argument("target")
@click.option("--job", "job_name", default=None, help="job name (default: the topology's)")
@click.option("--parallelism", "-p", multiple=True, help="TASK=N, repeatable")
@click.option(
    "--param", "params", multiple=True, metavar="NAME=VALUE", callback=lambda _c, _p, v: _parse_params(v),
    help=f"pass NAME=VALUE to the function that builds the topology, in every process that builds it (as "
    f"'streamlet run' does; recorded in the signed spec, listed by 'jobs'; repeatable). {PARAM_RULE}",
)  # fmt: skip
@click.option(
    "--secret-param", "secret_params", multiple=True, metavar="NAME=@FILE",
    callback=lambda _c, _p, v: _parse_secret_params(v),
    help="pass NAME to the function that builds the topology, its value read from FILE (a DSN with its password): "
    "sealed with the cluster secret in the spec, opened only where the topology is built, never shown "
    "(jobs lists its name); repeatable",
)  # fmt: skip
@click.option(
    "--spread", is_flag=True,
    help="put each node's instances on different workers from the start (default: co-located on as few workers "
    "as fit, which keeps records off the network; the adaptation's 'spread' policy moves CPU-bound tasks later, "
    "'streamlet rebalance' moves instances of a running job)",
)  # fmt: skip
@click.option(
    "--state-backend", type=click.Choice(["memory", "rocksdb"]), default="memory", show_default=True,
    help="where the job's tasks keep keyed state: in memory, or in RocksDB on each worker's disk (under its "
    "state dir) for state bigger than memory",
)  # fmt: skip
@click.option(
    "--state-cache-mb", type=click.IntRange(min=1), default=64, show_default=True, metavar="MB",
    help="RocksDB's block cache per job on each worker, with --state-backend rocksdb",
)  # fmt: skip
@click.option("--wait/--no-wait", default=True, show_default=True, help="wait until the job ends")
@click.option(
    "--timeout", default=300.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="seconds to wait"
)  # fmt: skip
@click.option("--results", default=None, type=click.Path(path_type=Path), help="write collected sink records (JSON)")
@click.option(
    "--checkpoint-interval", default=None, type=click.FloatRange(min=0, min_open=True),
    help="take a checkpoint every SECONDS",
)  # fmt: skip
@click.option(
    "--replicas", default=None, type=click.IntRange(min=0),
    help="copies of each instance's checkpoint on other workers (default 1, or 0 on a one-worker cluster)",
)  # fmt: skip
@click.option(
    "--replica-placement", default="controller", type=click.Choice(["controller", "random"]),
    help="where the copies go: the leader's controller (the default), or random workers (to compare)",
)  # fmt: skip
@click.option(
    "--from-savepoint", default=None, type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="start from this savepoint (task names and state shapes must match; needs --checkpoint-interval)",
)  # fmt: skip
@click.option(
    "--adapt",
    default=None,
    help="adaptation policies, comma-separated: autoscale, balance, migrate, rebalance, shed, spread "
    "(default: spread; none: no policy)",
)
@click.option("--bounds", multiple=True, help="TASK=LOW:HIGH instances autoscaling may give TASK, repeatable")
@click.option("--adapt-interval", default=2.0, show_default=True, type=float, help="seconds per statistics window")
@click.option("--adapt-cooldown", default=6.0, show_default=True, type=float, help="seconds after a decision")
@_cluster_options
def submit_command(
    target: str, job_name: str | None, parallelism: tuple[str, ...], params: dict[str, str],
    secret_params: dict[str, str], spread: bool, state_backend: str, state_cache_mb: int, wait: bool, timeout: float,
    results: Path | None, checkpoint_interval: float | None, replicas: int | None, replica_placement: str,
    from_savepoint: Path | None, adapt: str | None, bounds: tuple[str, ...], adapt_interval: float,
    adapt_cooldown: float, zk: str | None, cluster: str | None, state_dir: Path,
) -> None:  # fmt: skip
    """Run TARGET (module:name or path/to/file.py[:name]) on the cluster, by reference."""
    from streamlet.backends.cluster.client import api as cluster_client
    from streamlet.backends.cluster.client.job_commands import check_job_name

    try:
        if job_name is not None:
            check_job_name(job_name)  # bad options are refused before anything is contacted
        adapting = _adapt_settings(adapt, bounds, adapt_interval, adapt_cooldown)
        counts = dict(_parallelism(item) for item in parallelism)
        checkpoint: dict[str, Any] | None = None
        if checkpoint_interval is not None:
            checkpoint = {"interval": checkpoint_interval, "replicas": replicas}
            if replica_placement != "controller":
                checkpoint["placement"] = replica_placement
        elif replicas is not None or replica_placement != "controller":
            raise click.UsageError(
                "--replicas and --replica-placement need --checkpoint-interval (they copy checkpoints)"
            )
        clash = sorted(set(params) & set(secret_params))
        if clash:
            raise click.UsageError(f"{', '.join(clash)} given as --param and --secret-param")
        state = None if state_backend == "memory" else {"backend": state_backend, "cache_mb": state_cache_mb}
        submission = cluster_client.Submission(
            target, job_name, counts, checkpoint, from_savepoint, adapting, params, spread, secret_params, state
        )
        secret = _client_secret("submit", state_dir)
        settings = _settings(zk, cluster, state_dir, secret)
        relocate = None if zk is not None else partial(_recorded_settings, cluster, state_dir, secret)
        with _progress(wait) as watch:
            run = partial(cluster_client.submit_and_wait, watch=watch, relocate=relocate)
            outcome = anyio.run(run, settings, submission, wait, timeout)
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    click.echo(cluster_client.describe(outcome))
    if results is not None:
        results.write_text(json.dumps(cluster_client.collected(outcome)), encoding="utf-8")
    if outcome["state"] in ("FAILED", "KILLED"):
        sys.exit(1)


@contextmanager
def _progress(wait: bool) -> Iterator[SubmitProgress | None]:
    """``submit --wait``'s progress line, on a terminal only: scripts read the same output as before."""
    if not wait or not sys.stdout.isatty():
        yield None
        return
    from rich.console import Console

    from streamlet.backends.cluster.client.terminal import SubmitProgress

    with SubmitProgress(Console()) as progress:
        yield progress


def _adapt_settings(
    adapt: str | None, bounds: tuple[str, ...], interval: float, cooldown: float
) -> dict[str, Any] | None:
    """``--adapt`` and its options as the spec holds them (``None``: no policy; bounds alone are an error)."""
    from streamlet.adaptation.settings import AdaptSettings, parse_bounds, parse_policies

    if adapt is None:
        if bounds:
            raise StreamletError("--bounds applies to --adapt autoscale")
        return None
    return AdaptSettings(parse_policies(adapt), parse_bounds(bounds), interval, cooldown).to_data()


def _parallelism(item: str) -> tuple[str, int]:
    task, _, count = item.partition("=")
    if not count.isdigit() or int(count) < 1:
        raise click.BadParameter(f"expected TASK=N with N >= 1, got {item!r}")
    return task, int(count)


@main.command("jobs")
@_cluster_options
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def jobs_command(zk: str | None, cluster: str | None, state_dir: Path, as_json: bool) -> None:
    """Every job on the cluster: state, reason (why it failed), attempt, workers, dead letters reported (job data:
    needs the cluster secret, from STREAMLET_SECRET or --state-dir)."""
    from streamlet.backends.cluster.client import api as cluster_client
    from streamlet.backends.cluster.tree.jobs import public

    try:
        listing = anyio.run(cluster_client.list_jobs, _settings(zk, cluster, state_dir, _reader_secret(state_dir)))
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    if as_json:
        click.echo(json.dumps([public(status) for status in listing], indent=2))
        return
    for status in listing:
        click.echo(cluster_client.describe_listed(status))


@main.command("top")
@_cluster_options
@click.option("--once", is_flag=True, help="print one frame and exit (rates once every worker beat twice)")
@click.option(
    "--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1), help="seconds between frames"
)  # fmt: skip
def top_command(zk: str | None, cluster: str | None, state_dir: Path, once: bool, interval: float) -> None:
    """A live view of the workers (state, CPU, RSS, instances) and jobs (state, attempt, records in and out
    per second, from the heartbeats; needs the cluster secret, from STREAMLET_SECRET or --state-dir); Ctrl-C
    leaves it."""
    from rich.console import Console

    from streamlet.backends.cluster.client.terminal import run_top

    try:
        anyio.run(run_top, _settings(zk, cluster, state_dir, _reader_secret(state_dir)), once, interval, Console())
    except KeyboardInterrupt:
        return
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)


@main.command("kill")
@click.argument("job")
@_cluster_options
def kill_command(job: str, zk: str | None, cluster: str | None, state_dir: Path) -> None:
    """Ask the workers running JOB to stop it."""
    from streamlet.backends.cluster.client import api as cluster_client

    try:
        state = anyio.run(
            cluster_client.kill, _settings(zk, cluster, state_dir, _client_secret("kill", state_dir)), job
        )
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    if state in ("FINISHED", "FAILED", "KILLED"):
        click.echo(f"job '{job}' has ended already ({state})")
    else:
        click.echo(f"asked the cluster to stop job '{job}' (it was {state})")


@main.command("rescale")
@click.argument("job")
@click.argument("task")
@click.argument("instances", type=int)
@_cluster_options
@click.option("--timeout", default=120.0, show_default=True, help="seconds to wait for the change")
def rescale_command(
    job: str, task: str, instances: int, zk: str | None, cluster: str | None, state_dir: Path, timeout: float
) -> None:
    """Give TASK of running JOB INSTANCES instances, live: no restart, only moved key segments move."""
    _live_change("rescale", job, (task, instances), zk, cluster, state_dir, timeout)


@main.command("migrate")
@click.argument("job")
@click.argument("instance")
@click.argument("worker")
@_cluster_options
@click.option("--timeout", default=120.0, show_default=True, help="seconds to wait for the move")
def migrate_command(
    job: str, instance: str, worker: str, zk: str | None, cluster: str | None, state_dir: Path, timeout: float
) -> None:
    """Move INSTANCE (TASK.INDEX) of running JOB to WORKER with its state, live: no restart."""
    _live_change("migrate", job, (instance, worker), zk, cluster, state_dir, timeout)


@main.command("rebalance")
@click.argument("job")
@_cluster_options
@click.option("--dry-run", is_flag=True, help="only print the moves it would make")
@click.option("--timeout", default=120.0, show_default=True, help="seconds to wait for each move")
def rebalance_command(
    job: str, zk: str | None, cluster: str | None, state_dir: Path, dry_run: bool, timeout: float
) -> None:
    """Spread running JOB's instances over the workers now present (new ones included), by live migrations."""
    from streamlet.backends.cluster.client import api as cluster_client

    try:
        settings = _settings(zk, cluster, state_dir, _client_secret("rebalance", state_dir))
        moves, status = anyio.run(cluster_client.rebalance, settings, job, timeout, dry_run)
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    for move in moves:
        click.echo(f"{'would move' if dry_run else 'moved'} {move.instance}: {move.source} -> {move.target}")
    count = status["reconfigurations"]
    done = "planned" if dry_run else "done"
    summary = f"{len(moves)} move{'s' * (len(moves) != 1)} {done}" if moves else "balanced already: nothing to move"
    click.echo(f"job '{job}': {summary} (attempt {status['attempt']}, {count} reconfiguration{'s' * (count != 1)})")


def _live_change(
    action: str, job: str, what: tuple[str, Any], zk: str | None, cluster: str | None, state_dir: Path, timeout: float
) -> None:
    """``rescale`` or ``migrate``: ask, wait for the leader, say how the job stands (a non-zero exit if refused)."""
    from streamlet.backends.cluster.client import api as cluster_client

    call = cluster_client.rescale if action == "rescale" else cluster_client.migrate
    try:
        status = anyio.run(
            call, _settings(zk, cluster, state_dir, _client_secret(action, state_dir)), job, *what, timeout
        )
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    count = status["reconfigurations"]
    click.echo(
        f"job '{job}': {status['reason']} (attempt {status['attempt']}, {count} reconfiguration{'s' * (count != 1)})"
    )


@main.command("savepoint")
@click.argument("job")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@_cluster_options
def savepoint_command(job: str, path: Path, zk: str | None, cluster: str | None, state_dir: Path) -> None:
    """Take a savepoint of running JOB (it goes on) and write it to PATH."""
    _savepoint(job, path, zk, cluster, state_dir, stop=False)


@main.command("stop")
@click.argument("job")
@click.option("--savepoint", "path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="write the savepoint here")  # fmt: skip
@_cluster_options
def stop_command(job: str, path: Path, zk: str | None, cluster: str | None, state_dir: Path) -> None:
    """Stop JOB with a savepoint: its sources stop reading, the savepoint holds all they read, then it ends."""
    _savepoint(job, path, zk, cluster, state_dir, stop=True)


def _savepoint(job: str, path: Path, zk: str | None, cluster: str | None, state_dir: Path, stop: bool) -> None:
    from streamlet.backends.cluster.client import api as cluster_client

    action = "stop" if stop else "savepoint"
    try:
        settings = _settings(zk, cluster, state_dir, _client_secret(action, state_dir))
        epoch = anyio.run(cluster_client.savepoint, settings, job, path.resolve(), stop)
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    ending = "; the job is stopping" if stop else ""
    click.echo(f"savepoint of job '{job}' (checkpoint {epoch}) written to {path}{ending}")


@main.command("rm")
@click.argument("job")
@_cluster_options
def rm_command(job: str, zk: str | None, cluster: str | None, state_dir: Path) -> None:
    """Remove an ended JOB, so that its name can be used again."""
    from streamlet.backends.cluster.client import api as cluster_client

    try:
        anyio.run(cluster_client.remove, _settings(zk, cluster, state_dir, _client_secret("rm", state_dir)), job)
    except Exception as exc:  # noqa: BLE001 - one line and a non-zero exit
        _fail(exc)
    click.echo(f"removed job '{job}'")


def _where(zk: str | None, name: str | None, state_dir: Path) -> tuple[str, str]:
    if zk is not None:
        return zk, name or "default"
    from streamlet.backends.cluster.local.local_cluster import ClusterState

    state = ClusterState.load(state_dir)
    return state.zk, name or state.name


def _settings(zk: str | None, name: str | None, state_dir: Path, secret: bytes | None) -> StoreSettings:
    """How to open the store of the cluster the options name (``--zk``/``--cluster``, else the recorded one,
    over TLS with the state dir's ``client`` certificate when its ZooKeeper serves other hosts over TLS)."""
    from streamlet.backends.cluster.local.local_cluster import ClusterState
    from streamlet.backends.cluster.tree.zk import StoreSettings

    if zk is None and ClusterState.load(state_dir).zk_tls:
        return StoreSettings(*_where(zk, name, state_dir), secret, tls=_certificates(state_dir / "tls", "client"))
    hosts, cluster = _where(zk, name, state_dir)
    return StoreSettings(hosts, cluster, secret)


def _recorded_settings(name: str | None, state_dir: Path, secret: bytes | None) -> StoreSettings | None:
    """Where the state dir records its cluster now (``None`` while none is: between ``down`` and ``up``)."""
    try:
        return _settings(None, name, state_dir, secret)
    except (ClusterError, OSError, ValueError):  # not recorded, or being written right now
        return None


def _fail(exc: BaseException) -> NoReturn:
    click.echo(f"error: {type(exc).__name__}: {exc}", err=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
