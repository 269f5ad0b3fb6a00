"""``cluster down`` returns within its bound and leaves nothing running, even with processes that ignore
SIGTERM (a worker that cannot drain: ZooKeeper gone, a job restarting in a loop)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamlet.backends.cluster.local import local_cluster
from streamlet.backends.cluster.local.local_cluster import ClusterState, alive, wait_or_kill

STUBBORN = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
)
POLITE = "import sys, time; print('up', flush=True); time.sleep(600)"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the test starts; each stopped by its PID at the end, whatever the test did."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if alive(process.pid):
            wait_or_kill(process.pid, 0.0)
        process.wait()  # reaped already (down waits for its PIDs): this only tells the Popen object
        assert process.stdout is not None
        process.stdout.close()


def _start(started: list[subprocess.Popen[bytes]], code: str) -> int:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    started.append(process)
    assert process.stdout is not None
    assert process.stdout.readline() == b"up\n"  # its SIGTERM handler is in place
    return process.pid


def test_down_kills_what_does_not_exit_within_its_bound(started: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    worker = _start(started, STUBBORN)
    master = _start(started, STUBBORN)
    zookeeper = _start(started, POLITE)
    state = ClusterState("c", "127.0.0.1:1", str(tmp_path / "secret"), processes=[
        {"role": "worker", "id": "worker-0", "pid": worker},
        {"role": "master", "id": "master-0", "pid": master},
        {"role": "zookeeper", "id": "zookeeper", "pid": zookeeper},
    ])  # fmt: skip
    state.save(tmp_path)
    began = time.monotonic()
    stopped = local_cluster.down(tmp_path, timeout=3.0)
    took = time.monotonic() - began
    assert [(p["id"], p["how"]) for p in stopped] == [
        ("worker-0", "killed"),
        ("master-0", "killed"),
        ("zookeeper", "stopped"),
    ]
    assert not any(alive(pid) for pid in (worker, master, zookeeper))
    assert took < 3.0 + 2.0  # the bound, and the kills' own time
    assert not (tmp_path / "cluster.json").exists()


def test_down_skips_what_is_gone_already(started: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    gone = _start(started, POLITE)
    wait_or_kill(gone, 0.0)
    worker = _start(started, POLITE)
    state = ClusterState("c", "127.0.0.1:1", str(tmp_path / "secret"), processes=[
        {"role": "worker", "id": "worker-0", "pid": gone},
        {"role": "worker", "id": "worker-1", "pid": worker},
    ])  # fmt: skip
    state.save(tmp_path)
    assert [(p["id"], p["how"]) for p in local_cluster.down(tmp_path, timeout=3.0)] == [("worker-1", "stopped")]
    assert not alive(worker)
