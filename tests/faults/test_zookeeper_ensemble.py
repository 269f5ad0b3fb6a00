"""The cluster on a real ZooKeeper ensemble of three members (``cluster up --zookeepers 3``): losing one member
(a follower, or the member leading the ensemble) costs no job anything, not even an attempt; losing two stops
all progress (nothing completes, ``cluster status`` says the coordination service has no quorum and names
each member's mode) until the members are started again from the command lines ``cluster up`` recorded, and
the job then ends with exact output. Members are killed by PID and every process is stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamlet.backends.cluster.client.api import collected
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.quorum import member_modes
from tests.support.cluster import wait_for_exit
from tests.support.faults import GatedJob, LocalCluster, expected_totals, totals, watching

pytestmark = [pytest.mark.faults, pytest.mark.integration]

JOB = "gated"


def members(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """Each ZooKeeper member ``cluster up`` recorded in ``cluster.json``: id -> its record."""
    state = json.loads((cluster.state_dir / "cluster.json").read_text())
    return {p["id"]: p for p in state["processes"] if p["role"] == "zookeeper"}


def modes(cluster: LocalCluster) -> dict[str, str]:
    """Each member's mode now, by id."""
    by_address = dict(member_modes(cluster.zk))
    return {name: by_address[record["address"]] for name, record in members(cluster).items()}


def settled_modes(
    cluster: LocalCluster, wanted: Callable[[dict[str, str]], bool], seconds: float = 60
) -> dict[str, str]:
    """The members' modes once ``wanted`` holds of them (the modes last seen when it never does): a member
    that just lost a peer may still be electing or catching up for a moment."""
    deadline = time.monotonic() + seconds
    while not wanted(now := modes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.05)  # a poll, not a wait: ZooKeeper announces no mode change, so ask at most 20 times a second
    return now


def kill_member(cluster: LocalCluster, member: str) -> None:
    """SIGKILL one member and wait until it is gone."""
    pid = int(members(cluster)[member]["pid"])
    os.kill(pid, signal.SIGKILL)
    assert wait_for_exit(pid)


def running_with_a_checkpoint(cluster: LocalCluster, job: GatedJob) -> Any:
    """Submit the gated job with checkpoints, without waiting; return once it runs and a checkpoint completed."""
    submit = cluster.submit(job.file, JOB, "--checkpoint-interval", "0.2", "--no-wait").finish()
    assert submit.code == 0, submit.err
    with watching(cluster) as zk:
        zk.wait_for(paths.state(JOB), lambda s: s["state"] == "RUNNING")
        return zk.wait_for(f"{paths.checkpoints(JOB)}/completed", lambda c: c["attempt"] == 1)


