"""Driving a real cluster from tests: the CLI in a subprocess, and waiting on a job's state through a watch."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from streamlet.backends.cluster.local.local_cluster import ClusterState, alive, down, stop_pid
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.zk import ZkStore
from tests.support import reaper


def streamlet(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the ``streamlet`` command in ``cwd`` (where ``cluster up`` left its state dir)."""
    return subprocess.run(
        [sys.executable, "-m", "streamlet.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def recorded(directory: Path) -> dict[str, Any]:
    """What ``cluster up`` recorded in ``directory/.streamlet``."""
    state: dict[str, Any] = json.loads((directory / ".streamlet" / "cluster.json").read_text())
    return state


def secret_of(directory: Path) -> bytes:
    """The secret of the cluster ``cluster up`` recorded in ``directory/.streamlet`` (its ``secret_file``)."""
    return ClusterState.load(directory / ".streamlet").secret()


def cluster_store(directory: Path) -> ZkStore:
    """A store on the cluster recorded in ``directory/.streamlet``, with its secret: job data is readable with it
    only (a test reads as the cluster does; test_cluster_security reads without it)."""
    state = ClusterState.load(directory / ".streamlet")
    return ZkStore(state.zk, state.name, secret=state.secret())


def wait_for_node(directory: Path, path: str, wanted: Callable[[Any], bool], seconds: float = 60) -> Any:
    """Block until the node at ``path`` holds data for which ``wanted`` is true (a ZooKeeper watch)."""

    async def watch() -> Any:
        async with cluster_store(directory) as store:
            version: int | None = -2
            with anyio.fail_after(seconds):
                while True:
                    data, version = await store.wait_changed(path, version)
                    if data is not None and wanted(data):
                        return data

    return anyio.run(watch)


def wait_for_state(directory: Path, job: str, states: set[str], seconds: float = 60) -> dict[str, Any]:
    """Block until the job's state node holds one of ``states``."""
    found: dict[str, Any] = wait_for_node(directory, paths.state(job), lambda data: data["state"] in states, seconds)
    return found


def wait_for_exit(pid: int, seconds: float = 30) -> bool:
    """Block until process ``pid`` (not necessarily our child) exits, on a pidfd; False on timeout."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([descriptor], [], [], seconds)
        return bool(readable)
    finally:
        os.close(descriptor)


@contextmanager
def running_cluster(directory: Path, *up_args: str, options: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """``streamlet OPTIONS cluster up UP_ARGS --loopback-hosts`` in ``directory``: each worker on a loopback
    address of its own with its own folder, as separate machines (nothing may assume one address or one
    disk); yields what it recorded, with ``pids`` by process id. Afterwards every PID it started is stopped
    by PID, in the order ``cluster down`` uses (and by the reaper, should the run end without teardown)."""
    apart = () if "--loopback-hosts" in up_args else ("--loopback-hosts",)
    reaper.record_cluster(directory / ".streamlet")  # killed even should this run end without teardown
    state_file = directory / ".streamlet" / "cluster.json"
    state: dict[str, Any] = {"processes": []}
    try:  # a 'cluster up' that fails or times out may have started processes already: stopped below too
        up = streamlet(*options, "cluster", "up", *up_args, *apart, cwd=directory)
        state = json.loads(state_file.read_text()) if state_file.exists() else state
        assert up.returncode == 0, up.stderr
        yield {**state, "dir": directory, "pids": {p["id"]: int(p["pid"]) for p in state["processes"]}}
    finally:
        latest = json.loads(state_file.read_text()) if state_file.exists() else state  # with workers added since
        pids = list(dict.fromkeys(int(process["pid"]) for process in state["processes"] + latest["processes"]))
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        if state_file.exists():
            down(directory / ".streamlet")  # workers first, then masters, then ZooKeeper: each stops cleanly
        for pid in pids:
            stop_pid(pid)  # whatever 'down' did not know of, or could not stop


def stop_submitter(process: subprocess.Popen[str]) -> None:
    """A submitting client the test started: killed by its handle if it still runs, reaped, and its pipes
    closed (an open pipe left to the garbage collector warns in whichever test runs then)."""
    if process.poll() is None:
        process.kill()
    if process.stdout is not None and not process.stdout.closed:
        process.communicate()
