"""On a real cluster started with ``streamlet --log-level info --log-format json cluster up``: ``top --once``,
``jobs`` with a failed job and one with dead letters, and the processes' JSON log lines."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import running_cluster, streamlet, wait_for_node, wait_for_state
from tests.support.faults import POISON_EVERY_THIRD

pytestmark = pytest.mark.integration

FLOW = """
import asyncio
import streamlet as sl

async def ticks():
    n = 0
    while True:  # about 200 records a second until the job is killed
        await asyncio.sleep(0.005)
        yield f"k{n % 5}", n
        n += 1

def build_topology():
    topology = sl.Topology("flow")
    tagged = topology.map("tag", lambda r: (r.key, r.value), parallelism=2)
    topology.add_sink("out", sl.CollectSink()).set_input(tagged.set_input(topology.add_source("in", ticks())))
    return topology
"""


FAILS = """
import streamlet as sl

def parse(record):
    raise ValueError(f"poison {record.value}")

def build_topology():
    topology = sl.Topology("fails")
    parsed = topology.map("parse", parse).set_input(topology.add_source("numbers", [sl.Record("k7", 7, 0.0)]))
    topology.add_sink("out", sl.CollectSink()).set_input(parsed)
    return topology
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """ZooKeeper, a master and 2 workers logging JSON at info; 'skips' finished with 7 dead letters and 'fails'
    failed on its one record. Every PID is stopped afterwards."""
    directory = tmp_path_factory.mktemp("terminal")
    options = ("--log-level", "info", "--log-format", "json")
    with running_cluster(directory, "--workers", "2", "--name", "terminal", options=options):
        for name, source in (("skips", POISON_EVERY_THIRD), ("fails", FAILS)):
            (directory / f"{name}.py").write_text(source, encoding="utf-8")
            streamlet("submit", str(directory / f"{name}.py"), "--job", name, cwd=directory)
        yield directory


def blocks(listing: str) -> dict[str, list[str]]:
    """``streamlet jobs``' output: each job's lines, by job name."""
    found: dict[str, list[str]] = {}
    for line in listing.splitlines():
        if not line.startswith(" "):
            found[line.split()[0]] = []
        found[list(found)[-1]].append(line)
    return found


def test_jobs_shows_why_a_job_failed_and_the_dead_letters_of_another(cluster: Path) -> None:
    """'fails': the TaskError and the worker it failed on; 'skips': 7 dead letters, the first 5 described."""
    listed = streamlet("jobs", cwd=cluster)
    assert listed.returncode == 0, listed.stderr
    jobs = blocks(listed.stdout)
    assert re.fullmatch(r"fails +FAILED +attempt 1 +workers: worker-[01]", jobs["fails"][0])
    assert re.fullmatch(
        r" {25}failed: TaskError: task 'parse' instance 0 failed on record with key 'k7': ValueError: poison 7 "
        r"\(on worker-[01]\)",
        jobs["fails"][1],
    )
    assert len(jobs["fails"]) == 2
    assert re.fullmatch(r"skips +FINISHED +attempt 1 +workers: .*", jobs["skips"][0])
    assert jobs["skips"][2:] == [
        " " * 25 + "dead letters: 7 (the first 5)",
        *[" " * 27 + f"parse.0 key='k{n}' value={n}: ValueError: poison {n}" for n in (3, 6, 9, 12, 15)],
    ]
    [listing] = [job for job in json.loads(streamlet("jobs", "--json", cwd=cluster).stdout) if job["name"] == "skips"]
    assert listing["dead_letters"]["count"] == 7


def test_top_once_shows_both_workers_and_a_running_job_with_its_rates(cluster: Path) -> None:
    """A job emitting ~200 records/s: top --once shows both workers, its 4 instances on LIVE ones, the job
    RUNNING in attempt 1 with records in and out per second above 0, and an ended job without rates."""
    (cluster / "flow.py").write_text(FLOW, encoding="utf-8")
    submitted = streamlet("submit", str(cluster / "flow.py"), "--job", "flow", "--no-wait", cwd=cluster)
    assert submitted.returncode == 0, submitted.stderr
    try:
        wait_for_state(cluster, "flow", {"RUNNING"})
        # the workers' heartbeats carry what their loops last sampled: wait until they show every flow instance
        assigned = Counter(wait_for_node(cluster, "/jobs/flow/assignment", lambda data: True)["instances"].values())
        for worker, count in assigned.items():
            wait_for_node(cluster, f"/loads/{worker}", lambda load, n=count: len(flow_instances(load)) == n)
        top = streamlet("top", "--once", cwd=cluster)
    finally:
        streamlet("kill", "flow", cwd=cluster)
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("cluster 'terminal' · leader master-0 (epoch 1) · ")
    workers = re.findall(r"^(worker-\d) +(\S+) +NORMAL +\d+ +[\d.]+ +(\d+) +ok *$", top.stdout, re.M)
    assert [worker for worker, _, _ in workers] == ["worker-0", "worker-1"], top.stdout
    assert sum(int(count) for _, _, count in workers) == 4, top.stdout
    states = {state for _, state, count in workers if int(count) > 0}  # the scheduler may put all 4 on one
    assert states == {"LIVE/running"}, top.stdout
    [row] = re.findall(r"^flow +RUNNING +1 +([\d,]+) +([\d,]+) +([\d,]+) +([\d,]+) *$", top.stdout, re.M)
    assert re.findall(r"^fails +FAILED +1 +- +- +- +- *$", top.stdout, re.M) != [], top.stdout
    rate_in, rate_out, total_in, total_out = (int(cell.replace(",", "")) for cell in row)
    assert (rate_in > 0, rate_out > 0, total_in >= total_out > 0) == (True, True, True), top.stdout


def flow_instances(load: dict[str, Any]) -> list[str]:
    """The flow job's instances a heartbeat counts."""
    return [key for key in load.get("instances") or {} if key.startswith("flow/")]


def log_lines(cluster: Path, process: str) -> list[dict[str, Any]]:
    """Every line a process logged, each parsed as JSON (a line that is not JSON fails the test)."""
    return [json.loads(line) for line in (cluster / ".streamlet" / f"{process}.log").read_text().splitlines()]


def test_the_processes_log_json_lines_with_the_keys_bound(cluster: Path) -> None:
    """'up' handed info and json to its processes: the master's and workers' every line is JSON; a worker's
    job-part lines carry job and attempt, its failed task's line task and instance too."""
    recorded = json.loads((cluster / ".streamlet" / "cluster.json").read_text())
    assert recorded["logs"] == {"level": "info", "format": "json"}
    master = log_lines(cluster, "master-0")
    assert [(e["level"], e["master"], e["epoch"]) for e in master if e["event"] == "leading the cluster"] == [
        ("info", "master-0", 1)
    ]
    entries = log_lines(cluster, "worker-0") + log_lines(cluster, "worker-1")
    starting = sorted((e["job"], e["attempt"]) for e in entries if e["event"] == "job part starting")
    assert [part for part in starting if part[0] in ("skips", "fails")] == [("fails", 1), ("skips", 1)]
    [failed] = [e for e in entries if e["event"] == "task failed"]
    assert {key: failed[key] for key in ("level", "job", "attempt", "task", "instance")} == {
        "level": "error", "job": "fails", "attempt": 1, "task": "parse", "instance": 0,
    }  # fmt: skip
