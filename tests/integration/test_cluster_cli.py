"""``streamlet cluster up/status/down`` and ``streamlet master``/``worker`` as real processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from streamlet.backends.cluster.local.local_cluster import alive
from streamlet.backends.cluster.local.run import SESSION_TIMEOUT
from streamlet.backends.cluster.tree import paths
from tests.integration.test_cluster_jobs import LIVE
from tests.support.cluster import (
    cluster_store,
    recorded,
    running_cluster,
    secret_of,
    stop_submitter,
    wait_for_exit,
    wait_for_node,
    wait_for_state,
)
from tests.support.faults import ZkWatch

pytestmark = pytest.mark.integration
STREAMLET = [sys.executable, "-m", "streamlet.cli"]


def streamlet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STREAMLET, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, list[dict[str, object]]]]:
    """A cluster of ZooKeeper, 2 masters and 2 workers; every PID it started is stopped afterwards."""
    with running_cluster(tmp_path, "--workers", "2", "--masters", "2", "--name", "cli") as state:
        yield tmp_path, state["processes"]


def leader_line(output: str) -> tuple[str, int]:
    match = re.search(r"leader: (\S+) \(epoch (\d+)\)", output)
    assert match is not None, output
    return match.group(1), int(match.group(2))


def test_up_starts_every_process_and_status_shows_them(cluster: tuple[Path, list[dict[str, object]]]) -> None:
    """up records ZooKeeper, 2 masters and 2 workers; status shows a leader, both candidates, both workers."""
    directory, processes = cluster
    assert [(p["role"], p["id"]) for p in processes] == [
        ("zookeeper", "zookeeper"), ("master", "master-0"), ("master", "master-1"),
        ("worker", "worker-0"), ("worker", "worker-1"),
    ]  # fmt: skip
    assert all(alive(int(str(p["pid"]))) for p in processes)
    status = streamlet("cluster", "status", cwd=directory)
    assert status.returncode == 0, status.stderr
    assert leader_line(status.stdout)[1] == 1
    candidates = re.search(r"candidates: (.*)$", status.stdout, re.M)
    assert candidates is not None
    assert sorted(candidates.group(1).split(", ")) == ["master-0", "master-1"]  # both race: either may be first
    rows = re.findall(
        r"^  (worker-\d)\s+(127\.0\.0\.\d+):\d+\s+STANDBY/waiting\s+NORMAL\s+\d+\s+0\s+[\d.]+\s+ok$",
        status.stdout,
        re.M,
    )
    assert rows == [("worker-0", "127.0.0.2"), ("worker-1", "127.0.0.3")]  # each on a loopback address of its own
    as_json = json.loads(streamlet("cluster", "status", "--json", cwd=directory).stdout)
    assert [(w["id"], w["state"], w["stale"]) for w in as_json["workers"]] == [
        ("worker-0", "STANDBY/waiting", False), ("worker-1", "STANDBY/waiting", False),
    ]  # fmt: skip
    assert (as_json["cluster"], as_json["jobs"]) == ("cli", [])


def test_the_secret_is_readable_by_its_owner_only(cluster: tuple[Path, list[dict[str, object]]]) -> None:
    """The state dir is 0700 and the secret in it 0600."""
    directory, _ = cluster
    assert (directory / ".streamlet").stat().st_mode & 0o777 == 0o700
    assert (directory / ".streamlet" / "secret").stat().st_mode & 0o777 == 0o600


def test_ps_shows_streamlet_master_and_worker(cluster: tuple[Path, list[dict[str, object]]]) -> None:
    """Each started process shows in ps as 'streamlet master ...' or 'streamlet worker ...'."""
    _, processes = cluster
    for process in processes[1:]:
        command = Path(f"/proc/{process['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert f"streamlet {process['role']} --zk" in command


PACED = """
import asyncio
import streamlet as sl

class Paced(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.3)
        outputs.emit_batch([sl.Record(r.value % 10, 1, 0.0) for r in inputs.get()])

