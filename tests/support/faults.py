"""Tools of the fault tests: a local cluster of real processes, a job held at a gate, and one ZooKeeper
session in a background thread that follows nodes by watches.

Nothing here sleeps to wait for something: waits are ZooKeeper watches or a process's exit, each with a
timeout that is only a safety net (the one pause is between retries while a killed ZooKeeper is away).
Processes are stopped by the PIDs recorded when they were started.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamlet.backends.cluster.local import local_cluster
from streamlet.backends.cluster.local.local_cluster import SECRET_ENV, alive, stop_pid
from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer
from streamlet.testing.zk_watch import ZkWatch
from tests.support import reaper
from tests.support.cluster import secret_of, wait_for_exit

# The keyed count every job text here ends with: totals per key, emitted once the input has ended.
COUNT_TASK = """
class Count(sl.Task):
    def execute(self, inputs, outputs):
        for r in inputs.get():
            self.state.put(r.key, self.state.get(r.key, 0) + r.value)

    def finish(self, outputs):
        outputs.emit_all(self.state.items())
"""

# A keyed count whose middle task holds, after 30 000 of its 40 000 words, until the test releases it: a test
# acts on the cluster while the job is provably mid-run, then lets it end. The hold waits on an event, not a
# poll: the task opens the FIFO WAKE for reading *before* it looks for the file RELEASE, then waits until
# WAKE is readable; release() creates RELEASE, then writes to WAKE when a reader is there. So a release
# either comes before the look (RELEASE is seen) or after the reader opened (WAKE wakes it).
GATE_TASK = """
import asyncio
import os
import pathlib

import streamlet as sl

WORDS = [f"w{(i * 7919) % 97}" for i in range(40_000)]
HOLD_AFTER = 30_000


async def released():
    wake = os.open(WAKE, os.O_RDONLY | os.O_NONBLOCK)  # first: a release from now on reaches this reader
    try:
        if RELEASE.exists():
            return
        loop, woken = asyncio.get_running_loop(), asyncio.Event()
        loop.add_reader(wake, woken.set)
        try:
            await woken.wait()
        finally:
            loop.remove_reader(wake)
    finally:
        os.close(wake)


class Gate(sl.Task):
    passed = 0  # records this instance passed on (a new attempt starts again at 0)

    async def execute(self, inputs, outputs):
        if self.passed >= HOLD_AFTER:
            await released()
        await asyncio.sleep(0.05)  # pacing, not waiting: a batch every 50 ms, so checkpoints complete before the hold
        batch = inputs.get()
        self.passed += len(batch)
        outputs.emit_batch([sl.Record(r.value, 1, r.ts) for r in batch])

"""

GATED_COUNT = (
    GATE_TASK
    + COUNT_TASK
    + """

