"""``streamlet cluster up/status/down``: a cluster of background processes on this machine.

``up`` starts ZooKeeper (unless given ``--zk``: one server, or an ensemble
of 3 or 5 members with ``--zookeepers``), the masters and the workers,
waits until a leader and every worker are registered, and records
in its state directory (``.streamlet/`` by default) how to reach the cluster
and the PID of every process it started. ``down`` stops exactly those PIDs.
The cluster secret is kept in ``<state dir>/secret`` (mode 600); the
processes get the path of that file (``--secret-file``), never the secret
itself on their command line or in their environment (``/proc/<pid>/environ``
keeps what a process started with, and children and job code inherit it).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamlet.backends.cluster.local import certificates
from streamlet.backends.cluster.local.zookeeper_ensemble import ZooKeeperEnsemble
from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer
from streamlet.backends.cluster.tree.zk import StoreSettings
from streamlet.backends.monitor.access import TOKEN_FILE, load_or_make_token
from streamlet.errors import ClusterError
from streamlet.logs import LogSettings

STATE_FILE = "cluster.json"
SECRET_ENV = "STREAMLET_SECRET"


@dataclass
class ClusterState:
    """What ``cluster up`` records, and ``status``/``down``/``submit`` read."""

    name: str
    zk: str
    secret_file: str
    processes: list[dict[str, Any]] = field(default_factory=list)  # role, id, pid
    logs: dict[str, str] | None = None  # the log level and format given to 'up', for the workers added later
    tls: bool = True  # the data plane is mutual TLS (certificates under <state dir>/tls/); False: --no-tls
    zk_tls: bool = False  # ZooKeeper serves other hosts on TLS client ports: clients use <state dir>/tls/client.*

    def save(self, state_dir: Path) -> None:
        """Write the state file."""
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / STATE_FILE).write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, state_dir: Path) -> ClusterState:
        """Read the state file that ``cluster up`` wrote."""
        path = state_dir / STATE_FILE
        if not path.exists():
            raise ClusterError(f"no cluster recorded in {state_dir} (run 'streamlet cluster up' or pass --zk)")
        return cls(**json.loads(path.read_text(encoding="utf-8")))

    def secret(self) -> bytes:
        """The cluster secret."""
        return read_secret_file(Path(self.secret_file))

    def settings(self) -> StoreSettings:
        """How to open this cluster's store, with its secret."""
        return StoreSettings(self.zk, self.name, self.secret())


def streamlet_command() -> list[str]:
    """How to start a ``streamlet`` process, so that ``ps`` shows ``streamlet master ...``."""
    script = shutil.which("streamlet") or str(Path(sys.executable).parent / "streamlet")
    return [sys.executable, script] if Path(script).exists() else [sys.executable, "-P", "-m", "streamlet.cli"]


def start_process(
    role: str, args: list[str], secret_file: str, log_file: Path, logs: LogSettings | None = None
) -> subprocess.Popen[bytes]:
    """A background ``streamlet <role>`` process in its own session (it outlives this command), logging to
    ``log_file`` with ``logs``' level and format (passed in its environment: ``ps`` still shows
    ``streamlet <role> --zk ...``; ``None``: this process's environment decides). It reads the secret from
    ``secret_file``; a ``STREAMLET_SECRET`` of this process is not passed on."""
    environment = {key: value for key, value in os.environ.items() if key != SECRET_ENV}
    environment.update(logs.environment() if logs else {})
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            [*streamlet_command(), role, *args, "--secret-file", secret_file],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment, start_new_session=True,
        )  # fmt: skip


def loopback_host(index: int) -> str:
    """Worker ``index``'s own loopback address: 127.0.0.2 for the first (127.0.0.1 is ZooKeeper's)."""
    if not 0 <= index < 250:
        raise ClusterError(f"no loopback address of its own for worker {index} (at most 250 workers)")
    return f"127.0.0.{index + 2}"


def worker_record(worker_id: str, pid: int, host: str | None) -> dict[str, Any]:
    """What ``cluster.json`` keeps of a worker process (its own address, when it has one)."""
    record: dict[str, Any] = {"role": "worker", "id": worker_id, "pid": pid}
    if host is not None:
        record["host"] = host
    return record