def build_topology():
    topology = sl.Topology("paced")
    source = topology.add_source("in", list(range(24_000)))
    paced = topology.add_task("paced", Paced).set_input(source)
    count = topology.reduce("count", lambda a, b: a + b, parallelism=2, emit="record")
    count.set_input(paced, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology
"""


def test_master_failover_elects_a_candidate_with_a_higher_epoch(
    cluster: tuple[Path, list[dict[str, object]]], tmp_path: Path
) -> None:
    """SIGKILL the leader while a job runs: the other master leads within session timeout + 1 s, with a
    higher epoch; the job is not reassigned and completes with exact results."""
    directory, processes = cluster
    job_file = tmp_path / "paced.py"
    job_file.write_text(PACED, encoding="utf-8")
    results = tmp_path / "paced.json"
    submit = subprocess.Popen(
        [*STREAMLET, "submit", str(job_file), "--job", "paced", "--results", str(results)],
        cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_state(directory, "paced", {"RUNNING"})
    name, epoch = leader_line(streamlet("cluster", "status", cwd=directory).stdout)
    [victim] = [p for p in processes if p["id"] == name]
    with ZkWatch(recorded(directory)["zk"], "cli", secret_of(directory)) as zk:
        leaders = zk.follow("/leader")  # watching before the kill: the time measured is the cluster's alone
        killed_at = time.time()
        os.kill(int(str(victim["pid"])), signal.SIGKILL)
        seen_at, new_leader = leaders.seen_at(lambda data: data["epoch"] > epoch, seconds=30)
    # the session times out, the server notices at its next tick (0.5 s), the candidate takes over
    assert seen_at - killed_at < SESSION_TIMEOUT + 2.0, "no new leader in time"
    assert new_leader["name"] != name
    out, err = submit.communicate(timeout=60)
    assert submit.returncode == 0, err
    assert out.splitlines()[0].startswith("job 'paced' FINISHED on ")
    finals: dict[int, int] = {}
    for key, value, _ts in json.loads(results.read_text())["out"]:
        finals[key] = max(finals.get(key, 0), value)  # running counts: the largest is the total
    assert finals == dict.fromkeys(range(10), 2_400)

    async def assignment() -> tuple[dict[str, object], int]:
        async with cluster_store(directory) as zk:
            found = await zk.get("/jobs/paced/assignment")
            assert found is not None
            return found

    written, version = anyio.run(assignment)
    assert (written["attempt"], written["epoch"], version) == (1, epoch, 0)  # assigned once, by the old leader


# Numbers 0, 1, 2, ... in blocks of 100 until the file RELEASE exists; a keyed (count, sum) per number mod 10.
# Replayable (position/seek), so a job stopped by 'cluster down' goes on from its checkpoint after 'up'.
UNTIL_RELEASED = """
import asyncio
import os
import streamlet as sl

RELEASE = {release!r}
BLOCK = 100


class Numbers(sl.Source):
    def open(self, context):
        return Reader()


class Reader(sl.SourceReader):
    def __init__(self):
        self.count = 0

    async def read(self, max_records):
        if self.count % BLOCK == 0 and os.path.exists(RELEASE):
            return None
        await asyncio.sleep(0.02)  # paced: the job is still running when the cluster goes down
        records = [sl.Record(i % 10, i, 0.0) for i in range(self.count, self.count + BLOCK)]
        self.count += BLOCK
        return records

    def position(self):
        return self.count

    async def seek(self, position):
        self.count = position


class CountAndSum(sl.Task):
    def execute(self, inputs, outputs):
        for r in inputs.get():
            n, total = self.state.get(r.key, (0, 0))
            self.state.put(r.key, (n + 1, total + r.value))

    def finish(self, outputs):
        outputs.emit_all(self.state.items())


def build_topology():
    topology = sl.Topology("numbers")
    numbers = topology.add_source("numbers", Numbers())
    totals = topology.add_task("totals", CountAndSum, parallelism=2).set_input(numbers, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(totals)
    return topology
"""


@pytest.mark.timeout(240)  # down (the workers drain), up again (ZooKeeper, 2 masters, 2 workers), the job
def test_down_stops_every_process_and_a_waiting_submit_follows_its_job_through_up_again(
    cluster: tuple[Path, list[dict[str, object]]], tmp_path: Path
) -> None:
    """down stops ZooKeeper, masters and workers by PID and forgets the cluster; 'up' on the same state dir
    serves ZooKeeper on other ports, and a 'submit' that was waiting on a checkpointed job reads them again and
    reports the job FINISHED there, with every number counted once."""
    directory, processes = cluster
    release = tmp_path / "release"
    job_file = tmp_path / "counted.py"
    job_file.write_text(UNTIL_RELEASED.format(release=str(release)), encoding="utf-8")
    results = tmp_path / "numbers.json"
    options = ("--checkpoint-interval", "0.5", "--adapt", "none", "--timeout", "240", "--results", str(results))
    submit = subprocess.Popen(
        [*STREAMLET, "submit", str(job_file), "--job", "numbers", *options],
        cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_node(directory, paths.checkpoints("numbers") + "/completed", lambda c: c["attempt"] == 1, 120)
        first_zk = recorded(directory)["zk"]
        down = streamlet("cluster", "down", cwd=directory)
        assert down.returncode == 0, down.stderr
        assert down.stdout.startswith("stopped 5 processes: worker-0")
        assert not any(alive(int(str(p["pid"]))) for p in processes)
        assert not (directory / ".streamlet" / "cluster.json").exists()
        again = streamlet("cluster", "status", cwd=directory)
        assert again.returncode == 1
        assert again.stderr.strip().startswith("error: ClusterError: no cluster recorded in .streamlet")
        assert submit.poll() is None  # still waiting on the job
        up = streamlet("cluster", "up", "--workers", "2", "--masters", "2", "--name", "cli", "--loopback-hosts",
                       cwd=directory)  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert recorded(directory)["zk"] != first_zk  # ZooKeeper's port is a free one again
        wait_for_state(directory, "numbers", {"RUNNING"}, seconds=120)
        release.touch()
        out, err = submit.communicate(timeout=180)
    finally:
        release.touch()
        stop_submitter(submit)
    assert submit.returncode == 0, err
    assert out.splitlines()[0].startswith("job 'numbers' FINISHED on ")
    assert "cluster moved" in err
    totals = {key: tuple(value) for key, value, _ts in json.loads(results.read_text())["out"]}
    sent = sum(n for n, _ in totals.values())
    assert sent >= 100
    assert sent % 100 == 0  # whole blocks: the source ends only between blocks
    assert totals == {k: (sent // 10, sum(range(k, sent, 10))) for k in range(10)}


def test_up_on_a_running_cluster_refuses_and_leaves_it_untouched(cluster: tuple[Path, list[dict[str, object]]]) -> None:
    """A second 'cluster up' in the same state dir starts nothing and stops nothing."""
    directory, processes = cluster
    again = streamlet("cluster", "up", "--workers", "1", cwd=directory)
    assert again.returncode == 1
    assert again.stderr.strip() == (
        "error: ClusterError: a cluster is already recorded in .streamlet; it was left untouched "
        "('streamlet cluster status' shows it, 'streamlet cluster down' stops it)"
    )
    assert all(alive(int(str(p["pid"]))) for p in processes)
    assert json.loads((directory / ".streamlet" / "cluster.json").read_text())["processes"] == processes


def test_submit_without_the_secret_is_refused_before_any_code_runs(
    cluster: tuple[Path, list[dict[str, object]]], tmp_path: Path
) -> None:
    """No secret: a clear error; a wrong secret: ZooKeeper's ACL refuses it. The module never runs anywhere."""
    directory, _ = cluster
    zk = json.loads((directory / ".streamlet" / "cluster.json").read_text())["zk"]
    marker = tmp_path / "ran"
    job_file = tmp_path / "intruder.py"
    job_file.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n", encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environment = {key: value for key, value in os.environ.items() if key != "STREAMLET_SECRET"}
    command = [*STREAMLET, "submit", str(job_file), "--zk", zk, "--name", "cli"]
    anonymous = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, env=environment, timeout=60)
    assert anonymous.returncode == 1
    assert anonymous.stderr.strip() == (
        "error: StreamletError: submit needs the cluster secret: set STREAMLET_SECRET (hex) or run it with the "
        "--state-dir that 'streamlet cluster up' wrote (looked in .streamlet)"
    )
    environment["STREAMLET_SECRET"] = "00" * 32
    forged = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, env=environment, timeout=60)
    assert forged.returncode == 1
    assert "carries another owner's ACL" in forged.stderr
    assert not marker.exists()