def finished(cluster: LocalCluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait until the job ends: its state node and what ``submit`` reports."""
    with watching(cluster) as zk:
        state = zk.wait_for(paths.state(JOB), lambda s: s["state"] in ("FINISHED", "FAILED", "KILLED"), seconds=120)
        return state, zk.status(JOB)


def test_cluster_up_starts_an_ensemble_whose_members_status_shows(
    new_cluster: Callable[..., LocalCluster],
) -> None:
    """Three members, each in a folder of its own with its configuration and id, one leading; every process
    takes the connect string of all three; ``cluster status`` names each member's mode."""
    cluster = new_cluster(own_zookeeper=True, zookeepers=3)
    recorded = members(cluster)
    assert sorted(recorded) == ["zookeeper-1", "zookeeper-2", "zookeeper-3"]
    assert cluster.zk == ",".join(recorded[name]["address"] for name in sorted(recorded))
    for name, record in recorded.items():
        folder = cluster.state_dir / name
        assert record["cwd"] == str(folder.resolve())
        assert (folder / "data" / "myid").read_text() == f"{name.removeprefix('zookeeper-')}\n"
        assert record["command"][-2:] == ["org.apache.zookeeper.server.quorum.QuorumPeerMain", "zoo.cfg"]
    settled = settled_modes(cluster, lambda now: sorted(now.values()) == ["follower", "follower", "leader"])
    assert sorted(settled.values()) == ["follower", "follower", "leader"]
    status = cluster.run("cluster", "status", "--json")
    assert status.returncode == 0, status.stderr
    shown = {member["address"]: member["mode"] for member in json.loads(status.stdout)["zookeeper"]}
    assert sorted(shown) == sorted(record["address"] for record in recorded.values())
    assert sorted(shown.values()) == ["follower", "follower", "leader"]
    for process in ("master-0", "worker-0", "worker-1"):
        command = (Path("/proc") / str(cluster.pids[process]) / "cmdline").read_bytes().split(b"\0")
        assert command[command.index(b"--zk") + 1].decode() == cluster.zk


@pytest.mark.parametrize("lost", ["a follower", "the leader"])
def test_losing_one_member_of_three_costs_the_job_nothing(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any, lost: str
) -> None:
    """SIGKILL one member (a follower, or the one leading the ensemble) while a checkpointed job runs: the
    other two keep a quorum, the sessions move over, and the job finishes in attempt 1 with exact totals."""
    cluster = new_cluster(own_zookeeper=True, zookeepers=3)
    job = GatedJob(tmp_path).write()
    running_with_a_checkpoint(cluster, job)
    now = settled_modes(cluster, lambda now: sorted(now.values()) == ["follower", "follower", "leader"])
    victim = sorted(name for name, mode in now.items() if (mode == "leader") == (lost == "the leader"))[0]
    kill_member(cluster, victim)
    job.release()
    state, status = finished(cluster)
    assert (state["state"], state["attempt"]) == ("FINISHED", 1), state
    assert totals(collected(status)["totals"]) == expected_totals()

    def others_serve(now: dict[str, str]) -> bool:
        return sorted(mode for name, mode in now.items() if name != victim) == ["follower", "leader"]

    after = settled_modes(cluster, others_serve)
    assert after[victim] == "down"
    assert others_serve(after), after


def test_losing_two_members_stops_all_progress_until_they_are_back_then_the_job_ends_exactly(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any
) -> None:
    """SIGKILL two of three members while a job runs under a waiting ``submit``: the last member serves
    nothing, ``cluster status`` fails saying there is no quorum and naming each member's mode. Start both
    members again from their recorded command lines: the job ends FINISHED with exact totals (in attempt 1
    when the sessions outlived the outage, else resumed from its last checkpoint), and the waiting submit
    reports it."""
    cluster = new_cluster(own_zookeeper=True, zookeepers=3)
    job = GatedJob(tmp_path).write()
    submit = cluster.submit(job.file, JOB, "--checkpoint-interval", "0.2", "--timeout", "300")
    with watching(cluster) as zk:
        zk.wait_for(paths.state(JOB), lambda s: s["state"] == "RUNNING")
        before = zk.wait_for(f"{paths.checkpoints(JOB)}/completed", lambda c: c["attempt"] == 1)
    lost = sorted(members(cluster))[:2]
    for member in lost:
        kill_member(cluster, member)
    status = cluster.run("cluster", "status")
    assert status.returncode != 0
    assert "the coordination service has no quorum: " in status.stderr, status.stderr
    for member in lost:  # the last one may still say it leads until it misses its followers (syncLimit)
        assert f"{members(cluster)[member]['address']} down" in status.stderr
    job.release()
    for member in lost:
        cluster.restart_member(member)
    state, report = finished(cluster)
    submitted = submit.finish(seconds=180)
    assert submitted.code == 0, submitted.err
    assert state["state"] == "FINISHED", state
    assert totals(submitted.collected()["totals"]) == expected_totals()
    with watching(cluster) as zk:
        completed = zk.data(f"{paths.checkpoints(JOB)}/completed")
    assert completed["finished"] is True
    assert (completed["attempt"], completed["epoch"]) > (before["attempt"], before["epoch"])
    if state["attempt"] > 1:  # the sessions expired during the outage: resumed, never from nothing
        assert all(entry["restored_from"] is not None for entry in report["done"].values())
