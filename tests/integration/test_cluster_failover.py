"""Node failover with real processes: SIGKILL a worker mid-job; the job reruns on the survivor, exactly; the
killed worker stays listed LOST until it is forgotten."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamlet as sl
from streamlet.backends.cluster.leader.lost_workers import HEARTBEATS_STOPPED, SESSION_ENDED
from streamlet.backends.cluster.local.local_cluster import alive
from streamlet.testing.zk_watch import ZkWatch
from tests.support.cluster import (
    cluster_store,
    running_cluster,
    secret_of,
    streamlet,
    wait_for_exit,
    wait_for_node,
    wait_for_state,
)
from tests.support.faults import SLOW_COUNT

pytestmark = pytest.mark.integration
STREAMLET = [sys.executable, "-m", "streamlet.cli"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """ZooKeeper, a master and two workers of capacity 3; every PID is stopped (and un-stopped) afterwards."""
    with running_cluster(tmp_path, "--workers", "2", "--capacity", "3", "--name", "failover") as state:
        yield state


def start_slow_job(directory: Path, *options: str) -> tuple[subprocess.Popen[str], Path]:
    """Submit the slow count and return once it runs; the waiting submit process and its results file."""
    job_file = directory / "slow_count.py"
    job_file.write_text(SLOW_COUNT, encoding="utf-8")
    results = directory / "totals.json"
    command = [
        sys.executable,
        "-m",
        "streamlet.cli",
        "submit",
        str(job_file),
        "--job",
        "slow",
        "--results",
        str(results),
        *options,
    ]
    submit = subprocess.Popen(command, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_state(directory, "slow", {"RUNNING"})
    if "--checkpoint-interval" in options:  # well into the stream: a checkpoint across both workers completed
        wait_for_node(directory, "/jobs/slow/checkpoints/completed", lambda data: data["attempt"] == 1)
    return submit, results


def assert_exact_totals(results: Path) -> None:
    """The job's totals equal a plain count of its words."""
    words = [f"w{(i * 7919) % 97}" for i in range(40_000)]
    totals = {key: value for key, value, _ts in json.loads(results.read_text())["totals"]}
    assert totals == dict(Counter(words))


def test_killing_a_worker_mid_job_reruns_it_on_the_survivor_with_exact_counts(cluster: dict[str, Any]) -> None:
    """SIGKILL a worker while the job runs: attempt 2 runs on the other worker; totals equal a clean count."""
    submit, results = start_slow_job(cluster["dir"])
    os.kill(cluster["pids"]["worker-1"], signal.SIGKILL)
    out, err = submit.communicate(timeout=50)
    assert submit.returncode == 0, err
    assert out.splitlines()[0] == "job 'slow' FINISHED on worker-0: every worker finished (1)"
    assert_exact_totals(results)
    [listing] = json.loads(streamlet("jobs", "--json", cwd=cluster["dir"]).stdout)
    assert (listing["state"], listing["attempt"], listing["workers"]) == ("FINISHED", 2, ["worker-0"])
    assert not alive(cluster["pids"]["worker-1"])


def test_a_stopped_worker_that_comes_back_cannot_add_stale_output(cluster: dict[str, Any]) -> None:
    """SIGSTOP a worker past its session; the job moves on (from its last checkpoint); after SIGCONT the
    old attempt reports nothing and completes no checkpoint: the fence on the assignment rejects it."""
    submit, results = start_slow_job(cluster["dir"], "--checkpoint-interval", "0.3")
    zombie = cluster["pids"]["worker-1"]
    os.kill(zombie, signal.SIGSTOP)
    out, err = submit.communicate(timeout=50)
    os.kill(zombie, signal.SIGCONT)
    assert submit.returncode == 0, err
    assert out.splitlines()[0] == "job 'slow' FINISHED on worker-0: every worker finished (1)"
    # the zombie wakes up, registers again and drops its attempt 1 (it sees the job has ended)
    wait_for_node(cluster["dir"], "/workers/worker-1", lambda data: data["local_state"] == "waiting")

    async def reports() -> tuple[dict[str, list[str]], dict[str, Any] | None]:
        async with cluster_store(cluster["dir"]) as zk:
            done = {attempt: await zk.children(f"/jobs/slow/done/{attempt}") for attempt in ("1", "2")}
            completed = await zk.get("/jobs/slow/checkpoints/completed")
            return done, None if completed is None else completed[0]

    done, completed = anyio.run(reports)
    assert done == {"1": [], "2": ["worker-0"]}
    assert completed is not None
    assert (completed["attempt"], completed["finished"]) == (2, True)
    assert_exact_totals(results)
    assert alive(zombie)  # it survived its lost session and is serving again