def test_sigterm_to_the_leader_hands_over_at_once(cluster: tuple[Path, list[dict[str, object]]]) -> None:
    """A leader stopped with SIGTERM closes its session: a candidate leads without waiting for a timeout."""
    directory, processes = cluster
    name, epoch = leader_line(streamlet("cluster", "status", cwd=directory).stdout)
    [leader] = [p for p in processes if p["id"] == name]
    with ZkWatch(recorded(directory)["zk"], "cli", secret_of(directory)) as zk:
        leaders = zk.follow("/leader")  # watching before the signal: the time measured is the cluster's alone
        stopped_at = time.time()
        os.kill(int(str(leader["pid"])), signal.SIGTERM)
        seen_at, new_leader = leaders.seen_at(lambda data: data["epoch"] > epoch, seconds=30)
    assert seen_at - stopped_at < SESSION_TIMEOUT  # not after its session timed out: it closed it
    assert new_leader["name"] != name
    assert wait_for_exit(int(str(leader["pid"])), seconds=10)
    # the dashboard moves with leadership: the new leader serves it and says where
    dashboard = wait_for_node(directory, "/dashboard", lambda data: data["master"] == new_leader["name"])
    token = (directory / ".streamlet" / "monitor-token").read_text().strip()  # every master serves with it
    with urllib.request.urlopen(f"{dashboard['url']}api/cluster?token={token}", timeout=10) as response:
        view = json.loads(response.read())
    assert view["leader"]["name"] == new_leader["name"]
    assert view["leader"]["epoch"] == new_leader["epoch"]


