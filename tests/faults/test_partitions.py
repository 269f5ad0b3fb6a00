"""Real processes on hosts of their own, cut apart: every test ends with exact committed output.

Each ZooKeeper member, master and worker runs in a network namespace with its own address from 198.18.0.0/15
on a bridge (streamlet.testing.nemesis.hosts); a cut is an nftables drop rule, so a sender meets silence, never
a refusal. The job is the gated count: it holds mid-run until the test releases it, so each cut provably falls
while the job runs. Waits are ZooKeeper watches, a short cut's length included (two heartbeats of another worker).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamlet.backends.cluster.client.api import collected
from streamlet.backends.cluster.local.local_cluster import alive
from streamlet.backends.cluster.tree import paths
from streamlet.testing.nemesis.cluster import HostCluster
from streamlet.testing.nemesis.hosts import REGISTRY, HostNetwork
from streamlet.testing.zk_watch import NodeHistory, ZkWatch
from tests.faults.conftest import KAZOO_TLS_LEAK
from tests.support import reaper
from tests.support.faults import GatedJob, expected_totals, streamlet_process, totals

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.timeout(240), KAZOO_TLS_LEAK]

JOB = "gated"


@pytest.fixture
def hosts(test_hosts_possible: None) -> Iterator[HostNetwork]:
    with HostNetwork() as network:
        yield network


@pytest.fixture
def start(hosts: HostNetwork, tmp_path: Path) -> Iterator[Any]:
    """``start(workers=2, masters=1)``: a cluster on ``hosts``; stopped by PID at the end, none left."""
    clusters: list[HostCluster] = []

    def make(**options: Any) -> HostCluster:
        cluster = HostCluster(hosts, tmp_path / ".streamlet", **options)
        clusters.append(cluster)
        cluster.start()
        reaper.record_cluster(cluster.state_dir)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            assert cluster.stop() == []
            assert not any(alive(process.pid) for process in cluster.processes.values())


def submit(cluster: HostCluster, job: GatedJob, zk: ZkWatch) -> dict[str, Any]:
    """Submit the gated job with checkpoints; return its assignment once it runs and a checkpoint completed."""
    done = streamlet_process(
        "submit", str(job.file), "--job", JOB, "--checkpoint-interval", "0.2", "--no-wait",
        cwd=cluster.state_dir.parent,
    )  # fmt: skip
    _out, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    zk.wait_for(paths.state(JOB), lambda s: s["state"] == "RUNNING")
    zk.wait_for(f"{paths.checkpoints(JOB)}/completed", lambda c: c["attempt"] == 1)
    assignment: dict[str, Any] = zk.data(paths.assignment(JOB))
    return assignment


def a_worker_of_the_running_job(cluster: HostCluster, job: GatedJob, zk: ZkWatch) -> tuple[str, NodeHistory]:
    """Submit the gated job; once it runs with a checkpoint: a worker of its attempt, and the job's state
    node followed from then on."""
    victim = sorted(workers_of(submit(cluster, job, zk)))[0]
    return victim, zk.follow(paths.state(JOB))


def workers_of(assignment: dict[str, Any]) -> set[str]:
    return set(assignment["instances"].values())


def finished_exactly(zk: ZkWatch) -> dict[str, Any]:
    """Wait until the job ends; assert FINISHED with the exact totals; its last state node."""
    state: dict[str, Any] = zk.wait_for(
        paths.state(JOB), lambda s: s["state"] in ("FINISHED", "FAILED", "KILLED"), seconds=180
    )
    assert state["state"] == "FINISHED", state
    assert totals(collected(zk.status(JOB))["totals"]) == expected_totals()
    return state


def test_a_worker_cut_from_zookeeper_but_not_its_peers_is_replaced(
    start: Any, hosts: HostNetwork, tmp_path: Path
) -> None:
    """A worker of the attempt loses every ZooKeeper member but still reaches its peers: its session expires,
    the leader runs attempt 2 without it, and its part (a zombie that can still send) changes nothing."""
    cluster = start(workers=3)
    job = GatedJob(tmp_path).write()
    with cluster.watch() as zk:
        victim, states = a_worker_of_the_running_job(cluster, job, zk)
        for member in cluster.members:
            hosts.cut(victim, member.name)
        second = zk.wait_for(paths.assignment(JOB), lambda a: a["attempt"] == 2, seconds=60)
        assert victim not in workers_of(second)
        # The leader may judge the worker lost (its heartbeats stale) before ZooKeeper expires its session.
        zk.wait_for_children(paths.WORKERS, lambda workers: victim not in workers)
        job.release()
        state = finished_exactly(zk)
        hosts.heal_all()
    assert state["attempt"] == 2, state
    assert any(s["state"] == "RECOVERING" for s in states.data() if s)
    # stopped, the zombie has nothing to drain: no stopping checkpoint of an attempt no one else runs
    zombie = cluster.processes[victim]
    zombie.terminate()
    assert zombie.wait(timeout=12) == 0  # a safety net: waiting on the stopping checkpoint, it never exited
    assert "nothing to drain: the attempt was superseded" in (cluster.state_dir / f"{victim}.log").read_text()


def test_the_leader_cut_from_the_ensembles_majority_hands_over(start: Any, hosts: HostNetwork, tmp_path: Path) -> None:
    """The leading master and one ZooKeeper member on one side, the other two members and everyone else on the
    other: the lone member serves nothing, the leader's session expires, the other master leads, the job
    ends exactly."""
    cluster = start(masters=2, workers=2)
    job = GatedJob(tmp_path).write()
    with cluster.watch() as zk:
        submit(cluster, job, zk)
        leader = zk.data(paths.LEADER)["name"]
        other = next(name for name in ("master-0", "master-1") if name != leader)
        alone, *majority = [member.name for member in cluster.members]
        for side in [*majority, other, "worker-0", "worker-1", "here"]:
            hosts.cut(leader, side)
        for member in majority:
            hosts.cut(alone, member)
        zk.wait_for(paths.LEADER, lambda node: node.get("name") == other, seconds=60)
        job.release()
        finished_exactly(zk)
        hosts.heal_all()


def test_two_workers_cut_from_each_other_end_the_attempt_naming_the_link(
    start: Any, hosts: HostNetwork, tmp_path: Path
) -> None:
    """Both workers still reach ZooKeeper, but not each other: a data link hears nothing for its bound, the
    attempt ends with a reason naming the link, and once the cut heals the job recovers with exact output."""
    cluster = start(workers=2)
    job = GatedJob(tmp_path).write()
    with cluster.watch() as zk:
        submit(cluster, job, zk)
        hosts.cut("worker-0", "worker-1")
        recovering = zk.wait_for(paths.state(JOB), lambda s: s["state"] == "RECOVERING", seconds=90)
        reason = recovering["reason"]
        assert "a part of attempt 1 is lost: PeerUnreachable: link worker-" in reason, reason
        named = reason.split("link ", 1)[1].split(":", 1)[0]
        assert named.split(" (")[0] in ("worker-0 -> worker-1", "worker-1 -> worker-0"), reason
        hosts.heal_all()
        job.release()
        state = finished_exactly(zk)
    assert state["attempt"] >= 2


def test_a_cut_healed_before_the_session_expires_costs_nothing(start: Any, hosts: HostNetwork, tmp_path: Path) -> None:
    """A worker cut from everyone for two heartbeats of the other worker (about 2 s: less than a session and a
    link's bound): its own heartbeats stop meanwhile, then no failover, attempt 1 ends exactly."""
    cluster = start(workers=2)
    job = GatedJob(tmp_path).write()
    with cluster.watch() as zk:
        victim, states = a_worker_of_the_running_job(cluster, job, zk)
        other_worker = next(name for name in ("worker-0", "worker-1") if name != victim)
        beats, silent = zk.follow(paths.load(other_worker)), zk.follow(paths.load(victim))
        everyone = [name for name in hosts.hosts if name != victim]
        for other in [*everyone, "here"]:
            hosts.cut(victim, other)
        before = len(beats.data())
        beats.wait_for_count(before + 1, seconds=10)  # a heartbeat of the other worker since the cut...
        heard = len(silent.data())  # (a beat of the victim's on its way before the cut has shown by now)
        beats.wait_for_count(before + 2, seconds=10)  # ...and another: the cut lasts two of them
        assert len(silent.data()) == heard  # the victim's own heartbeats did not get through meanwhile
        hosts.heal_all()
        job.release()
        state = finished_exactly(zk)
        assert victim in zk.children(paths.WORKERS)
    assert state["attempt"] == 1, state
    assert [s["state"] for s in states.data() if s and s["state"] != "RUNNING"] == ["FINISHED"]


def test_a_new_run_first_clears_what_a_dead_run_left(hosts: HostNetwork) -> None:
    """A run whose owner died (its record names a PID that is gone) loses its namespaces, their processes and
    its bridge when the next run starts; every interface name fits Linux's 15 characters."""
    stale = HostNetwork()
    stale.make()
    host = stale.add_host("worker-0")
    sleeper = subprocess.Popen(host.command(["sleep", "600"]))  # a process the dead run left in its host
    gone = subprocess.Popen(["true"])
    gone.wait()
    (REGISTRY / f"{stale.run}.json").write_text(json.dumps({"pid": gone.pid, "subnet": stale.subnet}))
    try:
        with HostNetwork() as fresh:
            assert not (REGISTRY / f"{stale.run}.json").exists()
            namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            assert host.namespace not in namespaces
            links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
            assert stale.bridge not in links
            assert sleeper.wait(timeout=10) == -signal.SIGKILL
            fresh.add_host("zookeeper-1")
            names = [fresh.bridge, *(f"sl{fresh.run}v{n}" for n in range(len(fresh.hosts)))]
            assert all(len(name) <= 15 for name in names), names
    finally:
        stale.remove()
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