def up(
    state_dir: Path,
    name: str,
    workers: int,
    masters: int,
    zk: str | None,
    capacity: int = 8,
    labels: dict[str, list[str]] | None = None,
    heartbeat: float = 1.0,
    loopback_hosts: bool = False,
    logs: LogSettings | None = None,
    zookeepers: int = 1,
    tls: bool = True,
    dashboard_port: int = 8780,
) -> ClusterState:
    """Start ZooKeeper (unless ``zk``), masters and workers (``labels`` by worker id); record them in ``state_dir``.

    ``zookeepers``: 1 starts a standalone server, 3 or 5 an ensemble (one folder per member under
    ``state_dir``); every process then takes the connect string of all members. ``tls``: a cluster CA under
    ``state_dir/tls`` and mutual TLS between the workers, each with a certificate naming it (``False``: the
    data plane in cleartext, for a loopback-only cluster; the workers get ``--no-tls``).

    With ``loopback_hosts`` each worker serves its data plane on a loopback address of its own
    (``127.0.0.2``, ``127.0.0.3``, …), as separate machines would: nothing may assume one address.
    ``logs``: the masters' and workers' log level and format (recorded: ``add_worker`` uses them too).
    ``dashboard_port``: where the leading master serves the dashboard (another free port when it is taken; the
    token every request needs is made here, in ``state_dir/monitor-token``).
    """
    refuse_if_recorded(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)  # the secret lives here: nobody else may list or read it
    secret_file = state_dir / "secret"
    if not secret_file.exists():  # kept across down/up: ZooKeeper's data (and its ACLs) outlive a 'down'
        descriptor = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # 0600 from the start
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(secrets.token_bytes(32))
    load_or_make_token(state_dir / TOKEN_FILE)  # the dashboard's, before any master starts
    state = ClusterState(name=name, zk=zk or "", secret_file=str(secret_file.resolve()))
    state.logs = None if logs is None else {"level": logs.level, "format": logs.format}
    state.tls = tls
    if tls:  # the CA here; each worker's certificate is issued from it as the worker starts
        certificates.make_ca(state_dir / certificates.TLS_FOLDER, name)
    if zk is not None and zookeepers != 1:
        raise ClusterError("--zookeepers starts ZooKeeper: it does not go with --zk (a ZooKeeper of yours)")
    try:
        if zk is None and zookeepers == 1:
            server = ZooKeeperServer(data_dir=state_dir / "zookeeper")
            pid = server.launch()
            state.zk = server.address
            state.processes.append({"role": "zookeeper", "id": "zookeeper", "pid": pid})
            state.save(state_dir)  # before waiting: 'cluster down' can stop it even if this process dies now
            server.wait_until_ready()
        elif zk is None:
            start_ensemble(state, state_dir, zookeepers)
        state.save(state_dir)
        for index in range(masters):
            args = [
                "--zk",
                state.zk,
                "--name",
                name,
                "--id",
                f"master-{index}",
                "--state-dir",
                str(state_dir.resolve()),
                "--dashboard-port",
                str(dashboard_port),
            ]
            process = start_process("master", args, state.secret_file, state_dir / f"master-{index}.log", logs)
            state.processes.append({"role": "master", "id": f"master-{index}", "pid": process.pid})
        for index in range(workers):
            args = ["--zk", state.zk, "--name", name, "--id", f"worker-{index}", "--capacity", str(capacity)]
            args += ["--heartbeat", str(heartbeat), "--state-dir", str(state_dir.resolve())]
            args += [] if tls else ["--no-tls"]
            host = loopback_host(index) if loopback_hosts else None
            if host is not None:
                args += ["--host", host]
            for label in (labels or {}).get(f"worker-{index}", []):
                args += ["--label", label]
            process = start_process("worker", args, state.secret_file, state_dir / f"worker-{index}.log", logs)
            state.processes.append(worker_record(f"worker-{index}", process.pid, host))
        state.save(state_dir)
    except BaseException:
        down(state_dir)
        raise
    return state


def start_ensemble(state: ClusterState, state_dir: Path, size: int) -> ZooKeeperEnsemble:
    """Start a ZooKeeper ensemble of ``size`` members for ``state``; each member's record keeps its command line
    and working directory (what :func:`restart` starts it again from)."""
    ensemble = ZooKeeperEnsemble(state_dir, size)
    state.zk = ",".join(member.address for member in ensemble.prepare())
    for member in ensemble.members:
        pid = member.launch()
        record = {"role": "zookeeper", "id": member.name, "pid": pid, "address": member.address}
        state.processes.append({**record, "command": member.command(), "cwd": str(member.folder.resolve())})
        state.save(state_dir)  # each as it starts: 'cluster down' can stop it even if this process dies now
    ensemble.wait_until_serving()
    return ensemble