WIDE = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("wide")
    source = topology.add_source("in", [(f"k{i % 7}", 1) for i in range(1000)])
    count = topology.reduce("count", lambda total, one: total + one, parallelism=2, labels=["fast"], emit="record")
    count.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology
"""


def test_a_worker_added_to_a_running_cluster_takes_the_work_that_waited(tmp_path: Path) -> None:
    """The count asks for a 'fast' worker and the one worker has no such label: STALLED with the reason.
    'cluster add-worker --label fast' starts worker-1 (recorded, stopped by 'down'): the job is scheduled,
    the count on worker-1, and finishes."""
    with running_cluster(tmp_path, "--workers", "1", "--name", "grow"):
        job = tmp_path / "wide.py"
        job.write_text(WIDE, encoding="utf-8")
        submitted = streamlet("submit", str(job), "--job", "wide", "--no-wait", cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        stalled = wait_for_state(tmp_path, "wide", {"STALLED"})
        assert "no live worker can take it" in stalled["reason"]
        added = streamlet("cluster", "add-worker", "--label", "fast", cwd=tmp_path)
        assert added.stdout.strip() == "started worker-1 (capacity 8)", added.stderr
        recorded = json.loads((tmp_path / ".streamlet" / "cluster.json").read_text())
        assert [p["id"] for p in recorded["processes"] if p["role"] == "worker"] == ["worker-0", "worker-1"]
        finished = wait_for_state(tmp_path, "wide", {"FINISHED", "FAILED"})
        assert finished["state"] == "FINISHED", finished["reason"]
        listing = {j["name"]: j for j in json.loads(streamlet("jobs", "--json", cwd=tmp_path).stdout)}
        assert "worker-1" in listing["wide"]["workers"]


def test_a_worker_added_while_a_job_runs_takes_a_share_of_it_by_rebalance(tmp_path: Path) -> None:
    """A keyed count runs on the one worker (its source waiting on a named pipe); nothing to rebalance.
    'cluster add-worker' starts worker-1, 'rebalance' moves both count instances to it, live: the same
    attempt, two reconfigurations, and every word's running counts come out exactly once, in order."""
    gate, path, results = tmp_path / "gate", tmp_path / "live.py", tmp_path / "live.json"
    os.mkfifo(gate)
    path.write_text(LIVE.format(gate=str(gate)), encoding="utf-8")
    with running_cluster(tmp_path, "--workers", "1", "--name", "spread"):
        command = [*STREAMLET, "submit", str(path), "--job", "live", "--results", str(results)]
        submitter = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for_state(tmp_path, "live", {"RUNNING"})
            even = streamlet("rebalance", "live", "--dry-run", cwd=tmp_path)
            balanced = "job 'live': balanced already: nothing to move (attempt 1, 0 reconfigurations)"
            assert even.stdout.strip() == balanced, even.stderr
            added = streamlet("cluster", "add-worker", cwd=tmp_path)
            assert added.stdout.strip() == "started worker-1 (capacity 8)", added.stderr
            planned = streamlet("rebalance", "live", "--dry-run", cwd=tmp_path)
            assert planned.stdout.splitlines()[:2] == [
                "would move count.1: worker-0 -> worker-1",
                "would move count.0: worker-0 -> worker-1",
            ], planned.stderr
            moved = streamlet("rebalance", "live", cwd=tmp_path)
            assert moved.stdout.splitlines() == [
                "moved count.1: worker-0 -> worker-1",
                "moved count.0: worker-0 -> worker-1",
                "job 'live': 2 moves done (attempt 1, 2 reconfigurations)",
            ], moved.stderr
            listing = {job["name"]: job for job in json.loads(streamlet("jobs", "--json", cwd=tmp_path).stdout)}
            assert listing["live"]["instances"] == {
                "words.0": "worker-0", "count.0": "worker-1", "count.1": "worker-1", "out.0": "worker-0",
            }  # fmt: skip
            assert (listing["live"]["attempt"], listing["live"]["workers"]) == (1, ["worker-0", "worker-1"])
            os.close(os.open(gate, os.O_WRONLY))  # the job's source waits on the other end: open and close it
            _, err = submitter.communicate(timeout=120)
        finally:
            with contextlib.suppress(OSError):  # a test failing early: let a waiting source go
                os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
            stop_submitter(submitter)  # only if the test failed before it ended: by its handle (PID)
    assert submitter.returncode == 0, err
    running: dict[str, list[int]] = {}
    for key, value, _ts in json.loads(results.read_text())["out"]:
        running.setdefault(key, []).append(value)
    totals = Counter(f"w{index % 41}" for index in range(20_000))
    assert running == {word: list(range(1, total + 1)) for word, total in totals.items()}


