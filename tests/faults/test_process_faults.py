"""The cluster's fault matrix, processes: a worker killed, a leader killed, a leader stopped past its session,
every worker lost. Real processes (``cluster up`` on the session's ZooKeeper), one cluster per test since
each breaks it; every PID is stopped at the end and checked gone.

The job is the gated keyed count (``tests/support/faults.py``): it holds after 30 000 of its 40 000 words
until the test releases it, so each fault lands while the job provably runs. Its totals must equal a plain
count of the words: no record lost or counted twice.

Checkpoints live on the workers' own disks (``.streamlet/<worker>/``, each instance's state replicated to the
other worker): when every worker is lost, a worker that comes back with its disk resumes the job, while a
new worker with an empty one cannot, and the job fails rather than resume without its state.

Not here: a zombie worker holding a FileSink and a graceful SIGTERM (issue 11 items 4/5, in
tests/integration/test_cluster_failover.py), a full disk (tests/faults/test_disk_full.py), cycles running on
the cluster (item 7).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.worker.replica_service import instances_of
from streamlet.core.state.store import decode
from streamlet.testing.zk_watch import NodeHistory, ZkWatch
from tests.support.cluster import wait_for_exit
from tests.support.faults import (
    GATED_STREAM,
    STREAMED,
    GatedJob,
    LocalCluster,
    Submission,
    expected_totals,
    totals,
    watching,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration]

JOB = "gated"
FINISHED_ON_ONE = "job 'gated' FINISHED on {}: every worker finished (1)"
FINISHED_ON_TWO = "job 'gated' FINISHED on worker-0, worker-1: every worker finished (2)"


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_worker_sigkill_mid_job_recovers_from_the_checkpoint_with_exact_totals(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any, figures: Callable[[str], None], backend: str
) -> None:
    """SIGKILL a worker of a checkpointed job: RECOVERING, attempt 2 on the survivor restored from the last
    completed checkpoint, FINISHED with exact totals; the same with the count's state in RocksDB on each
    worker's disk. Measured: kill -> RECOVERING, kill -> FINISHED."""
    cluster = new_cluster()
    job = GatedJob(tmp_path).write()
    submit = cluster.submit(job.file, JOB, "--checkpoint-interval", "0.2", "--state-backend", backend)
    with watching(cluster) as zk:
        states = zk.follow(paths.state(JOB))
        states.wait_for(lambda s: s["state"] == "RUNNING")
        before = zk.wait_for(f"{paths.checkpoints(JOB)}/completed", lambda c: c["attempt"] == 1)
        assert before["workers"] == ["worker-0", "worker-1"]
        # <worker dir>/rocksdb/<job>.<attempt>/<cluster>.<job>/<node>/<instance>.<opening>.state: the count's
        folders = sorted(path.parent.parts[-4:] for path in cluster.state_dir.rglob("rocksdb/**/CURRENT"))
        databases = [(*parts[:3], parts[3].split(".")[0], parts[3].split(".")[-1]) for parts in folders]
        assert databases == ([] if backend == "memory" else [
            (f"{JOB}.1", f"{cluster.name}.{JOB}", "count", str(i), "state") for i in (0, 1)
        ])  # fmt: skip
        victim = cluster.pids["worker-1"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        job.release()
        recovering = states.wait_for(lambda s: s["state"] == "RECOVERING")
        finished = states.wait_for(lambda s: s["state"] == "FINISHED")
        report = zk.data(f"{paths.done(JOB, 2)}/worker-0")
        assignment = zk.data(paths.assignment(JOB))
    submit.finish()
    assert submit.code == 0, submit.err
    assert submit.out.splitlines()[0] == FINISHED_ON_ONE.format("worker-0")
    assert totals(submit.collected()["totals"]) == expected_totals()
    assert recovering["reason"] == "attempt 2: lost worker-1"
    assert (assignment["attempt"], set(assignment["instances"].values())) == (2, {"worker-0"})
    assert report["restored_from"] is not None
    assert report["restored_from"] >= before["epoch"]
    assert 0 < report["statistics"]["nodes"]["words"]["records_in"] < 40_000  # only the rest was replayed
    assert wait_for_exit(victim)
    to_recovering, to_finished = recovering["at"] - killed_at, finished["ended"] - killed_at
    figures(
        f"row 1 worker SIGKILL ({backend}): kill -> RECOVERING {to_recovering:.2f} s, "
        f"kill -> FINISHED {to_finished:.2f} s"
    )
    assert 0 < to_recovering < to_finished < 30


def leader_of(cluster: LocalCluster, zk: Any) -> tuple[str, int, int]:
    """The leading master's id, its PID (from .streamlet/cluster.json, checked against /leader) and epoch."""
    lead = zk.data(paths.leader())
    assert lead["pid"] == cluster.pids[lead["name"]]
    return lead["name"], cluster.pids[lead["name"]], int(lead["epoch"])


def test_what_a_collect_sink_gathered_before_a_failover_comes_back_with_the_checkpoint(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any
) -> None:
    """The gate streams every word to a CollectSink of two instances. After attempt 1's 2nd checkpoint, SIGKILL
    the worker running seen.0: attempt 2 takes seen.0's collected words back from the checkpoint (the replica on
    the survivor), and ``submit --results`` holds each word exactly as often as it went by. (Before, it held
    only what attempt 2 collected after its restore point, and said nothing: 12 000 of 20 000 in the audit.)"""
    cluster = new_cluster()
    job = GatedJob(tmp_path).write(GATED_STREAM)
    submit = cluster.submit(job.file, JOB, "--checkpoint-interval", "0.2")
    with watching(cluster) as zk:
        states = zk.follow(paths.state(JOB))
        states.wait_for(lambda s: s["state"] == "RUNNING")
        zk.wait_for(f"{paths.checkpoints(JOB)}/completed", lambda c: c["attempt"] == 1 and c["epoch"] >= 2)
        holder = zk.data(paths.assignment(JOB))["instances"]["seen.0"]
        os.kill(cluster.pids[holder], signal.SIGKILL)
        job.release()
        finished = states.wait_for(lambda s: s["state"] in ("FINISHED", "FAILED"))
    submit.finish()
    assert submit.code == 0, submit.err
    assert (finished["state"], finished["attempt"]) == ("FINISHED", 2), finished
    seen = submit.collected()["seen"]
    assert ({value for _key, value, _ts in seen}, len(seen)) == ({1}, len(STREAMED))
    assert Counter(key for key, _value, _ts in seen) == Counter(STREAMED)


def test_leader_sigkill_mid_job_hands_over_to_a_new_epoch_without_a_second_assignment(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any, figures: Callable[[str], None]
) -> None:
    """Two masters; SIGKILL the leader while the job runs. The other master leads with a higher epoch, follows
    the running job to FINISHED (exact totals) and never rewrites its assignment (written once, attempt 1)."""
    cluster = new_cluster(masters=2)
    job = GatedJob(tmp_path).write()
    submit = cluster.submit(job.file, JOB)
    with watching(cluster) as zk:
        states = zk.follow(paths.state(JOB))
        states.wait_for(lambda s: s["state"] == "RUNNING")
        name, pid, epoch = leader_of(cluster, zk)
        assignment_before = zk.get(paths.assignment(JOB))
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        new_leader = zk.wait_for(paths.leader(), lambda lead: lead["epoch"] > epoch)
        elected_at = time.time()
        job.release()  # the new leader takes over a job that still runs
        finished = states.wait_for(lambda s: s["state"] == "FINISHED")
        assignment_after = zk.get(paths.assignment(JOB))
        state_versions = states.versions()
    submit.finish()
    assert submit.code == 0, submit.err
    assert submit.out.splitlines()[0] == FINISHED_ON_TWO
    assert totals(submit.collected()["totals"]) == expected_totals()
    survivor = ({"master-0", "master-1"} - {name}).pop()
    assert (new_leader["name"], new_leader["pid"]) == (survivor, cluster.pids[survivor])
    assert assignment_before is not None
    assert assignment_after == assignment_before  # the same data, at version 0
    assert (assignment_after[0]["attempt"], assignment_after[0]["epoch"], assignment_after[1]) == (1, epoch, 0)
    assert finished["attempt"] == 1
    assert state_versions[-1] == 3  # SUBMITTED, SCHEDULED, RUNNING, FINISHED: no other write
    assert wait_for_exit(pid)
    figures(f"row 2 leader SIGKILL: kill -> new leader (epoch {new_leader['epoch']}) {elected_at - killed_at:.2f} s")


def test_a_leader_stopped_past_its_session_writes_nothing_stale_when_it_wakes(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any, figures: Callable[[str], None]
) -> None:
    """Two masters; SIGSTOP the leader while the job runs. The other master takes over (higher epoch); the old
    one is woken (SIGCONT) while the job still runs, with a running job in what it last read: it finds its
    session gone and campaigns again, writing nothing (every write of a leader checks /epoch). Only then does
    the job end: the state keeps the new leader's single write since the stop (FINISHED), the assignment its
    one version, /leader and /epoch the new epoch."""
    cluster = new_cluster(masters=2)
    job = GatedJob(tmp_path).write()
    submit = cluster.submit(job.file, JOB)
    with watching(cluster) as zk:
        states = zk.follow(paths.state(JOB))
        running = states.wait_for(lambda s: s["state"] == "RUNNING")
        _, pid, epoch = leader_of(cluster, zk)
        stopped_at = time.time()
        os.kill(pid, signal.SIGSTOP)
        new_leader = zk.wait_for(paths.leader(), lambda lead: lead["epoch"] > epoch)
        os.kill(pid, signal.SIGCONT)  # the job is still held at its gate: the old leader wakes while it runs
        woke_at = time.time()
        # the old leader has noticed: its lost session took its candidate node, and it registers a new one
        zk.wait_for_children("/candidates", lambda found: pid in {c["pid"] for c in found.values()})
        campaigning_at = time.time()
        still = zk.get(paths.state(JOB))
        job.release()  # the job ends under the new leader
        states.wait_for(lambda s: s["state"] == "FINISHED")
        after_stop = [data for data in states.data() if data is not None and data["at"] > stopped_at]
        seen = list(zip(states.versions(), states.data(), strict=True))
        assignment = zk.get(paths.assignment(JOB))
        state = zk.get(paths.state(JOB))
        lead, counter = zk.data(paths.leader()), zk.data(paths.epoch())
    submit.finish()
    assert submit.code == 0, submit.err
    assert submit.out.splitlines()[0] == FINISHED_ON_TWO
    assert totals(submit.collected()["totals"]) == expected_totals()
    assert still is not None
    assert (still[0]["state"], still[1]) == ("RUNNING", 2)  # the old leader woke to a running job, and wrote nothing
    assert [data["state"] for data in after_stop] == ["FINISHED"]  # one write since the stop: the new leader's
    assert state is not None
    assert (state[1], state[0]) == seen[-1]
    assert (state[1], running["attempt"]) == (3, 1)
    assert assignment is not None
    assert (assignment[1], assignment[0]["epoch"]) == (0, epoch)
    assert lead == new_leader
    assert counter == {"epoch": new_leader["epoch"]}
    figures(
        f"row 3 leader SIGSTOP: stop -> new leader (epoch {new_leader['epoch']}) {woke_at - stopped_at:.2f} s; "
        f"SIGCONT (job running) -> old leader campaigning again {campaigning_at - woke_at:.2f} s"
    )


@dataclass
class LostWorkers:
    """A job whose workers were all SIGKILLed: what :func:`lose_every_worker` saw."""

    submit: Submission
    states: NodeHistory
    assignments: NodeHistory
    victims: list[int]
    killed_at: float
    stalled: dict[str, Any]
    stalled_assignment: dict[str, Any]
    completed: dict[str, Any]  # the last completed checkpoint's record

    def check_stalled(self) -> None:
        """The STALLED reason names lost workers of the attempt it stalls, and says no live worker is left.

        Which of the two it names is the order a busy machine notices them in, not a fact: their heartbeats go
        stale up to a beat apart, so the leader may see one lost (and only that one named) and find the other
        gone too when it places the next attempt, or first move the job onto the other, dead, worker and stall
        when that one is lost; or, stalled once, try again while one still looked live a moment longer ("a
        worker can take it again") and stall on placing it, which is the STALLED a busy watch may see first.
        The facts: only workers of the stalled attempt are named, and when it stalled none was live ("no live
        worker"); both processes are gone."""
        pattern = r"(?:lost (\S.*)|a worker can take it again); no live worker can take it: no live worker"
        found = re.fullmatch(pattern, self.stalled["reason"])
        assert found is not None, self.stalled["reason"]
        named = [] if found.group(1) is None else found.group(1).split(", ")
        assert named == sorted(set(named)), self.stalled["reason"]
        assert set(named) <= set(self.stalled_assignment["instances"].values()) <= {"worker-0", "worker-1"}
        for victim in self.victims:
            assert wait_for_exit(victim)


def lose_every_worker(cluster: LocalCluster, zk: ZkWatch, job: GatedJob) -> LostWorkers:
    """Submit the gated count with checkpoints, SIGKILL both workers once two checkpoints completed (the last
    one's record keeps the one before it), release the gate and wait until the job is STALLED (no live worker)."""
    submit = cluster.submit(job.file, JOB, "--checkpoint-interval", "0.2")
    states = zk.follow(paths.state(JOB))
    assignments = zk.follow(paths.assignment(JOB))
    states.wait_for(lambda s: s["state"] == "RUNNING")
    zk.wait_for(f"{paths.checkpoints(JOB)}/completed", lambda c: c["attempt"] == 1 and c["epoch"] >= 2)
    victims = [cluster.pids["worker-0"], cluster.pids["worker-1"]]
    killed_at = time.time()
    for victim in victims:
        os.kill(victim, signal.SIGKILL)
    job.release()
    stalled = states.wait_for(lambda s: s["state"] == "STALLED")
    stalled_assignment = assignments.wait_for(lambda a: a["attempt"] == stalled["attempt"])
    completed = zk.data(f"{paths.checkpoints(JOB)}/completed")  # final: no worker is left to complete another
    return LostWorkers(submit, states, assignments, victims, killed_at, stalled, stalled_assignment, completed)


def checkpoint_instances(folder: Path, completed: dict[str, Any]) -> dict[str, set[str]]:
    """The instances whose state the worker folder ``folder`` holds at the completed checkpoint ``completed``:
    in its own part and in its replicas of the others' parts, by owner (every file checked against its
    checksum)."""
    epoch = int(completed["epoch"])
    name = f"checkpoint-{epoch:010d}.msgpack"
    [key] = [job.name for job in (folder / "checkpoints").iterdir()]  # the job's folders: '<job>.<uid>'
    assert key.startswith(f"{JOB}.")
    files = {folder.name: folder / "checkpoints" / key / f"attempt-{completed['attempt']}" / folder.name / name}
    files.update({owner.name: owner / name for owner in (folder / "replicas" / key).iterdir()})
    found: dict[str, set[str]] = {}
    for owner, path in files.items():
        document = decode(path.read_bytes(), str(path))
        assert document["epoch"] == epoch
        found[owner] = set(instances_of(document))
    return found


def test_all_workers_lost_stalls_the_job_until_one_comes_back_with_its_disk(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any, figures: Callable[[str], None]
) -> None:
    """SIGKILL both workers of a checkpointed job: STALLED, the reason naming lost workers. worker-0 starts
    again on its own folder (its machine came back with its disk): RECOVERING, it restores the last completed
    checkpoint from that disk alone (its part and its replica of worker-1's: nothing fetched), FINISHED with
    exact totals."""
    cluster = new_cluster()
    job = GatedJob(tmp_path).write()
    with watching(cluster) as zk:
        lost = lose_every_worker(cluster, zk, job)
        on_disk = checkpoint_instances(cluster.state_dir / "worker-0", lost.completed)
        joined_at = time.time()
        cluster.start_worker("worker-0")
        stalled = lost.stalled
        resumed = lost.states.wait_for(lambda s: s["state"] == "RECOVERING" and s["attempt"] > stalled["attempt"])
        finished = lost.states.wait_for(lambda s: s["state"] == "FINISHED")
        last = finished["attempt"]
        report = zk.data(f"{paths.done(JOB, last)}/worker-0")
        final = zk.data(paths.assignment(JOB))
        earlier = [a for a in lost.assignments.data() if a is not None and a["attempt"] < last]
        ran = {worker for assignment in earlier for worker in assignment["instances"].values()}
    submit = lost.submit.finish()
    assert submit.code == 0, submit.err
    assert submit.out.splitlines()[0] == FINISHED_ON_ONE.format("worker-0")
    assert totals(submit.collected()["totals"]) == expected_totals()
    lost.check_stalled()
    assert ran == {"worker-0", "worker-1"}
    assert resumed["reason"] == f"attempt {last}: a worker can take it again"
    assert set(final["instances"].values()) == {"worker-0"}
    # every instance's state is on both workers' disks (one replica, on the other worker): worker-0's has it all,
    # its own instances in its part and worker-1's in its replica of worker-1's part
    holders = lost.completed["holders"]
    assert {tuple(sorted(held)) for held in holders.values()} == {("worker-0", "worker-1")}
    assert on_disk == {
        owner: {instance for instance, held in holders.items() if held[0] == owner}
        for owner in ("worker-0", "worker-1")
    }
    assert (report["restored_from"], report["fetched_bytes"]) == (lost.completed["epoch"], 0)
    figures(
        f"row 5 all workers SIGKILL: kill -> STALLED {stalled['at'] - lost.killed_at:.2f} s; "
        f"worker-0 started again -> RECOVERING {resumed['at'] - joined_at:.2f} s, "
        f"-> FINISHED {finished['ended'] - joined_at:.2f} s"
    )


def test_all_workers_lost_and_a_new_worker_cannot_restore_so_the_job_waits_naming_the_checkpoint(
    new_cluster: Callable[..., LocalCluster], tmp_path: Any
) -> None:
    """SIGKILL both workers of a checkpointed job: STALLED. A new worker (worker-9, an empty folder) joins, but
    no live worker holds the state of the last completed checkpoint (each worker kept it on its own disk):
    the restore marks it unusable and the job is STALLED again, naming the checkpoint and its holders, and
    waits for one of them. It never resumes from the checkpoint before (its sinks may have committed the last
    one's output: that would commit it twice) nor from nothing; ``streamlet kill`` ends it."""
    cluster = new_cluster()
    job = GatedJob(tmp_path).write()
    with watching(cluster) as zk:
        lost = lose_every_worker(cluster, zk, job)
        cluster.start_worker("worker-9")
        first = lost.stalled["attempt"] + 1
        waiting = lost.states.wait_for(lambda s: s["state"] == "STALLED" and s["attempt"] == first)
        unusable = zk.children(paths.unusable(JOB))
        assert cluster.run("kill", JOB).returncode == 0
        lost.states.wait_for(lambda s: s["state"] == "KILLED")
        after = [s for s in lost.states.data() if s is not None and s["attempt"] > lost.stalled["attempt"]]
    submit = lost.submit.finish()
    assert submit.code == 1
    lost.check_stalled()
    epoch = lost.completed["epoch"]
    assert unusable == [str(epoch)]  # the last checkpoint only: the one before it is never tried
    reason = (
        f"checkpoint {epoch} has an instance with no intact copy on a live worker (worker-9) (held by worker-0, "
        "worker-1); waiting for a worker that holds it: resuming from an earlier checkpoint would commit its "
        "output twice"
    )
    assert waiting["reason"] == reason
    moves = [(s["state"], s["reason"]) for s in after if s["state"] != "RUNNING"]
    assert moves == [
        ("RECOVERING", f"attempt {first}: a worker can take it again"),
        ("STALLED", reason),
        ("KILLED", "killed by streamlet kill"),
    ]
