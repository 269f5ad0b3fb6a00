"""Jobs on a real cluster (ZooKeeper, one master, two workers of capacity 3), through the CLI."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamlet as sl
from examples.wordcount import build_topology, word_counts
from streamlet.backends.cluster.tree import paths
from tests.support import event_time_job
from tests.support.cluster import cluster_store, running_cluster, stop_submitter, streamlet, wait_for_state

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

FAILING = """
import streamlet as sl

def explode(record):
    raise ValueError("no " + str(record.value))

def build_topology():
    topology = sl.Topology("failing")
    source = topology.add_source("in", [1, 2, 3])
    broken = topology.map("explode", explode).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(broken)
    return topology
"""

SLOW = """
import asyncio
import streamlet as sl

class Slow(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.5)
        outputs.emit_batch(inputs.get())

def build_topology():
    topology = sl.Topology("slow")
    source = topology.add_source("in", list(range(100_000)))
    slow = topology.add_task("slow", Slow).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(slow)
    return topology
"""


PINNED = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("pinned")
    source = topology.add_source("in", [1, 2, 3])
    pinned = topology.map("pinned", lambda r: (r.key, r.value * 10), workers=["worker-1"]).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(pinned)
    return topology
"""

FILES = """
import asyncio
import streamlet as sl

class Pace(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.1)
        outputs.emit_batch([sl.Record(r.value % 7, r.value * 2, 0.0) for r in inputs.get()])

def build_topology():
    topology = sl.Topology("files")
    source = topology.add_source("in", list(range(30_000)))
    paced = topology.add_task("pace", Pace, parallelism=2).set_input(source)
    sink = sl.FileSink(OUT)  # an absolute path: the workers load this file, not the test
    topology.add_sink("out", sink, parallelism=2).set_input(paced, partitioning=sl.SAME_KEY)
    return topology
"""

LABELLED = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("labelled")
    source = topology.add_source("in", [1, 2, 3])
    gpu = topology.map("gpu", lambda r: (r.key, r.value * 10), labels=["gpu"]).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(gpu)
    return topology
"""

# crashes on the first worker that runs it (the marker names that process), works anywhere else
CRASHY = """
import os
import pathlib
import streamlet as sl

class Crashy(sl.Task):
    def execute(self, inputs, outputs):
        if not MARK.exists():
            MARK.write_text(str(os.getpid()))
        if ALWAYS or MARK.read_text() == str(os.getpid()):
            raise RuntimeError("bad disk on this worker")
        outputs.emit_batch(inputs.get())

def build_topology():
    topology = sl.Topology("crashy")
    source = topology.add_source("in", list(range(100)))
    crashy = topology.add_task("crashy", Crashy, on_error="restart", max_failures=1).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(crashy)
    return topology
"""

# keyed event-time sums handed to Spark by whichever workers run the sink's two instances
TO_SPARK = """
import streamlet as sl

READINGS = [sl.Record(f"k{i % 5}", i % 7, i * 0.01) for i in range(20_000)]