SPREAD = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("spread")
    source = topology.add_source("in", [(f"k{i % 7}", 1) for i in range(1000)])
    tag = topology.map("tag", lambda record: (record.key, record.value), workers=["worker-0"]).set_input(source)
    count = topology.reduce("count", lambda total, one: total + one, parallelism=2, workers=["worker-1"], emit="record")
    count.set_input(tag, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology
"""


def test_workers_on_loopback_addresses_of_their_own_run_a_job_across_them(tmp_path: Path) -> None:
    """'cluster up --loopback-hosts': worker-0 serves on 127.0.0.2, worker-1 on 127.0.0.3 (as two machines
    would); a keyed job whose 'tag' must run on worker-0 and whose count must run on worker-1 sends every
    record from one address to the other, and ends with exact counts."""
    with running_cluster(tmp_path, "--workers", "2", "--name", "hosts", "--loopback-hosts") as state:
        assert [p.get("host") for p in state["processes"] if p["role"] == "worker"] == ["127.0.0.2", "127.0.0.3"]
        status = json.loads(streamlet("cluster", "status", "--json", cwd=tmp_path).stdout)
        addresses = {worker["id"]: worker["address"] for worker in status["workers"]}
        assert addresses["worker-0"].startswith("127.0.0.2:")
        assert addresses["worker-1"].startswith("127.0.0.3:")
        job = tmp_path / "spread.py"
        job.write_text(SPREAD, encoding="utf-8")
        results = tmp_path / "spread.json"
        done = streamlet("submit", str(job), "--job", "spread", "--results", str(results), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        listing = {j["name"]: j for j in json.loads(streamlet("jobs", "--json", cwd=tmp_path).stdout)}
    assert listing["spread"]["state"] == "FINISHED"
    placed = listing["spread"]["instances"]
    assert (placed["tag.0"], placed["count.0"], placed["count.1"]) == ("worker-0", "worker-1", "worker-1")
    running: dict[str, list[int]] = {}
    for key, value, _ts in json.loads(results.read_text())["out"]:
        running.setdefault(key, []).append(value)
    assert {key: sorted(values) for key, values in running.items()} == {
        f"k{n}": list(range(1, len(range(n, 1000, 7)) + 1)) for n in range(7)
    }


PEEK = """
import os
import streamlet as sl

def peek(record):
    with open("/proc/self/environ", "rb") as handle:
        environ = handle.read()
    return record.value, sorted(key for key in os.environ if "SECRET" in key) + [len(environ)]

def build_topology():
    topology = sl.Topology("peek")
    source = topology.add_source("in", [0, 1])
    seen = topology.map("peek", peek, parallelism=2).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(seen)
    return topology
"""


def test_the_secret_reaches_no_process_environment_and_no_job_code(
    cluster: tuple[Path, list[dict[str, object]]], tmp_path: Path
) -> None:
    """Masters and workers read the secret from its file: neither their environment (/proc/<pid>/environ)
    nor the job code on both workers sees it, whatever the submitting client's environment holds."""
    directory, processes = cluster
    secret = (directory / ".streamlet" / "secret").read_bytes()
    for process in processes[1:]:
        environ = Path(f"/proc/{process['pid']}/environ").read_bytes()
        assert b"STREAMLET_SECRET" not in environ
        assert secret.hex().encode() not in environ
        assert secret not in environ
        command = Path(f"/proc/{process['pid']}/cmdline").read_bytes()
        assert command.endswith(
            b"--secret-file\0" + str(directory.resolve() / ".streamlet" / "secret").encode() + b"\0"
        )
    job = tmp_path / "peek.py"
    job.write_text(PEEK, encoding="utf-8")
    results = tmp_path / "peek.json"
    done = streamlet("submit", str(job), "--job", "peek", "--results", str(results), cwd=directory)
    assert done.returncode == 0, done.stderr
    rows = sorted(json.loads(results.read_text())["out"], key=lambda row: row[0])
    assert [(key, value[:-1]) for key, value, _ts in rows] == [(0, []), (1, [])]
    assert all(value[-1] > 0 for _, value, _ts in rows)  # the job really read its environment