def restart(state_dir: Path, process_id: str) -> subprocess.Popen[bytes]:
    """Start a recorded process that has a command line of its own (a ZooKeeper member) again, from that
    command line and working directory alone, in a session of its own (it outlives the caller); records its
    new PID and returns the process."""
    state = ClusterState.load(state_dir)
    record = next((process for process in state.processes if process["id"] == process_id), None)
    if record is None or "command" not in record:
        startable = [str(process["id"]) for process in state.processes if "command" in process]
        raise ClusterError(f"no process '{process_id}' to start again (those with a command: {startable})")
    if alive(int(record["pid"])):
        raise ClusterError(f"{process_id} runs already (pid {record['pid']})")
    with open(Path(record["cwd"]) / "zookeeper.log", "ab") as log:
        process = subprocess.Popen(
            record["command"], cwd=record["cwd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    record["pid"] = process.pid
    state.save(state_dir)
    return process


def add_worker(
    state_dir: Path, capacity: int = 8, labels: list[str] | None = None, logs: LogSettings | None = None
) -> str:
    """Start one more worker for the cluster recorded in ``state_dir`` and record it; returns its id. It
    registers itself: the leader places new work on it (new jobs, next attempts, stalled jobs) at once.
    ``logs``: its log level and format (default: those ``up`` was given)."""
    state = ClusterState.load(state_dir)
    logs = logs or LogSettings.from_data(state.logs)
    taken = [int(p["id"].removeprefix("worker-")) for p in state.processes if str(p["id"]).startswith("worker-")]
    index = max(taken, default=-1) + 1
    worker_id = f"worker-{index}"
    args = ["--zk", state.zk, "--name", state.name, "--id", worker_id, "--capacity", str(capacity)]
    args += ["--state-dir", str(state_dir.resolve()), *([] if state.tls else ["--no-tls"])]
    host = loopback_host(index) if any("host" in p for p in state.processes) else None  # as its peers
    if host is not None:
        args += ["--host", host]
    for label in labels or []:
        args += ["--label", label]
    process = start_process("worker", args, state.secret_file, state_dir / f"{worker_id}.log", logs)
    state.processes.append(worker_record(worker_id, process.pid, host))
    state.save(state_dir)
    return worker_id


def refuse_if_recorded(state_dir: Path) -> None:
    """Raise :class:`ClusterError` when ``state_dir`` records a cluster (running or not: 'down' clears it)."""
    if (state_dir / STATE_FILE).exists():
        raise ClusterError(
            f"a cluster is already recorded in {state_dir}; it was left untouched "
            "('streamlet cluster status' shows it, 'streamlet cluster down' stops it)"
        )


def read_secret_file(path: Path) -> bytes:
    """The secret in ``path``: the raw bytes ``cluster up`` writes, or hex text. The file must be readable by
    its owner only (mode 0600), or a :class:`~streamlet.errors.ClusterError` says so."""
    try:
        mode = path.stat().st_mode & 0o777
        data = path.read_bytes()
    except OSError as exc:
        raise ClusterError(f"cannot read the secret file {path}: {exc.strerror}") from exc
    if mode & 0o077:
        raise ClusterError(f"the secret file {path} is open to others (mode {mode:o}): chmod 600 {path}")
    text = data.strip()
    if len(text) >= 32 and all(chr(byte) in "0123456789abcdefABCDEF" for byte in text):
        return bytes.fromhex(text.decode())
    if not data:
        raise ClusterError(f"the secret file {path} is empty")
    return data


def secret_from_hex(value: str) -> bytes:
    """``STREAMLET_SECRET``'s value: the secret as hex digits, or a :class:`~streamlet.errors.ClusterError`
    that says what is wrong with it (never the value itself: it is meant to be a secret)."""
    try:
        secret = bytes.fromhex(value)
    except ValueError:
        raise ClusterError(
            f"{SECRET_ENV} must be the cluster secret as hex digits (as 'cluster up' writes it, e.g. "
            f"'python -c \"import secrets; print(secrets.token_hex(32))\"'), not {len(value)} characters of "
            "something else"
        ) from None
    return secret


def process_secret(secret_file: Path | None) -> bytes:
    """The secret a master or worker runs with: from ``secret_file``, else ``STREAMLET_SECRET`` (hex).

    ``STREAMLET_SECRET`` is removed from this process's environment either
    way, so nothing it starts (job code, a Spark JVM, a child process) gets
    it; ``/proc/<pid>/environ`` still shows what the process started with,
    which is why ``cluster up`` passes ``--secret-file`` instead.
    """
    value = os.environ.pop(SECRET_ENV, None)
    if secret_file is not None:
        return read_secret_file(secret_file)
    if value:
        return secret_from_hex(value)
    raise ClusterError(
        f"give the cluster secret: --secret-file FILE (mode 0600) as 'streamlet cluster up' does, or {SECRET_ENV}"
    )


def find_secret(state_dir: Path) -> bytes | None:
    """The cluster secret: ``STREAMLET_SECRET`` (hex), else the one ``cluster up`` wrote in ``state_dir``."""
    value = os.environ.get(SECRET_ENV)
    if value:
        return secret_from_hex(value)
    if (state_dir / STATE_FILE).exists():
        return ClusterState.load(state_dir).secret()
    return None


DRAIN_SECONDS = 30.0  # how long 'down' lets the workers drain before SIGKILL
QUIT_SECONDS = 5.0  # how long 'down' gives the masters, then ZooKeeper, to exit before SIGKILL
DOWN_SECONDS = DRAIN_SECONDS + 2 * QUIT_SECONDS  # the most 'down' takes, whatever the processes do
TURNS = (
    ("worker", DRAIN_SECONDS, 2 * QUIT_SECONDS),
    ("master", QUIT_SECONDS, QUIT_SECONDS),
    ("zookeeper", QUIT_SECONDS, 0.0),
)


def down(state_dir: Path, timeout: float = DOWN_SECONDS) -> list[dict[str, Any]]:
    """Stop every process ``up`` started, by PID, within ``timeout`` seconds whatever they do, and forget the
    cluster: all workers at once (each drains: a checkpoint its job's other workers take part in, for at most
    :data:`DRAIN_SECONDS`), then the masters, then ZooKeeper (:data:`QUIT_SECONDS` each); whatever has not
    exited by its turn's end is SIGKILLed. A worker that cannot drain (ZooKeeper gone, a job restarting in a
    loop) is killed at the end of its turn, never waited for longer, and nothing of the cluster is left
    running. Each stopped process's record says how: ``"stopped"`` (it exited) or ``"killed"``."""
    state = ClusterState.load(state_dir)
    deadline = time.monotonic() + timeout
    stopped: list[dict[str, Any]] = []
    try:
        for role, share, after in TURNS:
            group = [process for process in state.processes if process["role"] == role]
            turn = max(0.5, min(share, deadline - time.monotonic() - after))  # the turns after keep their time
            stopped.extend(stop_together(group, turn))
    finally:
        for process in state.processes:  # interrupted, or anything a turn left: nothing of the cluster stays
            if alive(int(process["pid"])):
                wait_or_kill(int(process["pid"]), 0.0)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped


def stop_together(processes: list[dict[str, Any]], seconds: float) -> list[dict[str, Any]]:
    """SIGTERM every one of ``processes`` at once, give them ``seconds`` together to exit, SIGKILL the rest;
    returns the records of those that were running, each with ``how`` (``"stopped"`` or ``"killed"``)."""
    running = [process for process in processes if signal_pid(int(process["pid"]), signal.SIGTERM)]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(int(process["pid"])) for process in running):
        time.sleep(0.05)
    result = []
    for process in running:
        pid = int(process["pid"])
        if alive(pid):
            wait_or_kill(pid, 0.0)
            result.append({**process, "how": "killed"})
        else:
            result.append({**process, "how": "stopped"})
    return result


def signal_pid(pid: int, signum: int) -> bool:
    """Send ``signum`` to ``pid``; False if it is not running."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def stop_pid(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM ``pid``, SIGKILL it after ``timeout``; True if it was running."""
    if not signal_pid(pid, signal.SIGTERM):
        return False
    wait_or_kill(pid, timeout)
    return True


def wait_or_kill(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` for ``pid`` to exit (after a SIGTERM), then SIGKILL it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while alive(pid):
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie child counts as gone, and is reaped)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass  # not our child: ask the kernel
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped by a parent that is not us (an orphan whose init
    does not reap: it answers signals, but nothing of it runs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False  # no /proc here (or it went meanwhile: the next look says so)
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"  # the state follows the command name in parentheses