def build_topology():
    topology = sl.Topology("to-spark")
    source = topology.add_source("in", READINGS)
    sums = topology.window_reduce("sums", "sum", window=sl.TimeWindow(10.0, time="event"), parallelism=2)
    sums.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("spark", sl.SparkSink(OUT), parallelism=2).set_input(sums)
    return topology
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cluster for the module; every PID it started is stopped at the end."""
    directory = Path(tmp_path_factory.mktemp("cluster"))
    up = ("--workers", "2", "--capacity", "3", "--name", "jobs", "--label", "worker-1=gpu")
    with running_cluster(directory, *up):
        yield directory


def test_wordcount_on_two_workers_gives_the_in_process_counts(cluster: Path) -> None:
    """examples/wordcount.py, unchanged, spread over both workers (the keyed count crosses TCP)."""
    results = cluster / "wordcount.json"
    target = str(ROOT / "examples" / "wordcount.py")
    run = streamlet("submit", target, "--job", "wc", "--results", str(results), cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "job 'wc' FINISHED on worker-0, worker-1: every worker finished (2)",
        "  totals: 93 records",
    ]
    counts = {key: value for key, value, _ts in json.loads(results.read_text())["totals"]}
    assert counts == word_counts(sl.run(build_topology()))


def test_parallelism_override_and_jobs_listing(cluster: Path) -> None:
    """--parallelism changes the plan; 'jobs' lists the finished job."""
    target = str(ROOT / "examples" / "wordcount.py")
    run = streamlet("submit", target, "--job", "wc1", "-p", "count=1", "-p", "split=1", cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "job 'wc1' FINISHED on worker-0, worker-1: every worker finished (2)"
    listing = {job["name"]: job for job in json.loads(streamlet("jobs", "--json", cwd=cluster).stdout)}
    assert listing["wc1"]["state"] == "FINISHED"
    assert listing["wc1"]["workers"] == ["worker-0", "worker-1"]
    assert listing["wc1"]["attempt"] == 1
    assert listing["wc1"]["reconfigurations"] == 0
    assert listing["wc1"]["started"] <= listing["wc1"]["ended"]


def test_a_failing_job_reports_the_task_error(cluster: Path, tmp_path: Path) -> None:
    """A task that fails makes submit exit 1 with the TaskError naming task, instance and key."""
    path = tmp_path / "failing.py"
    path.write_text(FAILING, encoding="utf-8")
    run = streamlet("submit", str(path), "--job", "broken", cwd=cluster)
    assert run.returncode == 1
    assert re.fullmatch(
        r"  error: TaskError: task 'explode' instance 0 failed on record with key None: ValueError: no 1 "
        r"\(on worker-[01]\)",
        run.stdout.splitlines()[1],
    )


def test_kill_stops_a_running_job_idempotently_and_rm_frees_its_name(cluster: Path, tmp_path: Path) -> None:
    """kill: KILLED, a second kill changes nothing; rm removes the ended job and the name can be used again."""
    path = tmp_path / "slow.py"
    path.write_text(SLOW, encoding="utf-8")
    submitted = streamlet("submit", str(path), "--job", "slow", "--no-wait", cwd=cluster)
    assert submitted.returncode == 0, submitted.stderr
    wait_for_state(cluster, "slow", {"RUNNING"})
    status = streamlet("cluster", "status", cwd=cluster).stdout
    held = re.findall(r"^      instances: (.*)$", status, re.M)
    assert sorted(", ".join(held).split(", ")) == ["slow/in.0", "slow/out.0", "slow/slow.0"]
    assert "slow (RUNNING, attempt 1)" in status
    killed = streamlet("kill", "slow", cwd=cluster)
    assert killed.stdout.strip() == "asked the cluster to stop job 'slow' (it was RUNNING)"
    assert wait_for_state(cluster, "slow", {"KILLED"})["reason"] == "killed by streamlet kill"
    again = streamlet("kill", "slow", cwd=cluster)
    assert (again.returncode, again.stdout.strip()) == (0, "job 'slow' has ended already (KILLED)")
    assert streamlet("rm", "slow", cwd=cluster).stdout.strip() == "removed job 'slow'"
    target = str(ROOT / "examples" / "wordcount.py")
    reused = streamlet("submit", target, "--job", "slow", cwd=cluster)
    assert reused.returncode == 0, reused.stderr


def test_submitting_a_job_name_twice_is_refused(cluster: Path) -> None:
    """Job names are unique per cluster."""
    target = str(ROOT / "examples" / "wordcount.py")
    first = streamlet("submit", target, "--job", "twice", cwd=cluster)
    assert first.returncode == 0, first.stderr
    again = streamlet("submit", target, "--job", "twice", cwd=cluster)
    assert again.returncode == 1
    assert again.stderr.strip() == (
        "error: JobError: a job called 'twice' already exists on cluster 'jobs' "
        "(when it has ended, 'streamlet rm twice' removes it)"
    )


def test_a_task_restricted_to_a_worker_runs_there(cluster: Path, tmp_path: Path) -> None:
    """workers=["worker-1"] moves that task off worker-0, where co-location would otherwise put everything."""
    path = tmp_path / "pinned.py"
    path.write_text(PINNED, encoding="utf-8")
    results = tmp_path / "pinned.json"
    run = streamlet("submit", str(path), "--job", "pinned", "--results", str(results), cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "job 'pinned' FINISHED on worker-0, worker-1: every worker finished (2)"
    assert sorted(value for _key, value, _ts in json.loads(results.read_text())["out"]) == [10, 20, 30]


def test_checkpoints_across_workers_make_a_file_sink_exactly_once(cluster: Path, tmp_path: Path) -> None:
    """Checkpoints taken across both workers commit FileSink output by epoch; every record is visible once.
    No folder is shared (each worker keeps its files under .streamlet/<worker>/, and sweeps those of an ended
    job): the last checkpoint's record names both workers, and holds each stateful instance on its own worker
    and on the other, which acknowledged storing its piece."""
    path = tmp_path / "files.py"
    out = tmp_path / "out"
    path.write_text(f"OUT = {str(out)!r}\n{FILES}", encoding="utf-8")
    run = streamlet("submit", str(path), "--job", "files", "--checkpoint-interval", "0.1", cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["job 'files' FINISHED on worker-0, worker-1: every worker finished (2)"]
    records = sl.read_file_sink(out)
    assert sorted((r.key, r.value) for r in records) == sorted((v % 7, v * 2) for v in range(30_000))
    epochs = {int(name.name.split("-")[1]) for name in out.glob("part-*.jsonl")}
    assert len(epochs) >= 2  # periodic checkpoints committed output before the final one
    assert not list((out / ".staging").rglob("*.pending"))
    assert not (cluster / ".streamlet" / "checkpoints").exists()  # no shared folder: each worker keeps its own
    completed = node_data(cluster, "/jobs/files/checkpoints/completed")
    assert (completed["attempt"], completed["workers"], completed["finished"]) == (1, ["worker-0", "worker-1"], True)
    instances = job_nodes(cluster, "files")["assignment"]["instances"]
    other = {"worker-0": "worker-1", "worker-1": "worker-0"}
    # the source and the tasks keep state (the file sink's is its staged output): each is held by its own
    # worker and, by default, by one backup, the other worker
    stateful = ["in.0", "pace.0", "pace.1"]
    assert set(instances) == {*stateful, "out.0", "out.1"}
    assert completed["holders"] == {name: [instances[name], other[instances[name]]] for name in stateful}
    # both workers acknowledged their parts of the last checkpoint, and each backup the piece it stored
    owners = {instances[name] for name in stateful}
    acks = children(cluster, f"/jobs/files/checkpoints/attempt-1/acks/{completed['epoch']}")
    assert set(acks) == {"worker-0", "worker-1", *(f"{owner}~{other[owner]}" for owner in owners)}


def node_data(cluster: Path, path: str) -> Any:
    """The data of the ZooKeeper node at ``path`` (which must exist)."""

    async def read() -> Any:
        async with cluster_store(cluster) as store:
            found = await store.get(path)
            assert found is not None, f"no node {path}"
            return found[0]

    return anyio.run(read)


def children(cluster: Path, path: str) -> list[str]:
    """The names of the ZooKeeper node's children at ``path``."""

    async def read() -> list[str]:
        async with cluster_store(cluster) as store:
            return await store.children(path)

    return anyio.run(read)


