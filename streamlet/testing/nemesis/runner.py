"""The nemesis: the simulation's fault schedules and checker, against real processes on test hosts.

One run: a cluster of three ZooKeeper members, two masters and three workers,
each on a host of its own (:mod:`.hosts`, :mod:`.cluster`), runs the running
counts of :mod:`.workload` while the faults of a seeded schedule
(:func:`~streamlet.testing.chaos.faults.schedule`) happen to them in real
time: SIGKILL (and a restart), a lost disk, SIGSTOP/SIGCONT, a partition
between two processes, a process cut from ZooKeeper or from everyone, a
ZooKeeper member killed, each healed after its span. Then everything heals,
and the checker says what went wrong:

- the committed output against a plain count (none lost, none twice; a job
  that FAILED or STALLED may have committed less, never more);
- every move of the job's state that the lifecycle does not allow (between
  consecutive versions of its node);
- a job neither FINISHED within ``bound`` seconds of the last heal nor
  FAILED/STALLED with a reason a user can act on (a STALLED job is judged as
  it stands at the bound: a holder of its checkpoint may still come back;
  with ``stalled_ends``, as soon as it stalls and every master campaigns
  again, for a schedule known to lose both copies of a checkpoint);
- a master, worker or ZooKeeper member that exited on its own (every process
  killed was started again before the last heal).
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.testing.chaos import checker
from streamlet.testing.chaos.faults import REAL_KINDS, Fault, schedule
from streamlet.testing.nemesis import workload
from streamlet.testing.nemesis.cluster import HostCluster
from streamlet.testing.nemesis.hosts import HostNetwork
from streamlet.testing.zk_watch import ZkWatch

KINDS = ("kill", "disk", "pause", "partition", "isolate", *REAL_KINDS)  # what real processes can be made to suffer
MASTERS = ("master-0", "master-1")
WORKERS = ("worker-0", "worker-1", "worker-2")
ENDED = ("FINISHED", "FAILED", "KILLED")
BOUND = 120.0  # seconds after the last heal by which the job has ended (or says why it cannot)


@dataclass
class NemesisRun:
    """What one seed's run did and what the checker found."""

    seed: int
    faults: list[Fault]
    state: str = ""
    reason: str = ""
    attempts: int = 0
    committed: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    def to_data(self) -> dict[str, Any]:
        """As JSON (a line of the command's report)."""
        return {
            "seed": self.seed, "state": self.state, "attempts": self.attempts, "committed": self.committed,
            "seconds": round(self.seconds, 1), "violations": self.violations, "reason": self.reason,
            "faults": [fault.to_data() for fault in self.faults],
        }  # fmt: skip


