"""The seeded simulation of the whole cluster: 100 runs under random faults break no rule, a seed replays event
for event (in two interpreters too), nothing on the path reads the wall clock or unseeded randomness, and the
checker catches each guarantee switched off."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest

import streamlet as sl
from streamlet.backends.cluster.simulated import cluster as simulated
from streamlet.backends.cluster.tree import election
from streamlet.core.state import undo
from streamlet.testing.chaos import KINDS, WORKLOADS, check, run_once
from streamlet.testing.chaos.runner import RunResult, expected_output

ROOT = Path(__file__).resolve().parents[2]
CI_SEEDS = range(0, 60)  # every fault kind is drawn within them (make chaos runs 5 000)
# Seeds of CI_SEEDS the simulation found a bug with that is not fixed yet, and the rule each breaks: listed in
# the note, kept here so that a fix shows (the test then asks for the seed to be taken off the list).
KNOWN_OPEN: dict[int, str] = {}


def chaos(*args: str, hash_seed: str | None = None, timeout: float = 220) -> tuple[int, dict[str, Any], str]:
    """``python -m streamlet.testing.chaos ARGS --json``: exit status, the last line's JSON, all output."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed} if hash_seed is not None else dict(os.environ)
    done = subprocess.run(
        [sys.executable, "-m", "streamlet.testing.chaos", *args, "--json"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    return done.returncode, json.loads(lines[-1]), done.stdout


@pytest.mark.timeout(300)
def test_sixty_seeded_runs_break_no_rule() -> None:
    """Every run injects at least 3 faults into 10 000 records; together they draw every kind; the committed
    output equals the in-process run's, every state move is legal, one leader writes per epoch, and every job
    ends once the faults heal. Within 3 minutes on 2 cores."""
    began = time.monotonic()
    code, summary, output = chaos("--seed", str(CI_SEEDS[0]), "--runs", str(len(CI_SEEDS)), "--jobs", "2")
    seconds = time.monotonic() - began
    assert summary["runs"] == len(CI_SEEDS)
    assert sorted(summary["seeds_failed"]) == sorted(KNOWN_OPEN), output[-4000:]
    assert code == (1 if KNOWN_OPEN else 0)
    assert summary["faults_injected"] >= 3 * len(CI_SEEDS)
    assert summary["fault_kinds"] == sorted(KINDS)
    assert summary["records"] == 10_000 * len(CI_SEEDS)
    assert len(set(summary["trace_hashes"].values())) == len(CI_SEEDS)  # every seed its own run
    for seed, rule in KNOWN_OPEN.items():
        assert rule in output, f"seed {seed} no longer breaks '{rule}': take it off KNOWN_OPEN"
    assert seconds < 180, f"{seconds:.0f} s for {len(CI_SEEDS)} runs"


def test_a_seed_replays_event_for_event_in_another_interpreter() -> None:
    """The same seed gives the same trace hash in this process, twice, and in two interpreters whose string
    hashing differs (PYTHONHASHSEED 1 and 2)."""
    workload = WORKLOADS["rescale"]
    here = [run_once(42, workload).trace_hash for _ in range(2)]
    there = [chaos("--seed", "42", "--runs", "1", "--workload", "rescale", hash_seed=h)[1] for h in ("1", "2")]
    assert here[0] == here[1] == there[0]["trace_hashes"]["42"] == there[1]["trace_hashes"]["42"]
    assert run_once(43, workload).trace_hash != here[0]


FORBIDDEN: dict[str, Callable[[Any], bool]] = {
    "time.time": lambda f: f is time.time,
    "time.time_ns": lambda f: f is time.time_ns,
    "time.monotonic": lambda f: f is time.monotonic,
    "time.monotonic_ns": lambda f: f is time.monotonic_ns,
    "time.perf_counter": lambda f: f is time.perf_counter,
    "os.urandom": lambda f: f is os.urandom,
    "random (the shared generator)": lambda f: getattr(f, "__self__", None) is random._inst,  # type: ignore[attr-defined]
}


# hypothesis's garbage-collection hook (timing its own runs) fires inside whatever frame triggers a collection
TOOLING = str(Path(hypothesis.__file__).parent)


@contextlib.contextmanager
def tripwire() -> Iterator[list[str]]:
    """While the test runs: every call of a wall clock or of unseeded randomness from streamlet's code (or a
    topology's), with the line that made it."""
    package = str(ROOT / "streamlet")
    calls: list[str] = []

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event != "c_call" or frame.f_code.co_filename.startswith(TOOLING):
            return
        for name, matches in FORBIDDEN.items():
            if matches(arg) and on_streamlets_path(frame):
                calls.append(f"{name} from {frame.f_code.co_filename}:{frame.f_lineno}")

    def on_streamlets_path(frame: Any) -> bool:
        while frame is not None:
            if frame.f_code.co_filename.startswith(package):
                return True
            frame = frame.f_back
        return False

    sys.setprofile(watch)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def test_nothing_on_the_path_reads_a_wall_clock_or_unseeded_randomness() -> None:
    """A whole run (leader, workers, checkpoints, a live change, faults) under a profile hook: no call of
    time.time/monotonic/perf_counter, os.urandom or the shared random generator from streamlet's code."""
    workload = WORKLOADS["rescale"]
    expected = expected_output(workload)  # in-process, outside the simulation: the real world is fine there
    with tripwire() as calls:
        result = run_once(11, workload, expected=expected)
    assert result.violations == []
    assert calls == []


def test_the_tripwire_sees_a_topology_that_reads_the_clock() -> None:
    """The same hook catches a map that reads time.time() (so the test above can fail)."""

    def build() -> sl.Topology:
        topology = sl.Topology("clocked")
        numbers = topology.add_source("numbers", [])
        stamped = topology.map("stamp", lambda r: (r.key, (r.value, time.time() > 0)))
        topology.add_sink("out", sl.CollectSink()).set_input(stamped.set_input(numbers))
        return topology

    workload = simulated_workload(build, {"numbers": list(range(200))})
    expected = expected_output(workload)
    with tripwire() as calls:
        run_once(1, workload, expected=expected, faults=[])
    assert calls
    assert all(call.startswith("time.time from ") for call in calls)
    assert any(call.startswith(f"time.time from {__file__}:") for call in calls)


def simulated_workload(build: Callable[[], sl.Topology], inputs: dict[str, list[Any]]) -> Any:
    from streamlet.testing.chaos.workloads import Workload

    return Workload(build().name, build, inputs, checkpoint_interval=None)


# -- each guarantee switched off, the checker catches it within the CI seeds ---------------------------------


def runs(seeds: range, workload: str, **options: Any) -> list[RunResult]:
    expected = expected_output(WORKLOADS[workload])  # with every guarantee on
    return [run_once(seed, WORKLOADS[workload], expected=expected, **options) for seed in seeds]


def test_without_the_sinks_idempotent_publish_a_record_is_committed_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """ExactlyOnceSink publishes an epoch once (a restore may publish what the run cut short staged). Publish
    again whatever is asked (the staged records kept, a new entry each time): after a crash the checker finds
    records committed twice."""

    def publish_every_time(self: Any, attempt: str, epoch: int) -> None:
        staged = self.book.staged.get((attempt, self.sink, self.index, epoch))
        if staged is not None:
            entries = sum(1 for key in self.book.published if key[:2] == (self.sink, self.index))
            self.book.published[self.sink, self.index, epoch * 1000 + entries] = list(staged)

    monkeypatch.setattr(simulated._ExactlyOnceWriter, "_publish", publish_every_time)
    found = runs(CI_SEEDS[:10], "counts", kinds=("kill", "crash-commit"))
    doubled = [r.seed for r in found if any("committed 2 times, in-process 1" in v for v in r.violations)]
    assert doubled, [r.violations[:1] for r in found]


def test_without_the_epoch_fence_a_deposed_leader_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every leader write checks /epoch (LeaderFence). Without it, a master stopped in the middle of a write
    for longer than its session (a pause-commit: a zombie) has that write land in the next leader's epoch when
    it goes on: the checker names the master, the path and the epoch."""

    async def unfenced(self: Any, ops: Any) -> bool:
        return bool(await self.store.commit(list(ops)))

    monkeypatch.setattr(election.LeaderFence, "commit", unfenced)
    found = runs(CI_SEEDS[10:20], "counts", kinds=("pause-commit",))
    deposed = [r.seed for r in found if any(" wrote /jobs/chaos/" in v and ", led by " in v for v in r.violations)]
    assert deposed, [r.violations[:1] for r in found]


def test_without_the_undo_of_a_failed_record_its_state_write_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poison record fails after its state write and the skip policy drops it: the write is taken back.
    Keep it instead, and the next count of that key is one too high: committed output differs."""
    monkeypatch.setattr(undo.CallUndo, "take_back", lambda self: self.forget())
    found = runs(CI_SEEDS[:3], "poison", faults=[])
    assert all(any("committed 0 times, in-process 1" in v for v in r.violations) for r in found)


def test_check_runs_a_users_topology_and_refuses_one_that_is_not_deterministic() -> None:
    """check() on a user's topology: the seeds' runs, each FINISHED and clean; a topology whose output differs
    between two in-process runs is refused, naming the sink and the first difference."""

    def totals() -> sl.Topology:
        topology = sl.Topology("totals")
        orders = topology.add_source("orders", [])
        total = topology.reduce("total", lambda a, b: a + b, emit="record", parallelism=2)
        topology.add_sink("out", sl.CollectSink()).set_input(total.set_input(orders, partitioning=sl.SAME_KEY))
        return topology

    report = check(totals, {"orders": [sl.Record(f"c{n % 5}", n, float(n)) for n in range(1500)]}, seed=7, runs=3)
    assert report.ok, report.describe()
    assert [r.seed for r in report.results] == [7, 8, 9]
    assert all(r.state == "FINISHED" and len(r.faults) >= 3 for r in report.results)

    draws = iter(range(10**6))

    def jittery() -> sl.Topology:
        topology = sl.Topology("jittery")
        numbers = topology.add_source("numbers", [])
        topology.add_sink("out", sl.CollectSink()).set_input(
            topology.map("tag", lambda r: (r.key, next(draws))).set_input(numbers)
        )
        return topology

    with pytest.raises(sl.TopologyError, match=r"^topology 'jittery' gives different output in two in-process runs"):
        check(jittery, {"numbers": [1, 2, 3]}, runs=1)
