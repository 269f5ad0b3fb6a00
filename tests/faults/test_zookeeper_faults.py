"""The cluster's fault matrix, coordination: ZooKeeper itself SIGKILLed while a job runs and restarted on the
same port and data directory; ZooKeeper paused (SIGSTOP) while ``submit`` waits for a job. Each test has a
cluster with a ZooKeeper of its own (``cluster up`` without ``--zk``), so breaking it touches no other test;
a restarted server is stopped by its PID with the rest.

Not here: a zombie worker holding a FileSink and a graceful SIGTERM (issue 11 items 4/5, in
tests/integration/test_cluster_failover.py), a full disk (tests/faults/test_disk_full.py), cycles running on
the cluster (item 7).
"""

from __future__ import annotations

import os
import pwd
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any

import pytest

from streamlet.backends.cluster.client.api import collected
from streamlet.backends.cluster.tree import paths
from tests.support.cluster import wait_for_exit
from tests.support.faults import GatedJob, LocalCluster, expected_totals, totals, watching

pytestmark = [pytest.mark.faults, pytest.mark.integration]

JOB = "gated"


def test_zookeeper_sigkill_and_restart_mid_job_the_job_still_finishes_exactly(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any, figures: Callable[[str], None]
) -> None:
    """SIGKILL ZooKeeper while a checkpointed job runs, let the job go on without it, restart ZooKeeper on the
    same port and data directory: the job ends FINISHED with exact totals (read back from ZooKeeper: the
    workers' reports). The sessions survive (the server restores them from its data directory), so most
    runs finish in attempt 1. But a worker whose client is still waiting out a read timeout against the
    restarting server may miss heartbeats for longer than STALE_AFTER (5 s): the leader then counts it lost
    and reruns the job from its last checkpoint (attempt 2 or later): a needless failover, still exact.
    The job is submitted without waiting: a waiting ``submit`` across a ZooKeeper outage is the next test."""
    cluster = new_cluster(own_zookeeper=True)
    job = GatedJob(tmp_path).write()
    submit = cluster.submit(job.file, JOB, "--checkpoint-interval", "0.2", "--no-wait").finish()
    assert submit.code == 0, submit.err
    with watching(cluster) as zk:
        zk.wait_for(paths.state(JOB), lambda s: s["state"] == "RUNNING")
        zk.wait_for(f"{paths.checkpoints(JOB)}/completed", lambda c: c["attempt"] == 1)
    killed_at = time.time()
    os.kill(cluster.pids["zookeeper"], signal.SIGKILL)
    assert wait_for_exit(cluster.pids["zookeeper"])
    job.release()  # the data plane goes on without ZooKeeper
    cluster.restart_zookeeper()
    back_at = time.time()
    with watching(cluster) as zk:
        finished = zk.wait_for(paths.state(JOB), lambda s: s["state"] in ("FINISHED", "FAILED", "KILLED"))
        status = zk.status(JOB)
        completed = zk.data(f"{paths.checkpoints(JOB)}/completed")
    figures(
        f"row 4 ZooKeeper SIGKILL + restart: down {back_at - killed_at:.2f} s; job {finished['state']} "
        f"(attempt {finished['attempt']}) {finished['ended'] - back_at:.2f} s after the restart"
    )
    assert finished["state"] == "FINISHED"
    assert totals(collected(status)["totals"]) == expected_totals()
    assert (completed["attempt"], completed["finished"]) == (status["attempt"], True)  # the final checkpoint
    if status["attempt"] == 1:  # the workers' sessions and heartbeats outlived the outage: nothing was rerun
        assert finished["reason"] == "every worker finished (2)"
    else:  # a worker's heartbeat went stale while it reconnected: rerun from the checkpoint taken before
        assert status["attempt"] >= 2
        assert all(report["restored_from"] is not None for report in status["done"].values())