def draw(seed: int, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """The seed's schedule over this cluster's processes."""
    members = [f"zookeeper-{n}" for n in (1, 2, 3)]
    return schedule(seed, MASTERS, WORKERS, kinds=kinds, zookeepers=members)


def run_seed(
    seed: int, directory: Path, faults: list[Fault] | None = None, bound: float = BOUND, stalled_ends: bool = False
) -> NemesisRun:
    """One run in ``directory`` (its cluster's files, the job's output), under ``faults`` (default: the seed's).
    ``stalled_ends``: judge a STALLED job once every master campaigns again rather than at the bound."""
    began = time.monotonic()
    run = NemesisRun(seed, draw(seed) if faults is None else faults)
    with HostNetwork() as network:
        cluster = HostCluster(network, directory / ".streamlet", masters=len(MASTERS), workers=len(WORKERS))
        cluster.start()
        try:
            _drive(cluster, network, directory, run, bound, stalled_ends)
        finally:
            left = cluster.stop()
            if left:
                run.violations.append(f"processes still running after the stop: {left}")
    run.seconds = time.monotonic() - began
    return run


def _drive(
    cluster: HostCluster, network: HostNetwork, directory: Path, run: NemesisRun, bound: float, stalled_ends: bool
) -> None:
    output = directory / "out"
    job = workload.write_job(directory, output)
    submit = [sys.executable, "-m", "streamlet.cli", "submit", str(job), "--job", workload.JOB]
    submitted = subprocess.run(
        [*submit, "--checkpoint-interval", "0.5", "--no-wait"], cwd=directory, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    if submitted.returncode != 0:
        raise RuntimeError(f"submit failed: {submitted.stderr}")
    with cluster.watch() as zk:
        states = zk.follow(paths.state(workload.JOB))
        zk.wait_for(paths.state(workload.JOB), lambda s: s["state"] == "RUNNING")
        healed_at = Nemesis(cluster, network).play(run.faults)
        ended_at: float | None = None
        ends = (*ENDED, "STALLED") if stalled_ends else ENDED
        try:  # STALLED is no end: a holder of its checkpoint may come back; judged as it stands at the bound
            final = zk.wait_for(paths.state(workload.JOB), lambda s: s["state"] in ends, seconds=bound)
            ended_at = time.monotonic() if final["state"] in ENDED else None
        except TimeoutError:
            final = zk.data(paths.state(workload.JOB))
        if stalled_ends:  # judged early: what a master's death would show by the bound must show now
            run.violations += _masters_campaign(zk, max(1.0, healed_at + bound - time.monotonic()))
        run.state, run.reason, run.attempts = final["state"], final["reason"], int(final["attempt"])
        versions = zip(states.versions(), states.data(), strict=True)
        seen = [(version, data["state"]) for version, data in versions if data]
    for (before, one), (after, other) in itertools.pairwise(seen):  # a watch may skip versions: judge only
        if before is not None and after == before + 1:  # the moves it saw whole
            run.violations += checker.illegal_job_moves([one, other])
    run.violations += checker.liveness((run.state, run.reason), healed_at, ended_at, bound)
    for process_id, process in sorted(cluster.processes.items()):  # every one was running when all healed
        if process.poll() is not None:
            run.violations.append(f"{process_id} exited on its own (code {process.returncode}): see its log")
    got = workload.committed(output)
    run.committed = len(got["out"])
    run.violations += checker.compare_outputs(workload.expected(), got, finished=run.state == "FINISHED")


def _masters_campaign(zk: ZkWatch, seconds: float) -> list[str]:
    """Nothing when every master is a candidate for leadership within ``seconds``; else who is not."""
    try:
        zk.wait_for_children(paths.CANDIDATES, lambda found: _campaigning(found) >= set(MASTERS), seconds)
    except TimeoutError:
        found = {path: data for path, (data, _version) in zk.tree(paths.CANDIDATES).items()}
        missing = set(MASTERS) - _campaigning(found)
        return [f"{name} does not campaign for leadership {seconds:.0f} s on" for name in sorted(missing)]
    return []


def _campaigning(nodes: dict[str, Any]) -> set[str]:
    return {data["name"] for data in nodes.values() if isinstance(data, dict) and "name" in data}


@dataclass
class Nemesis:
    """Plays a schedule on a :class:`HostCluster` in real time, from the moment :meth:`play` is called."""

    cluster: HostCluster
    network: HostNetwork
    dead: set[str] = field(default_factory=set)

    def play(self, faults: list[Fault]) -> float:
        """Each fault at its moment, each undone after its span; then heal everything. When it all healed
        (``time.monotonic()``)."""
        start = time.monotonic()
        steps = sorted(
            [(fault.at, 0, index, fault) for index, fault in enumerate(faults)]
            + [(fault.at + fault.lasts, 1, index, fault) for index, fault in enumerate(faults)]
        )
        for at, ending, _index, fault in steps:
            time.sleep(max(0.0, start + at - time.monotonic()))  # a schedule in real time: its moments, not waits
            (self._end if ending else self._begin)(fault)
        self.network.heal_all()
        for process_id in list(self.cluster.processes):
            self.cluster.resume(process_id)
        for process_id in sorted(self.dead):
            self.cluster.restart(process_id)
        self.dead.clear()
        return time.monotonic()

    def _begin(self, fault: Fault) -> None:
        target = fault.target
        if fault.kind in ("kill", "disk", "zookeeper"):
            self.cluster.kill(target)
            self.dead.add(target)
            if fault.kind == "disk":
                shutil.rmtree(self.cluster.state_dir / target, ignore_errors=True)
        elif fault.kind == "pause":
            self.cluster.pause(target)
        else:
            for other in self._cut_from(fault):
                self.network.cut(target, other)

    def _end(self, fault: Fault) -> None:
        target = fault.target
        if fault.kind in ("kill", "disk", "zookeeper"):
            if target in self.dead:
                self.cluster.restart(target)
                self.dead.discard(target)
        elif fault.kind == "pause":
            self.cluster.resume(target)
        else:
            for other in self._cut_from(fault):
                self.network.heal(target, other)

    def _cut_from(self, fault: Fault) -> list[str]:
        if fault.kind == "partition":
            assert fault.other is not None
            return [fault.other]
        if fault.kind == "isolate":
            return [member.name for member in self.cluster.members]
        return [name for name in self.network.hosts if name != fault.target] + ["here"]  # cut-off