def test_a_checkpointed_job_resumes_from_its_last_completed_checkpoint_after_a_worker_dies(
    cluster: dict[str, Any],
) -> None:
    """SIGKILL a worker mid-job: attempt 2 restores state and source positions from the last completed
    checkpoint (taken across both workers), replays only the rest, and the totals are still exact."""
    submit, results = start_slow_job(cluster["dir"], "--checkpoint-interval", "0.3")

    async def completed() -> dict[str, Any] | None:
        async with cluster_store(cluster["dir"]) as zk:
            found = await zk.get("/jobs/slow/checkpoints/completed")
            return None if found is None else found[0]

    before = anyio.run(completed)
    assert before is not None, "no checkpoint completed across the two workers"
    assert before["attempt"] == 1
    assert before["workers"] == ["worker-0", "worker-1"]
    os.kill(cluster["pids"]["worker-1"], signal.SIGKILL)
    out, err = submit.communicate(timeout=50)
    assert submit.returncode == 0, err
    assert out.splitlines()[0] == "job 'slow' FINISHED on worker-0: every worker finished (1)"
    assert_exact_totals(results)

    async def second_attempt() -> dict[str, Any]:
        async with cluster_store(cluster["dir"]) as zk:
            found = await zk.get("/jobs/slow/done/2/worker-0")
            assert found is not None
            return dict(found[0])

    report = anyio.run(second_attempt)
    restored = report["restored_from"]
    assert restored is not None
    assert restored >= before["epoch"]
    replayed = report["statistics"]["nodes"]["words"]["records_in"]
    assert 0 < replayed < 40_000  # only what came after the checkpoint was read again
    final = anyio.run(completed)
    assert final is not None
    assert (final["attempt"], final["finished"]) == (2, True)


NUMBERS = 60_000