def read_until(stream: IO[str], texts: tuple[str, ...], seconds: float) -> list[str]:
    """Lines of ``stream`` up to the first that contains one of ``texts`` (``seconds``: a safety net)."""
    lines: list[str] = []
    deadline = time.monotonic() + seconds
    while not lines or not any(text in lines[-1] for text in texts):
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no line with one of {texts} within {seconds} s: {lines}"
        line = stream.readline()
        assert line, f"the stream ended before a line with one of {texts}: {lines}"
        lines.append(line)
    return lines


def test_a_waiting_submit_rides_out_a_zookeeper_pause(new_cluster: Callable[..., LocalCluster], tmp_path: Any) -> None:
    """SIGSTOP ZooKeeper while ``submit`` waits for a job, until the submit's ZooKeeper client has given up
    its connection (no answer to its heartbeat; kazoo says so on stderr), then SIGCONT: the job finishes,
    and ``submit`` should report it (exit 0, exact totals) as it does without the pause."""
    cluster = new_cluster(own_zookeeper=True)
    job = GatedJob(tmp_path).write()
    submit = cluster.submit(job.file, JOB)
    with watching(cluster) as zk:
        zk.wait_for(paths.state(JOB), lambda s: s["state"] == "RUNNING")
    zookeeper = cluster.pids["zookeeper"]
    os.kill(zookeeper, signal.SIGSTOP)
    try:
        assert submit.process.stderr is not None
        # kazoo's warning when the connection goes: "Connection time-out: ..." or "Connection dropped: ..."
        before = read_until(submit.process.stderr, ("Connection time-out", "Connection dropped"), seconds=30)
    finally:
        os.kill(zookeeper, signal.SIGCONT)
    job.release()
    submit.finish()
    submit.err = "".join(before) + submit.err
    assert submit.code == 0, submit.err
    assert totals(submit.collected()["totals"]) == expected_totals()


FLOOD = """
import encodings.idna, os, socket, sys  # idna now: after setuid this user cannot read the interpreter's files
host, port, count, user = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if user >= 0:
    os.setuid(user)  # another local user from here on (this interpreter is started by the test's, then drops it)
held = []
for _ in range(count):  # idle: they never say a word (one the server turns away is simply not held)
    try:
        held.append(socket.create_connection((host, port), timeout=10))
    except OSError:
        pass
print("ready", flush=True)
sys.stdin.read()  # until the test closes it (or kills this process by its PID)
"""


def test_idle_connections_from_another_local_user_lock_no_one_out(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any
) -> None:
    """User nobody opens 100 idle connections to the cluster's ZooKeeper, all from 127.0.0.1 like every process
    of the cluster (ZooKeeper's default is 60 per address: then `streamlet jobs` timed out). The masters and
    workers keep their sessions (the same leader epoch, the same worker processes registered), `jobs` answers and
    a job submitted meanwhile finishes exact."""
    cluster = new_cluster(own_zookeeper=True)
    host, port = cluster.zk.rsplit(":", 1)
    with watching(cluster) as zk:
        leader_before = zk.data(paths.LEADER)
        boots = {worker: zk.data(paths.worker(worker))["boot"] for worker in ("worker-0", "worker-1")}
    nobody = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else -1  # not root: as this user, still 127.0.0.1
    flood = cluster.adopt(subprocess.Popen(
        [sys.executable, "-c", FLOOD, host, port, "100", str(nobody)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    ))  # fmt: skip
    assert flood.stdout is not None
    assert flood.stdout.readline() == "ready\n"
    try:
        listed = cluster.run("jobs", timeout=60)
        assert listed.returncode == 0, listed.stderr
        job = GatedJob(tmp_path).write()
        job.release()  # no need to hold it: it runs through
        submit = cluster.submit(job.file, JOB).finish(120)
        assert submit.code == 0, submit.err
        assert totals(submit.collected()["totals"]) == expected_totals()
        with watching(cluster) as zk:
            assert {worker: zk.data(paths.worker(worker))["boot"] for worker in boots} == boots
            assert zk.data(paths.LEADER) == leader_before
    finally:
        assert flood.stdin is not None
        flood.stdin.close()
        flood.wait(timeout=30)