def build_topology():
    topology = sl.Topology("gated-count")
    source = topology.add_source("words", WORDS)
    gate = topology.add_task("gate", Gate).set_input(source)
    count = topology.add_task("count", Count, parallelism=2).set_input(gate, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(count)
    return topology
"""
)

# The same gate feeding a CollectSink of two instances: the words w0 to w23 (a quarter of them, so one worker's
# report fits in a ZooKeeper node) reach the sink as (word, 1) while the job runs, so what a sink instance
# collected before a failover is most of what the job gives.
GATED_STREAM = (
    GATE_TASK
    + """

def build_topology():
    topology = sl.Topology("gated-stream")
    gate = topology.add_task("gate", Gate).set_input(topology.add_source("words", WORDS))
    some = topology.filter("some", lambda r: int(r.key[1:]) < 24).set_input(gate)
    topology.add_sink("seen", sl.CollectSink(), parallelism=2).set_input(some, partitioning=sl.SAME_KEY)
    return topology
"""
)

WORDS = [f"w{(i * 7919) % 97}" for i in range(40_000)]


STREAMED = [word for word in WORDS if int(word[1:]) < 24]  # what GATED_STREAM's sink collects


def expected_totals() -> dict[str, int]:
    """What the gated count must report: a plain count of its words."""
    return dict(Counter(WORDS))


@dataclass
class GatedJob:
    """A gated count written to ``directory``: ``file`` to submit, ``release()`` to let it end."""

    directory: Path

    @property
    def file(self) -> Path:
        return self.directory / "gated_count.py"

    @property
    def gate(self) -> Path:
        return self.directory / "release"

    @property
    def wake(self) -> Path:
        return self.directory / "wake"

    def write(self, source: str = GATED_COUNT) -> GatedJob:
        """Write the job (``source``: the gated count, or ``GATED_STREAM``) with its gate's paths."""
        os.mkfifo(self.wake)
        constants = f"RELEASE = __import__('pathlib').Path({str(self.gate)!r})\nWAKE = {str(self.wake)!r}\n"
        self.file.write_text(constants + source)
        return self

    def release(self) -> None:
        self.gate.touch()
        try:  # wake a holding task; with no reader there, the task will see the file instead
            wake = os.open(self.wake, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            return
        with contextlib.closing(os.fdopen(wake, "wb")) as writer:
            writer.write(b"x")


def totals(rows: list[list[Any]]) -> dict[str, int]:
    """``[[key, value, ts], ...]`` as reported by a cluster's CollectSink -> {key: value}, refusing duplicates."""
    found: dict[str, int] = {}
    for key, value, _ts in rows:
        assert key not in found, f"key {key!r} reported twice"
        found[key] = value
    return found


# -- processes --------------------------------------------------------------------------------------------


def streamlet_process(
    *args: str, cwd: Path, log: Path | None = None, secret: bytes | None = None
) -> subprocess.Popen[str]:
    """``streamlet ARGS`` in the background: output to pipes, or to ``log`` in a session of its own (a server)."""
    environment = dict(os.environ)
    if secret is not None:
        environment[SECRET_ENV] = secret.hex()
    command = [sys.executable, "-m", "streamlet.cli", *args]
    if log is None:
        return subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        )
    with open(log, "ab") as output:
        return subprocess.Popen(
            command, cwd=cwd, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            env=environment, start_new_session=True,
        )  # fmt: skip


def read_rss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes (``VmRSS`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@dataclass
class Submission:
    """A ``streamlet submit`` running in the background."""

    process: subprocess.Popen[str]
    results: Path
    out: str = ""
    err: str = ""

    def finish(self, seconds: float = 90) -> Submission:
        """Wait for it to exit (the job ended, or submit gave up)."""
        self.out, self.err = self.process.communicate(timeout=seconds)
        return self

    @property
    def code(self) -> int | None:
        return self.process.returncode

    def collected(self) -> dict[str, list[list[Any]]]:
        found: dict[str, list[list[Any]]] = json.loads(self.results.read_text())
        return found


@dataclass
class LocalCluster:
    """A cluster that ``streamlet cluster up`` started in ``directory``, and every process a test added."""

    directory: Path
    name: str
    zk: str
    pids: dict[str, int]  # process id ("worker-1", "master-0", "zookeeper") -> PID, from .streamlet/cluster.json
    started: list[int] = field(default_factory=list)  # PIDs a test started besides: submits, workers, a ZooKeeper
    children: list[subprocess.Popen[Any]] = field(default_factory=list)
    zookeepers: list[int] = field(default_factory=list)  # ZooKeeper servers a test started again

    @classmethod
    def up(
        cls,
        directory: Path,
        name: str,
        *,
        workers: int = 2,
        masters: int = 1,
        capacity: int = 3,
        zk: str | None,
        zookeepers: int = 1,
    ) -> LocalCluster:
        """``streamlet cluster up`` (on the ZooKeeper at ``zk``, or its own: ``zookeepers`` servers)."""
        args = ["cluster", "up", "--name", name, "--workers", str(workers), "--masters", str(masters)]
        args += ["--capacity", str(capacity), *(["--zk", zk] if zk else ["--zookeepers", str(zookeepers)])]
        reaper.record_cluster(directory / ".streamlet")  # killed even should this run end without teardown
        up: subprocess.CompletedProcess[str] | None = None
        try:
            up = subprocess.run(
                [sys.executable, "-m", "streamlet.cli", *args], cwd=directory, capture_output=True, text=True,
                timeout=90,
            )  # fmt: skip
        finally:  # a 'cluster up' that fails or times out may have started processes already: stopped here
            state_file = directory / ".streamlet" / "cluster.json"
            state = json.loads(state_file.read_text()) if state_file.exists() else {"zk": zk, "processes": []}
            cluster = cls(directory, name, state["zk"], {p["id"]: int(p["pid"]) for p in state["processes"]})
            if up is None or up.returncode != 0:
                cluster.down()
        assert up is not None
        if up.returncode != 0:
            raise AssertionError(f"cluster up failed: {up.stderr}")
        return cluster

    @property
    def state_dir(self) -> Path:
        return self.directory / ".streamlet"

    def secret(self) -> bytes:
        return secret_of(self.directory)

    def every_pid(self) -> list[int]:
        return [*self.pids.values(), *self.started]

    def adopt(self, process: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        """Stop ``process`` (by its PID) with the cluster."""
        self.started.append(process.pid)
        self.children.append(process)
        return process

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A ``streamlet`` command in the cluster's directory, waited for."""
        return subprocess.run(
            [sys.executable, "-m", "streamlet.cli", *args], cwd=self.directory, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    def submit(self, target: Path, job: str, *options: str) -> Submission:
        """``streamlet submit TARGET --job JOB --results ...`` in the background."""
        results = self.directory / f"{job}.results.json"
        args = ["submit", str(target), "--job", job, "--results", str(results), *options]
        return Submission(self.adopt(streamlet_process(*args, cwd=self.directory)), results)

    def start_worker(self, worker_id: str, capacity: int = 8) -> int:
        """One more worker process (``streamlet worker``), with the cluster's secret in its environment and its
        files under ``.streamlet/<worker_id>/`` as ``cluster up`` places them (a worker-N started again finds
        the files worker-N kept: its machine came back with its disk)."""
        args = ["worker", "--zk", self.zk, "--name", self.name, "--id", worker_id, "--capacity", str(capacity)]
        args += ["--state-dir", str(self.state_dir)]
        log = self.state_dir / f"{worker_id}.log"
        process = self.adopt(streamlet_process(*args, cwd=self.directory, log=log, secret=self.secret()))
        return process.pid

    def down(self) -> list[int]:
        """Stop every PID, workers and the rest first, ZooKeeper last; the PIDs still alive after (none, we hope).

        Each group is signalled at once (SIGCONT, for a stopped process, and SIGTERM) and waited for on pidfds;
        ``stop_pid`` then makes sure of each PID (a second SIGTERM stops a draining worker at once).
        """
        zookeeper = {pid for name, pid in self.pids.items() if name.startswith("zookeeper")} | set(self.zookeepers)
        pids = self.every_pid()
        for group in ([pid for pid in pids if pid not in zookeeper], [pid for pid in pids if pid in zookeeper]):
            for pid in group:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGTERM)
            for pid in group:
                wait_for_exit(pid, seconds=15)
            for pid in group:
                stop_pid(pid)
        for child in self.children:
            child.wait(timeout=10)  # reaped by stop_pid already: this only settles the Popen
            for stream in (child.stdout, child.stderr):
                if stream is not None:
                    stream.close()
        return [pid for pid in pids if alive(pid)]

    def restart_member(self, member: str) -> int:
        """Start ZooKeeper member ``member`` (``zookeeper-2``) again from the command line and working directory
        ``cluster up`` recorded for it; its PID (stopped with the cluster)."""
        process = self.adopt(local_cluster.restart(self.state_dir, member))
        self.zookeepers.append(process.pid)
        return process.pid

    def restart_zookeeper(self) -> ZooKeeperServer:
        """Start the cluster's ZooKeeper again on its port and data directory (after it was killed)."""
        server = ZooKeeperServer(
            data_dir=self.state_dir / "zookeeper", port=int(self.zk.rsplit(":", 1)[1]), die_with_parent=True
        )
        server.launch()
        assert server.process is not None
        self.zookeepers.append(self.adopt(server.process).pid)
        server.wait_until_ready()
        return server


# -- ZooKeeper, followed from a thread --------------------------------------------------------------------


@contextlib.contextmanager
def watching(cluster: LocalCluster) -> Iterator[ZkWatch]:
    """A :class:`ZkWatch` on ``cluster``."""
    with ZkWatch(cluster.zk, cluster.name, cluster.secret()) as watch:
        yield watch


# A keyed count over 40 000 words whose middle task paces itself: the job runs for about 4 s, long enough to act
# on the cluster while it runs (the tests wait for events, e.g. a completed checkpoint, never for time).
SLOW_COUNT = (
    """
import asyncio
import streamlet as sl

WORDS = [f"w{(i * 7919) % 97}" for i in range(40_000)]

class Slow(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.1)  # pacing: 40 batches, about 4 s, so checkpoints complete while it runs
        outputs.emit_batch([sl.Record(r.value, 1, r.ts) for r in inputs.get()])

"""
    + COUNT_TASK
    + """
def build_topology():
    topology = sl.Topology("slow-count")
    source = topology.add_source("words", WORDS)
    slow = topology.add_task("slow", Slow).set_input(source)
    count = topology.add_task("count", Count, parallelism=2).set_input(slow, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(count)
    return topology
"""
)


# Every third record is poison: a task with on_error="skip" sets 7 of 21 aside as dead letters.
POISON_EVERY_THIRD = """
import streamlet as sl

def parse(record):
    if record.value % 3 == 0:
        raise ValueError(f"poison {record.value}")
    return record.key, record.value

def build_topology():
    topology = sl.Topology("skips")
    source = topology.add_source("numbers", [sl.Record(f"k{n}", n, 0.0) for n in range(1, 22)])
    parsed = topology.map("parse", parse, on_error="skip").set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(parsed)
    return topology
"""