def submit_over_numbers(directory: Path, job: str, source: str, interval: str, **paths: Path) -> Any:
    """Submit ``source`` over a file of ``NUMBERS`` lines (``INPUT``, and ``paths`` as module constants) with
    checkpoints every ``interval`` s, in the background; returns the submit process once a checkpoint completed."""
    lines = directory / "numbers.txt"
    lines.write_text("".join(f"{n}\n" for n in range(NUMBERS)), encoding="utf-8")
    constants = "".join(f"{name} = {str(path)!r}\n" for name, path in {"INPUT": lines, **paths}.items())
    job_file = directory / f"{job}_job.py"
    job_file.write_text(constants + source, encoding="utf-8")
    command = [*STREAMLET, "submit", str(job_file), "--job", job, "--checkpoint-interval", interval]
    submit = subprocess.Popen(command, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_state(directory, job, {"RUNNING"})
    wait_for_node(directory, f"/jobs/{job}/checkpoints/completed", lambda data: data["epoch"] >= 1)  # output out
    return submit


ZOMBIE_SINK = """
import asyncio
import streamlet as sl

class Slow(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.2)  # 60 batches over 2 instances: about 6 s, longer than a session
        outputs.emit_batch([sl.Record(None, int(r.value) * 2, r.ts) for r in inputs.get()])

def build_topology():
    topology = sl.Topology("zombie-sink")
    source = topology.add_source("lines", sl.FileSource(INPUT))
    slow = topology.add_task("slow", Slow, parallelism=2).set_input(source)
    topology.add_sink("files", sl.FileSink(OUT)).set_input(slow)
    return topology
"""


def test_a_zombie_holding_the_file_sink_adds_no_duplicate_and_loses_nothing(cluster: dict[str, Any]) -> None:
    """SIGSTOP the worker holding the FileSink past its session; the job moves on from its last checkpoint;
    SIGCONT the zombie after that: the committed output is exactly the input, once."""
    directory, out = cluster["dir"], cluster["dir"] / "out"
    submit = submit_over_numbers(directory, "zs", ZOMBIE_SINK, "0.5", OUT=out)
    holder = wait_for_node(directory, "/jobs/zs/assignment", lambda data: True)["instances"]["files.0"]
    zombie = cluster["pids"][holder]
    os.kill(zombie, signal.SIGSTOP)
    moved = wait_for_state(directory, "zs", {"RECOVERING", "STALLED"}, seconds=30)
    os.kill(zombie, signal.SIGCONT)  # the job moved: the zombie wakes into a newer attempt
    out_text, err = submit.communicate(timeout=90)
    assert submit.returncode == 0, err
    assert out_text.splitlines()[0].startswith("job 'zs' FINISHED"), out_text
    assert moved["attempt"] == 2
    values = [record.value for record in sl.read_file_sink(out)]
    assert len(values) == NUMBERS  # nothing doubled ...
    assert sorted(values) == [2 * n for n in range(NUMBERS)]  # ... and nothing lost


GRACEFUL = """
import asyncio
import os
import streamlet as sl

class Logged(sl.Task):
    async def execute(self, inputs, outputs):
        batch = inputs.get()
        await asyncio.sleep(0.2)  # pacing, not waiting: the job is still reading when the worker gets SIGTERM
        with open(f"{LOG}.{os.getpid()}", "a", encoding="utf-8") as log:  # every record processed, per process
            log.write("".join(f"{r.value}\\n" for r in batch))
        outputs.emit_batch([sl.Record(None, int(r.value), r.ts) for r in batch])

def build_topology():
    topology = sl.Topology("graceful")
    source = topology.add_source("lines", sl.FileSource(INPUT))
    logged = topology.add_task("logged", Logged, parallelism=2).set_input(source)
    topology.add_sink("files", sl.FileSink(OUT)).set_input(logged)
    return topology
"""


def test_sigterm_drains_a_worker_so_that_nothing_is_processed_twice(cluster: dict[str, Any]) -> None:
    """SIGTERM a worker mid-job: its job's sources pause, a checkpoint holds everything read, the worker
    exits; the next attempt resumes from there: every record is processed exactly once, output exact."""
    directory, out = cluster["dir"], cluster["dir"] / "out"
    submit = submit_over_numbers(directory, "g", GRACEFUL, "1", OUT=out, LOG=directory / "processed")
    leaving = cluster["pids"]["worker-1"]
    os.kill(leaving, signal.SIGTERM)
    assert wait_for_exit(leaving, seconds=20), "the worker did not drain and exit"
    out_text, err = submit.communicate(timeout=90)
    assert submit.returncode == 0, err
    assert out_text.splitlines()[0] == "job 'g' FINISHED on worker-0: every worker finished (1)"
    processed = [int(line) for path in directory.glob("processed.*") for line in path.read_text().split()]
    assert len(processed) == NUMBERS  # nothing read (and processed) twice after the graceful stop ...
    assert sorted(processed) == list(range(NUMBERS))
    assert sorted(record.value for record in sl.read_file_sink(out)) == list(range(NUMBERS))  # ... output exact
    assert "stopping gracefully" in (directory / ".streamlet" / "worker-1.log").read_text()


HELD = """
import asyncio
import streamlet as sl

async def ticks():
    n = 0
    while True:  # until the job is killed
        await asyncio.sleep(0.01)
        yield "k", n
        n += 1

def build_topology():
    topology = sl.Topology("held")
    pinned = topology.map("pinned", lambda r: (r.key, r.value), workers=["worker-1"]).set_input(
        topology.add_source("in", ticks())
    )
    topology.add_sink("out", sl.CollectSink()).set_input(pinned)
    return topology
"""


def listed_workers(directory: Path) -> dict[str, dict[str, Any]]:
    """The workers 'cluster status --json' lists, by id."""
    status = streamlet("cluster", "status", "--json", cwd=directory)
    assert status.returncode == 0, status.stderr
    return {worker["id"]: worker for worker in json.loads(status.stdout)["workers"]}


def test_a_killed_worker_stays_listed_lost_with_the_job_it_held_until_forgotten(cluster: dict[str, Any]) -> None:
    """SIGKILL the worker a running job's pinned task is on: the leader records /lost/worker-1 (since, why, the
    job) and warns once; 'cluster status' and its --json list it LOST with that reason and job (still assigned
    its instances) until 'cluster forget-worker' removes it."""
    directory = cluster["dir"]
    (directory / "held_job.py").write_text(HELD, encoding="utf-8")
    submitted = streamlet("submit", str(directory / "held_job.py"), "--job", "held", "--no-wait", cwd=directory)
    assert submitted.returncode == 0, submitted.stderr
    wait_for_state(directory, "held", {"RUNNING"})
    killed_at = time.time()
    os.kill(cluster["pids"]["worker-1"], signal.SIGKILL)
    record = wait_for_node(directory, "/lost/worker-1", lambda data: True, seconds=30)
    # the leader's next step for the job follows its look at the workers (and the warning it logged then)
    stalled = wait_for_state(directory, "held", {"STALLED"}, seconds=30)
    with ZkWatch(cluster["zk"], cluster["name"], secret_of(directory)) as zk:  # listed by its record alone
        zk.wait_for_children("/workers", lambda registered: "worker-1" not in registered, seconds=30)
    why = record["why"]  # which came first, a stale heartbeat or the session's end, is the machine's timing
    assert why in (SESSION_ENDED, HEARTBEATS_STOPPED)
    assert record["jobs"] == ["held"]
    assert killed_at < record["since"] < killed_at + 30
    assert stalled["reason"].startswith("lost worker-1; no live worker can take it: task 'pinned' needs a worker ")
    master_log = (directory / ".streamlet" / "master-0.log").read_text()
    warnings = [line for line in master_log.splitlines() if "worker lost" in line]
    assert len(warnings) == 1, warnings
    assert re.fullmatch(
        rf"\S+ \[warning +\] worker lost +epoch=1 jobs=\['held'\] why={re.escape(repr(why))} worker=worker-1",
        warnings[0],
    )

    status = streamlet("cluster", "status", cwd=directory)
    assert status.returncode == 0, status.stderr
    shown = re.search(
        rf"^  worker-1 +- +LOST +- +0 +0 +0\.0  lost \d+ s ago\n      lost: {re.escape(why)}; it held held\n"
        r"      instances: (.+)$",
        status.stdout,
        re.M,
    )
    assert shown is not None, status.stdout
    assert "held/pinned.0" in shown[1].split(", ")
    lost = listed_workers(directory)["worker-1"]
    assert (lost["state"], lost["address"], lost["lost"]) == ("LOST", "-", record)
    assert "held/pinned.0" in lost["instances"]

    forgot = streamlet("cluster", "forget-worker", "worker-1", cwd=directory)
    assert (forgot.returncode, forgot.stdout) == (0, "forgot lost worker 'worker-1'\n"), forgot.stderr
    after = streamlet("cluster", "status", cwd=directory).stdout
    assert re.findall(r"^  (worker-\S+)", after, re.M) == ["worker-0"], after
    assert list(listed_workers(directory)) == ["worker-0"]
    again = streamlet("cluster", "forget-worker", "worker-1", cwd=directory)
    assert (again.returncode, again.stdout) == (0, "no lost worker 'worker-1' is listed\n")