def job_nodes(cluster: Path, job: str) -> dict[str, Any]:
    """The job's assignment and recorded failures, read from ZooKeeper."""

    async def read() -> dict[str, Any]:
        async with cluster_store(cluster) as zk:
            assignment = await zk.get(f"/jobs/{job}/assignment")
            failures = {}
            for instance in await zk.children(f"/jobs/{job}/failures"):
                entries = []
                for attempt in await zk.children(f"/jobs/{job}/failures/{instance}"):
                    found = await zk.get(f"/jobs/{job}/failures/{instance}/{attempt}")
                    assert found is not None
                    entries.append(found[0])
                failures[instance] = entries
            assert assignment is not None
            return {"assignment": assignment[0], "failures": failures}

    return anyio.run(read)


def test_a_task_asking_for_a_label_runs_on_the_labelled_worker(cluster: Path, tmp_path: Path) -> None:
    """labels=["gpu"] places the task on worker-1, the only worker started with --label worker-1=gpu."""
    path = tmp_path / "labelled.py"
    path.write_text(LABELLED, encoding="utf-8")
    results = tmp_path / "labelled.json"
    run = streamlet("submit", str(path), "--job", "labelled", "--results", str(results), cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert sorted(value for _key, value, _ts in json.loads(results.read_text())["out"]) == [10, 20, 30]
    assert job_nodes(cluster, "labelled")["assignment"]["instances"]["gpu.0"] == "worker-1"
    assert "labels: gpu" in streamlet("cluster", "status", cwd=cluster).stdout


def test_an_instance_that_crashes_on_one_worker_is_restarted_on_the_other(cluster: Path, tmp_path: Path) -> None:
    """Instance failover: after its in-place restart fails too, the instance moves to the other worker."""
    path = tmp_path / "crashy.py"
    path.write_text(f"MARK = __import__('pathlib').Path({str(tmp_path / 'mark')!r})\nALWAYS = False\n{CRASHY}")
    results = tmp_path / "crashy.json"
    run = streamlet("submit", str(path), "--job", "crashy", "--results", str(results), cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert sorted(value for _key, value, _ts in json.loads(results.read_text())["out"]) == list(range(100))
    nodes = job_nodes(cluster, "crashy")
    [failure] = nodes["failures"]["crashy.0"]
    assert failure["attempt"] == 1
    assert "bad disk on this worker" in failure["error"]
    assert nodes["assignment"]["attempt"] == 2
    assert nodes["assignment"]["instances"]["crashy.0"] != failure["worker"]


def test_an_instance_that_keeps_crashing_fails_the_job_after_max_failures(cluster: Path, tmp_path: Path) -> None:
    """Past max_failures crashes the job fails with a reason naming the instance, and is not rescheduled."""
    path = tmp_path / "doomed.py"
    path.write_text(f"MARK = __import__('pathlib').Path({str(tmp_path / 'mark')!r})\nALWAYS = True\n{CRASHY}")
    run = streamlet("submit", str(path), "--job", "doomed", cwd=cluster)
    assert run.returncode == 1
    nodes = job_nodes(cluster, "doomed")
    failures = nodes["failures"]["crashy.0"]
    assert [entry["attempt"] for entry in failures] == [1, 2]
    assert {entry["worker"] for entry in failures} == {"worker-0", "worker-1"}  # the second try went elsewhere
    assert run.stdout.splitlines()[1] == (
        "  error: instance 'crashy.0' failed 2 times (max_failures=1) on worker-0, worker-1; last error: "
        "TaskError: task 'crashy' instance 0 failed on record with key None after 1 restarts: "
        "RuntimeError: bad disk on this worker"
    )
    [doomed] = [job for job in json.loads(streamlet("jobs", "--json", cwd=cluster).stdout) if job["name"] == "doomed"]
    assert (doomed["state"], doomed["attempt"]) == ("FAILED", 2)  # ended: the lifecycle lets nothing follow


@pytest.mark.timeout(180)  # two Spark JVMs start here (the test's session and the worker's); each takes 10-30 s
def test_spark_sink_instances_hand_their_epochs_to_spark_from_their_workers(
    cluster: Path, tmp_path: Path, spark: Any
) -> None:
    """A SparkSink on the cluster: each worker holding a sink instance writes through its own local session;
    the Parquet read back holds every window sum exactly once."""
    path = tmp_path / "to_spark.py"
    out = tmp_path / "sums"
    path.write_text(f"OUT = {str(out)!r}\n{TO_SPARK}", encoding="utf-8")
    run = streamlet("submit", str(path), "--job", "to-spark", "--checkpoint-interval", "0.5", cwd=cluster)
    assert run.returncode == 0, run.stderr
    expected: dict[tuple[str, float], int] = {}
    for i in range(20_000):
        start = (i * 0.01) - (i * 0.01) % 10.0
        expected[f"k{i % 5}", start] = expected.get((f"k{i % 5}", start), 0) + i % 7
    rows = spark.read.parquet(str(out)).select("key", "window_start", "value", "instance").collect()
    assert sorted((row.key, row.window_start) for row in rows) == sorted(expected)  # each window once
    assert {(row.key, row.window_start): row.value for row in rows} == expected
    assert {row.instance for row in rows} == {0, 1}  # both sink instances handed epochs to Spark
    # in.0, sums.0 and sums.1 fill worker-0 (capacity 3), so both sink instances run on worker-1, not here
    held = {job_nodes(cluster, "to-spark")["assignment"]["instances"][f"spark.{i}"] for i in range(2)}
    assert held == {"worker-1"}


NEEDS_A_TPU = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("tpu")
    source = topology.add_source("in", [1, 2, 3])
    score = topology.map("score", lambda record: (None, record.value), labels=["tpu"]).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(score)
    return topology
"""


def test_a_job_no_worker_can_take_stalls_and_submit_says_so_at_its_timeout(cluster: Path, tmp_path: Path) -> None:
    """No worker has the label: STALLED with the reason; submit's timeout names the state and why; kill ends it."""
    path = tmp_path / "tpu.py"
    path.write_text(NEEDS_A_TPU, encoding="utf-8")
    run = streamlet("submit", str(path), "--job", "tpu", "--timeout", "2", cwd=cluster)
    assert run.returncode == 1
    assert run.stderr.strip() == (
        "error: JobError: job 'tpu' has not ended after 2 s; it is STALLED: no live worker can take it: "
        "task 'score' needs a worker among ['any'] with labels ['tpu']; none is live "
        "(it goes on; 'streamlet jobs' follows it, 'streamlet kill tpu' stops it)"
    )
    assert streamlet("kill", "tpu", cwd=cluster).returncode == 0
    assert wait_for_state(cluster, "tpu", {"KILLED"})["reason"] == "killed by streamlet kill"


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_an_event_time_job_on_the_cluster_gives_the_in_process_output(
    cluster: Path, tmp_path: Path, parallelism: int
) -> None:
    """tests/support/event_time_job.py on two workers at parallelism 1, 2 and 3: the 3 s sums and the late
    records equal the in-process run's at parallelism 1 (watermarks cross TCP as their own frames)."""
    results = tmp_path / "results.json"
    target = str(ROOT / "tests" / "support" / "event_time_job.py")
    options = ("-p", f"per-second={parallelism}", "-p", f"per-3s={parallelism}")
    run = streamlet("submit", target, "--job", f"event-{parallelism}", *options, "--results", str(results), cwd=cluster)
    assert run.returncode == 0, run.stderr
    expected = sl.run(event_time_job.build_topology(1))
    collected = json.loads(results.read_text())
    for sink in ("sums", "late"):
        rows = sorted((r.key, r.value, r.ts) for r in expected.sink(sink))
        assert sorted(tuple(row) for row in collected[sink]) == rows
    assert len(collected["late"]) == 10


LIVE = """
import asyncio

import streamlet as sl

GATE = {gate!r}
WORDS = [f"w{{index % 41}}" for index in range(20_000)]


def wait_for_the_test():
    # GATE is a named pipe: opening it returns once the test (another process) opens it to write, and the
    # read ends when the test closes it. An event across processes, not a poll.
    with open(GATE) as gate:
        gate.read()


async def words():
    for index, word in enumerate(WORDS):
        if index == 5_000:
            await asyncio.to_thread(wait_for_the_test)  # the rest waits until the test opens the gate
        yield word, 1


def build_topology():
    topology = sl.Topology("live")
    source = topology.add_source("words", words())
    count = topology.reduce("count", lambda total, n: total + n, parallelism=2, emit="record")
    count.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology
"""


def instance_worker(cluster: Path, job: str, instance: str) -> str:
    """Where ``instance`` of ``job`` runs now: the layout's placement (live changes), else the assignment."""

    async def read() -> str:
        async with cluster_store(cluster) as store:
            layout = await store.get(paths.layout(job))
            assignment = await store.get(paths.assignment(job))
            assert assignment is not None
            placed = {**assignment[0]["instances"], **({} if layout is None else layout[0]["placed"])}
            return str(placed[instance])

    return anyio.run(read)


def test_rescale_and_migrate_change_a_running_job_in_the_same_attempt(cluster: Path, tmp_path: Path) -> None:
    """streamlet rescale live count 3, then 1, then streamlet migrate live count.0 to the other worker, while
    the job runs with the count's state in RocksDB: attempt 1 throughout, 'jobs --json' counts 3
    reconfigurations, and every word's running counts come out exactly once, in order."""
    gate, path, results = tmp_path / "gate", tmp_path / "live.py", tmp_path / "live.json"
    os.mkfifo(gate)
    path.write_text(LIVE.format(gate=str(gate)), encoding="utf-8")
    command = [sys.executable, "-m", "streamlet.cli", "submit", str(path), "--job", "live", "--results", str(results)]
    command += ["--state-backend", "rocksdb"]
    submitter = subprocess.Popen(command, cwd=cluster, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_state(cluster, "live", {"RUNNING"})
        up = streamlet("rescale", "live", "count", "3", cwd=cluster)
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == "job 'live': change 1 done: count runs 3 instances (attempt 1, 1 reconfiguration)"
        # <instance>.<opening>.state: the new instance holds the keys it took in its own database
        databases = sorted(path.parent.name for path in cluster.rglob("rocksdb/live.1/*/count/*/CURRENT"))
        assert [name.split(".")[0] for name in databases] == ["0", "1", "2"]
        assert all(name.endswith(".state") for name in databases)
        down = streamlet("rescale", "live", "count", "1", cwd=cluster)
        assert down.returncode == 0, down.stderr
        refused = streamlet("rescale", "live", "nope", "2", cwd=cluster)
        assert refused.returncode == 1
        assert "no task called 'nope'" in refused.stderr
        elsewhere = "worker-1" if instance_worker(cluster, "live", "count.0") == "worker-0" else "worker-0"
        moved = streamlet("migrate", "live", "count.0", elsewhere, cwd=cluster)
        done = f"job 'live': change 3 done: count.0 runs on {elsewhere} (attempt 1, 3 reconfigurations)"
        assert moved.stdout.strip() == done, moved.stderr
        listing = {job["name"]: job for job in json.loads(streamlet("jobs", "--json", cwd=cluster).stdout)}
        assert (listing["live"]["state"], listing["live"]["attempt"], listing["live"]["reconfigurations"]) == (
            "RUNNING", 1, 3,
        )  # fmt: skip
        os.close(os.open(gate, os.O_WRONLY))  # the job's source waits on the other end: open and close it
        _, err = submitter.communicate(timeout=120)
    finally:
        with contextlib.suppress(OSError):  # a test failing early: let a waiting source go (ENXIO: none waits)
            os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
        stop_submitter(submitter)  # only if the test failed before it ended: by its handle (PID)
    assert submitter.returncode == 0, err
    running: dict[str, list[int]] = {}
    for key, value, _ts in json.loads(results.read_text())["out"]:
        running.setdefault(key, []).append(value)
    totals = Counter(f"w{index % 41}" for index in range(20_000))
    assert running == {word: list(range(1, total + 1)) for word, total in totals.items()}


JOINS = """
import random

import streamlet as sl


def records(seed, count=3000):
    rng = random.Random(seed)
    return [sl.Record(f"k{rng.randrange(17)}", i, round(i * 0.05 + rng.uniform(-0.5, 0.0), 3)) for i in range(count)]


def build_topology():
    topology = sl.Topology("joins")
    watermarks = sl.Watermarks(out_of_orderness=0.5)
    left = topology.add_source("left", records(1), watermarks=watermarks)
    right = topology.add_source("right", records(2), watermarks=watermarks)
    joins = {
        "interval": topology.interval_join("interval", -1.0, 2.0, how="outer", parallelism=2),
        "asof": topology.asof_join("asof", how="left", parallelism=2),
        "window": topology.window_join("window", sl.TimeWindow(5.0, time="event"), how="outer", parallelism=2),
    }
    for name, join in joins.items():
        join.set_input(left, in_port=sl.LEFT, partitioning=sl.SAME_KEY)
        join.set_input(right, in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
        topology.add_sink(f"{name}-out", sl.CollectSink()).set_input(join)
    return topology
"""


def test_joins_on_two_workers_give_the_in_process_output(cluster: Path, tmp_path: Path) -> None:
    """An interval, an as-of and a window join, two instances each, spread over both workers (their inputs
    cross TCP by key): every sink equals the in-process run's, pair for pair."""
    path = tmp_path / "joins.py"
    path.write_text(JOINS, encoding="utf-8")
    results = tmp_path / "joins.json"
    run = streamlet("submit", str(path), "--job", "joins", "--results", str(results), cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].startswith("job 'joins' FINISHED on worker-0, worker-1")
    namespace: dict[str, Any] = {}
    exec(compile(JOINS, str(path), "exec"), namespace)  # the job's own text, run in process
    expected = sl.run(namespace["build_topology"]())
    collected = json.loads(results.read_text())
    for sink in ("interval-out", "asof-out", "window-out"):
        rows = sorted(((r.key, list(r.value), r.ts) for r in expected.sink(sink)), key=repr)
        assert len(rows) > 1000
        assert sorted((tuple(row) for row in collected[sink]), key=repr) == [tuple(row) for row in rows]


ENRICH = """
import asyncio

import streamlet as sl


async def priced(record):
    await asyncio.sleep(0)  # a call in flight
    return None if record.value % 11 == 0 else (record.key, record.value * 3)


async def names(keys):
    await asyncio.sleep(0)  # a round trip
    return {key: key.upper() for key in keys if int(key[1:]) % 4}


def build_topology():
    topology = sl.Topology("enrich")
    source = topology.add_source("in", [(f"u{i % 19}", i) for i in range(3000)])
    mapped = topology.map_async("price", priced, concurrency=8, parallelism=2)
    mapped.set_input(source, partitioning=sl.SAME_KEY)
    joined = topology.lookup_join("name", names, how="left", cache_size=5, concurrency=2, parallelism=2)
    joined.set_input(mapped, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    return topology
"""


def test_map_async_and_lookup_join_on_two_workers_give_the_in_process_output(cluster: Path, tmp_path: Path) -> None:
    """map_async then lookup_join, two instances each, spread over both workers: each key's records equal the
    in-process run's, in that key's input order."""
    path = tmp_path / "enrich.py"
    path.write_text(ENRICH, encoding="utf-8")
    results = tmp_path / "enrich.json"
    run = streamlet("submit", str(path), "--job", "enrich", "--results", str(results), cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].startswith("job 'enrich' FINISHED on worker-0, worker-1")
    expected: dict[str, list[Any]] = {}
    for i in range(3000):
        key = f"u{i % 19}"
        if i % 11:
            expected.setdefault(key, []).append([i * 3, key.upper() if (i % 19) % 4 else None])
    collected: dict[str, list[Any]] = {}
    for key, value, _ts in json.loads(results.read_text())["out"]:
        collected.setdefault(key, []).append(value)
    assert collected == expected


CONFIGURED = """
import hashlib
import os

import streamlet as sl


def build_topology(width: int, dsn: str, region: str = "none"):
    # what the submitting shell exported never arrives: the cluster's processes build this
    seen = os.environ.get("STREAMLET_TEST_REGION", "unset")
    fingerprint = hashlib.sha256(dsn.encode()).hexdigest()[:12]  # proof the build had the DSN, without it
    topology = sl.Topology("configured")
    numbers = topology.add_source("numbers", list(range(6)))
    tagged = topology.map("tag", lambda r: (r.value, (region, seen, fingerprint)), parallelism=width)
    topology.add_sink("out", sl.CollectSink()).set_input(tagged.set_input(numbers))
    return topology
"""


async def every_node(directory: Path) -> str:
    """The data of every node of the cluster's tree, as one text (read with the secret)."""
    texts = []
    async with cluster_store(directory) as store:
        waiting = [""]
        while waiting:
            path = waiting.pop()
            found = await store.get(path) if path else None
            texts.append(f"{path}={None if found is None else json.dumps(found.data, default=str)}")
            waiting.extend(f"{path}/{child}" for child in await store.children(path))
    return "\n".join(texts)


def test_params_and_a_sealed_secret_param_reach_every_build_and_the_secret_nothing_else(cluster: Path) -> None:
    """submit --param width=2 --param region=eu --secret-param dsn=@FILE from a shell that exports
    STREAMLET_TEST_REGION: each worker's build gets width as an int (2 instances of 'tag'), region, and the DSN
    (its fingerprint in every record), and not the shell's variable; the DSN's password is nowhere in the tree,
    the logs, or what jobs shows (its name only)."""
    (cluster / "configured.py").write_text(CONFIGURED, encoding="utf-8")
    dsn = "postgresql://app:Sup3r-s3cret-7c@db:5432/shop"
    (cluster / "dsn").write_text(dsn + "\n", encoding="utf-8")
    results = cluster / "configured.json"
    options = ("--param", "width=2", "--param", "region=eu", "--secret-param", f"dsn=@{cluster / 'dsn'}")
    shell = {**os.environ, "STREAMLET_TEST_REGION": "from-the-shell"}
    run = subprocess.run(
        [sys.executable, "-m", "streamlet.cli", "submit", str(cluster / "configured.py"), "--job", "configured",
         *options, "--spread", "--results", str(results)],
        cwd=cluster, capture_output=True, text=True, timeout=120, env=shell,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    fingerprint = hashlib.sha256(dsn.encode()).hexdigest()[:12]
    rows = sorted((key, tuple(value)) for key, value, _ts in json.loads(results.read_text())["out"])
    assert rows == [(n, ("eu", "unset", fingerprint)) for n in range(6)]
    listed = streamlet("jobs", cwd=cluster).stdout
    assert "params: region=eu, width=2" in listed
    assert "secret params: dsn=(sealed)" in listed
    tree = anyio.run(every_node, cluster)
    logs = "".join(path.read_text(errors="replace") for path in (cluster / ".streamlet").glob("*.log"))
    assert "Sup3r-s3cret-7c" not in tree + logs + listed + run.stdout + run.stderr
    assert "/jobs/configured/spec" in tree  # the walk did read the job's nodes


UNCHECKPOINTED_FILES = """
import streamlet as sl


def build_topology(out: str):
    topology = sl.Topology("files")
    topology.add_sink("files", sl.FileSink(out)).set_input(topology.add_source("numbers", list(range(5))))
    return topology
"""


def test_submit_warns_once_of_an_exactly_once_sink_without_checkpoints(cluster: Path) -> None:
    """The client that builds the topology warns (the workers, building parts, do not); with checkpoints, not."""
    (cluster / "files_job.py").write_text(UNCHECKPOINTED_FILES, encoding="utf-8")
    target, out = str(cluster / "files_job.py"), str(cluster / "files-out")
    plain = streamlet("submit", target, "--job", "unchecked-files", "--param", f"out={out}", cwd=cluster)
    assert plain.returncode == 0, plain.stderr
    warned = [line for line in plain.stderr.splitlines() if "exactly-once sink without checkpoints" in line]
    assert len(warned) == 1, plain.stderr
    assert "sink=files" in warned[0]
    checked = streamlet(
        "submit", target, "--job", "checked-files", "--param", f"out={out}2", "--checkpoint-interval", "1", cwd=cluster
    )
    assert checked.returncode == 0, checked.stderr
    assert "exactly-once sink without checkpoints" not in checked.stderr


# A bootstrapping table join on both workers: the users source waits for GO before it sends its rows, says it
# caught up once they are sent, then keeps the job open (no data, no end) until RELEASE exists. Both paths
# are prepended by the test.
TABLE_BOOTSTRAP = """
import asyncio
import os

import streamlet as sl

USERS = [(f"u{i}", f"name{i}") for i in range(20)]
CLICKS = [(f"u{i % 20}", i) for i in range(200)] + [("nobody", 200)]  # 'nobody' has no row


async def until_exists(path):
    while not os.path.exists(path):
        await asyncio.sleep(0.05)


class Users(sl.Source):
    def open(self, context):
        return UsersReader()


class UsersReader(sl.SourceReader):
    def __init__(self):
        self.sent = 0

    async def read(self, max_records):
        if self.sent == 0:
            await until_exists(GO)
        if self.sent < len(USERS):
            batch = USERS[self.sent : self.sent + max_records]
            self.sent += len(batch)
            return [sl.Record(key, name, 0.0) for key, name in batch]
        await until_exists(RELEASE)  # caught up: open, without data, until the test lets it end
        return None

    def caught_up(self):
        return self.sent >= len(USERS)

    def position(self):
        return self.sent

    async def seek(self, position):
        self.sent = position


def build_topology():
    topology = sl.Topology("table-bootstrap")
    clicks = topology.add_source("clicks", CLICKS)
    join = topology.table_join("j", how="left", bootstrap=True, parallelism=2)
    join.set_input(clicks, in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("users", Users()), in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    return topology
"""


def wait_for_counters(cluster: Path, job: str, wanted: Any, seconds: float = 30) -> dict[str, Any]:
    """Block until ``wanted(counters)`` holds, ``counters`` being every instance of ``job`` by its id
    ("j.0") -> its counters in the last heartbeats of both workers (what 'streamlet top' reads); looked at
    each time worker-0 beats (once a second), never on a timer."""

    async def watch() -> dict[str, Any]:
        async with cluster_store(cluster) as store:
            version: Any = -2
            counters: dict[str, Any] = {}
            try:
                with anyio.fail_after(seconds):
                    while True:
                        beat, version = await store.wait_changed(paths.load("worker-0"), version)
                        other = await store.get(paths.load("worker-1"))
                        counters = {}
                        for load in (beat, None if other is None else other[0]):
                            for name, instance in ((load or {}).get("instances") or {}).items():
                                if name.startswith(f"{job}/"):
                                    counters[name.partition("/")[2]] = instance
                        if wanted(counters):
                            return counters
            except TimeoutError:
                seen = {name: (c.get("records_in"), c.get("records_out")) for name, c in sorted(counters.items())}
                raise AssertionError(f"not within {seconds} s; last (records in, out): {seen}") from None

    return anyio.run(watch)


def counted(counters: dict[str, Any], node: str, field: str) -> int:
    """``field`` summed over the instances of ``node`` the counters hold."""
    return sum(int(c.get(field, 0)) for name, c in counters.items() if name.rpartition(".")[0] == node)


def test_a_bootstrapping_table_join_on_two_workers_releases_its_clicks_on_caught_up_over_tcp(
    cluster: Path, tmp_path: Path
) -> None:
    """table_join(bootstrap=True, parallelism=2) submitted with --spread: its instances run on both workers,
    the users source (RIGHT) on one, so one instance learns that the table side caught up from a CAUGHT_UP
    frame over TCP. The clicks (a list) all reach the join while the users source waits for GO: the sink has
    nothing (they wait). Then the source sends its rows and says it caught up, but does not end until RELEASE
    exists. The heartbeats (what 'streamlet top' reads) show the sink holding every click, and both join
    instances having emitted, while RELEASE does not exist yet: the source has not ended, so the only thing
    that can have let the clicks through is CAUGHT_UP. Then RELEASE ends the job, and its results hold every
    click once, joined with its row ('nobody' has none: None)."""
    go, release = tmp_path / "go", tmp_path / "release"
    path, results = tmp_path / "table_bootstrap_job.py", tmp_path / "table_bootstrap.json"
    path.write_text(f"GO = {str(go)!r}\nRELEASE = {str(release)!r}\n{TABLE_BOOTSTRAP}", encoding="utf-8")
    job = "table-bootstrap"
    command = [sys.executable, "-m", "streamlet.cli", "submit", str(path), "--job", job, "--spread"]
    submitter = subprocess.Popen(
        [*command, "--results", str(results)], cwd=cluster, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_state(cluster, job, {"RUNNING"})
        placed = job_nodes(cluster, job)["assignment"]["instances"]
        assert {placed["j.0"], placed["j.1"]} == {"worker-0", "worker-1"}  # the users source is on one of them
        clicks = 201
        waiting = wait_for_counters(cluster, job, lambda c: counted(c, "j", "records_in") == clicks)
        assert counted(waiting, "out", "records_in") == 0  # no row yet: every click waits in the join
        go.touch()
        released = wait_for_counters(
            cluster,
            job,
            lambda c: (
                counted(c, "out", "records_in") == clicks
                and all(c.get(f"j.{i}", {}).get("records_out", 0) > 0 for i in (0, 1))
            ),  # each instance released
        )
        assert not release.exists()  # so the users source has not ended: CAUGHT_UP let the clicks through
        assert counted(released, "j", "records_out") == clicks
        release.touch()
        _, err = submitter.communicate(timeout=60)
    finally:
        go.touch()
        release.touch()
        if submitter.poll() is None:  # the test failed before the job ended: end it, freeing the workers' slots
            streamlet("kill", job, cwd=cluster)
        stop_submitter(submitter)
    assert submitter.returncode == 0, err
    names = {f"u{i}": f"name{i}" for i in range(20)}
    expected = [[f"u{i % 20}", [i, names[f"u{i % 20}"]]] for i in range(200)] + [["nobody", [200, None]]]
    out = [[key, value] for key, value, _ts in json.loads(results.read_text())["out"]]
    assert sorted(out, key=repr) == sorted(expected, key=repr)
