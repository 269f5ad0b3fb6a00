"""A cluster simulated in one process: jobs finish exactly, and survive workers killed where the test says.

The topologies here are module-level functions the harness hands to the
workers of this process as they are (a test's events and counters are the
job's). No test sleeps: the harness
runs the leader and the workers off the store's writes, and the waits are on
the job's states.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import streamlet as sl
from streamlet.backends.cluster.leader.leader import Leader
from streamlet.backends.cluster.simulated import targets as simulated_targets
from streamlet.backends.cluster.tree import paths
from streamlet.testing import ExactlyOnceSink, JobOutcome, Kill, KillAt, SimulatedCluster

WORDS = [f"w{index % 37}" for index in range(20_000)]
RUNNING_COUNTS = sorted((word, n) for word, total in Counter(WORDS).items() for n in range(1, total + 1))
PLACED = {  # capacity 3: the source side fills worker-0, the counting side goes to worker-1
    "words.0": "worker-0", "pass.0": "worker-0", "pass.1": "worker-0",
    "count.0": "worker-1", "count.1": "worker-1", "totals.0": "worker-1", "seen.0": "worker-0",
}  # fmt: skip


def wordcount() -> sl.Topology:
    """words -> pass (x2) -> running count per word (x2, SAME_KEY) -> an ExactlyOnceSink and a CollectSink."""
    topology = sl.Topology("wordcount")
    words = topology.add_source("words", [(word, 1) for word in WORDS])
    passed = topology.map("pass", lambda record: (record.key, record.value), parallelism=2).set_input(words)
    count = topology.reduce("count", lambda total, n: total + n, parallelism=2, emit="record")
    count.set_input(passed, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", ExactlyOnceSink()).set_input(count)
    topology.add_sink("seen", sl.CollectSink()).set_input(count)
    return topology


class Hold(sl.Task):
    """Passes batches on once the test opens ``gate``."""

    gate: ClassVar[asyncio.Event]

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await type(self).gate.wait()
        outputs.emit_batch(inputs.get())


def held() -> sl.Topology:
    """numbers -> hold (waits for the test) -> an ExactlyOnceSink."""
    topology = sl.Topology("held")
    numbers = topology.add_source("numbers", range(100))
    hold = topology.add_task("hold", Hold).set_input(numbers)
    topology.add_sink("out", ExactlyOnceSink()).set_input(hold)
    return topology


def small() -> sl.Topology:
    """Ten numbers, doubled, into a CollectSink."""
    topology = sl.Topology("small")
    numbers = topology.add_source("numbers", range(10))
    doubled = topology.map("double", lambda record: (None, 2 * record.value), parallelism=2).set_input(numbers)
    topology.add_sink("out", sl.CollectSink()).set_input(doubled)
    return topology


def boom() -> sl.Topology:
    """A map that fails on the first record."""
    topology = sl.Topology("boom")
    numbers = topology.add_source("numbers", [1])
    topology.add_sink("out", sl.CollectSink()).set_input(topology.map("fail", lambda record: 1 / 0).set_input(numbers))
    return topology


@pytest.fixture
def gate() -> Iterator[asyncio.Event]:
    """A fresh gate for ``Hold`` (an event belongs to one loop)."""
    Hold.gate = asyncio.Event()
    yield Hold.gate
    Hold.gate.set()


def pairs(records: list[sl.Record]) -> list[tuple[Any, Any]]:
    """``(key, value)`` of each record, sorted."""
    return sorted((record.key, record.value) for record in records)


async def test_a_job_finishes_on_two_workers_with_exact_results() -> None:
    """Spread over both workers (TCP between them): one attempt, every running count once in both sinks."""
    async with SimulatedCluster(workers=2, capacity=3) as cluster:
        outcome = await cluster.run(wordcount)
    assert outcome.states == [
        ("SUBMITTED", "waiting for the leader to schedule it"),
        ("SCHEDULED", "assigned to worker-0, worker-1"),
        ("RUNNING", "running on worker-0, worker-1"),
        ("FINISHED", "every worker finished (2)"),
    ]
    assert (outcome.state, outcome.attempt, outcome.restored_from, outcome.kills) == ("FINISHED", 1, None, [])
    assert outcome.ran_on == PLACED
    assert sorted(outcome.attempts[0].reports) == outcome.attempts[0].started == ["worker-0", "worker-1"]
    assert pairs(outcome.committed["totals"]) == pairs(outcome.collected["seen"]) == RUNNING_COUNTS
    final: dict[str, int] = {}
    for record in outcome.committed["totals"]:
        final[record.key] = max(final.get(record.key, 0), record.value)
    assert final == Counter(WORDS)  # the last running count of each word is its count
    assert [epoch for _, epoch in outcome.checkpoints] == list(range(1, len(outcome.checkpoints) + 1))


async def test_a_worker_killed_after_checkpoint_1_recovers_on_the_survivor_exactly_once() -> None:
    """worker-0 dies as checkpoint 1 completes: RECOVERING, attempt 2 on worker-1 from checkpoint 1, FINISHED.

    The ExactlyOnceSink holds every running count once, and so does the CollectSink: what it had collected
    up to checkpoint 1 (on the lost worker) is in the checkpoint, and attempt 2's instance took it back.
    """
    async with SimulatedCluster(workers=2, capacity=3) as cluster:
        outcome = await cluster.run(wordcount, kill=KillAt("worker-0", after_checkpoint=1))
    assert outcome.states == [
        ("SUBMITTED", "waiting for the leader to schedule it"),
        ("SCHEDULED", "assigned to worker-0, worker-1"),
        ("RUNNING", "running on worker-0, worker-1"),
        ("RECOVERING", "attempt 2: lost worker-0"),
        ("RUNNING", "running on worker-1"),
        ("FINISHED", "every worker finished (1)"),
    ]
    assert outcome.kills == [Kill("worker-0", "checkpoint 1 completed", "wordcount", {"wordcount": 1})]
    first, second = outcome.attempts
    assert (first.instances, first.started, first.reports) == (PLACED, ["worker-0", "worker-1"], {})
    assert (second.workers, second.started, sorted(second.reports)) == (["worker-1"], ["worker-1"], ["worker-1"])
    assert (outcome.attempt, outcome.restored_from) == (2, 1)
    assert [c for c in outcome.checkpoints if c[0] == 1] == [(1, 1)]
    assert all(epoch > 1 for attempt, epoch in outcome.checkpoints if attempt == 2)
    assert pairs(outcome.committed["totals"]) == RUNNING_COUNTS
    assert pairs(outcome.collected["seen"]) == RUNNING_COUNTS


async def test_a_worker_killed_after_a_number_of_records_recovers_exactly_once() -> None:
    """worker-1 dies once its count instances took 12000 records (at a batch boundary): attempt 2 on worker-0
    resumes from the last checkpoint attempt 1 completed (or from the start), and the output is exact."""
    async with SimulatedCluster(workers=2, capacity=3) as cluster:
        outcome = await cluster.run(wordcount, kill=KillAt("worker-1", after_records=("count", 12_000)))
    [kill] = outcome.kills
    taken = int(kill.cause.removeprefix("'count' took ").removesuffix(" records"))
    assert (kill.worker, kill.job, kill.running) == ("worker-1", "wordcount", {"wordcount": 1})
    assert 12_000 <= taken < 12_000 + 1000  # batches of at most 1000 records
    assert outcome.states[3:] == [
        ("RECOVERING", "attempt 2: lost worker-1"),
        ("RUNNING", "running on worker-0"),
        ("FINISHED", "every worker finished (1)"),
    ]
    assert set(outcome.ran_on.values()) == {"worker-0"}
    completed_before = [epoch for attempt, epoch in outcome.checkpoints if attempt == 1]
    assert outcome.restored_from == (completed_before[-1] if completed_before else None)
    assert pairs(outcome.committed["totals"]) == RUNNING_COUNTS


async def test_killing_every_worker_stalls_the_job_until_one_comes_back_with_its_disk() -> None:
    """Both workers die as checkpoint 1 completes: STALLED naming them; worker-0 restarts (same id, same
    folder: its own part and its replica of worker-1's) and takes attempt 2 from checkpoint 1 alone."""
    async with SimulatedCluster(workers=2, capacity=3) as cluster:
        job = await cluster.submit(
            wordcount, kill=[KillAt("worker-0", after_checkpoint=1), KillAt("worker-1", after_checkpoint=1)]
        )
        stalled = await job.wait_for("STALLED")
        assert cluster.workers == []
        assert await cluster.add_worker("worker-0") == "worker-0"
        outcome = await job.outcome()
    assert stalled == ("STALLED", "lost worker-0, worker-1; no live worker can take it: no live worker")
    path = [state for index, (state, _) in enumerate(outcome.states) if outcome.states[index - 1][0] != state]
    assert path == ["SUBMITTED", "SCHEDULED", "RUNNING", "STALLED", "RECOVERING", "RUNNING", "FINISHED"]
    assert ("RECOVERING", "attempt 2: a worker can take it again") in outcome.states
    assert [kill.worker for kill in outcome.kills] == ["worker-0", "worker-1"]
    assert (outcome.attempt, outcome.restored_from, set(outcome.ran_on.values())) == (2, 1, {"worker-0"})
    assert pairs(outcome.committed["totals"]) == RUNNING_COUNTS


async def test_a_job_whose_every_copy_is_gone_waits_stalled_saying_so_instead_of_resuming_earlier() -> None:
    """Both workers die with their disks; a new worker holds nothing: checkpoint 1 is marked unusable and the
    job is STALLED, naming the checkpoint and who holds it, waiting for a holder. It neither starts afresh
    (which would lose the state) nor resumes from an earlier point (which would commit output twice)."""
    async with SimulatedCluster(workers=2, capacity=3) as cluster:
        job = await cluster.submit(
            wordcount, kill=[KillAt("worker-0", after_checkpoint=1), KillAt("worker-1", after_checkpoint=1)]
        )
        await job.wait_for("STALLED")
        await cluster.add_worker()
        await job.wait_for("RECOVERING")
        _, reason = await job.wait_for("STALLED")
        assert reason == (
            "checkpoint 1 has an instance with no intact copy on a live worker (worker-2) (held by worker-0, "
            "worker-1); waiting for a worker that holds it: resuming from an earlier checkpoint would commit its "
            "output twice"
        )
        await job.kill()
        outcome = await job.outcome()
    assert outcome.state == "KILLED"
    reports = [report for attempt in outcome.attempts[1:] for report in attempt.reports.values()]
    assert reports  # attempts after the new worker joined: each found checkpoint 1 without a live copy
    assert all(report["unusable"] == 1 for report in reports)
    committed = pairs(outcome.committed["totals"])
    assert len(committed) == len(set(committed)) > 0  # what checkpoint 1 committed, each count once


async def test_a_worker_killed_by_the_test_while_the_job_is_held(gate: asyncio.Event) -> None:
    """kill_worker at a moment the test picks: the job is RUNNING and cannot finish (held); the kill makes
    attempt 2 on the other worker, which the test lets through; nothing was committed twice."""
    async with SimulatedCluster(workers=2, capacity=2) as cluster:
        job = await cluster.submit(held)
        await job.wait_for("RUNNING")
        holder = (await job.instances())["hold.0"]
        await cluster.kill_worker(holder)
        assert cluster.workers == sorted({"worker-0", "worker-1"} - {holder})
        assert await job.wait_for("RECOVERING") == ("RECOVERING", f"attempt 2: lost {holder}")
        await job.wait_for("RUNNING")
        gate.set()
        outcome = await job.outcome()
        assert await cluster.add_worker(holder) == holder  # restarted under its old id
        assert sorted(cluster.workers) == ["worker-0", "worker-1"]
        assert await cluster.add_worker() == "worker-2"
    assert outcome.kills == [Kill(holder, "kill_worker()", None, {"held": 1})]
    assert (outcome.state, outcome.attempt, outcome.restored_from) == ("FINISHED", 2, None)
    assert sorted(record.value for record in outcome.committed["out"]) == list(range(100))


async def test_a_wait_that_times_out_names_where_the_job_is(gate: asyncio.Event) -> None:
    """A job that cannot end: the wait fails after the cluster's timeout with its state and path."""
    async with SimulatedCluster(workers=1, timeout=0.3) as cluster:
        job = await cluster.submit(held)
        with pytest.raises(sl.JobError) as waited:
            await job.outcome()
        gate.set()
    assert str(waited.value) == (
        "job 'held' is not ended after 0.3 s; it is RUNNING: running on worker-0 (states: SUBMITTED -> SCHEDULED -> "
        "RUNNING)"
    )


async def generated_words() -> Any:
    """WORDS from an ``async def`` generator: a source that cannot be replayed."""
    for word in WORDS:
        yield (word, 1)


def generated_wordcount() -> sl.Topology:
    """The word count of ``wordcount`` read from a generator."""
    topology = sl.Topology("generated")
    words = topology.add_source("words", generated_words())
    passed = topology.map("pass", lambda record: (record.key, record.value), parallelism=2).set_input(words)
    count = topology.reduce("count", lambda total, n: total + n, parallelism=2, emit="record")
    count.set_input(passed, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", ExactlyOnceSink()).set_input(count)
    return topology


async def test_a_generator_source_fails_the_job_on_recovery_instead_of_counting_twice() -> None:
    """worker-0 dies after checkpoint 1: attempt 2 would read the generator from its start, so the job ends
    FAILED naming the source and the checkpoint, with nothing committed twice."""
    async with SimulatedCluster(workers=2, capacity=3) as cluster:
        outcome = await cluster.run(generated_wordcount, kill=KillAt("worker-0", after_checkpoint=1))
    assert outcome.states[3] == ("RECOVERING", "attempt 2: lost worker-0")
    assert (outcome.state, outcome.attempt) == ("FAILED", 2)  # its part reports it started, then fails restoring
    assert outcome.reason.startswith(
        "NotReplayable: source 'words' instance 0 cannot be replayed: checkpoint 1 of job 'generated' holds no "
        "position for it, so resuming would read it again from its start and count its records twice"
    )
    counts = Counter(pairs(outcome.committed["totals"]))
    assert len(counts) > 0  # what checkpoint 1 committed ...
    assert max(counts.values()) == 1  # ... each running count once


async def test_a_failed_job_ends_failed_and_a_wait_for_another_state_says_so() -> None:
    """A task error fails the job (as on a real cluster); waiting for STALLED then fails at once, naming it."""
    async with SimulatedCluster(workers=1, checkpoint_interval=None) as cluster:
        job = await cluster.submit(boom)
        with pytest.raises(sl.JobError, match=r"^job 'boom' ended FAILED \(TaskError: .*\(on worker-0\)\), never "):
            await job.wait_for("STALLED")
        outcome = await job.outcome()
    assert outcome.state == "FAILED"
    assert outcome.reason.endswith("ZeroDivisionError: division by zero (on worker-0)")


async def test_targets_by_reference_file_and_function_or_handed_over_in_process(tmp_path: Path) -> None:
    """A reference string and a file go as given (loaded from their signed bytes); a function, a lambda or
    a Topology object is handed over in-process (a parallelism override leaves the object alone)."""
    module = tmp_path / "small_job.py"
    module.write_text("from tests.unit.backends.cluster.test_simulated import small as build_topology\n")
    topology = small()
    async with SimulatedCluster(workers=1, checkpoint_interval=None) as cluster:
        outcomes = [
            await cluster.run(f"{__name__}:small", job="by-reference"),
            await cluster.run(f"{module}:build_topology", job="by-file"),
            await cluster.run(small, job="by-function"),
            await cluster.run(lambda: small(), job="by-lambda"),
            await cluster.run(topology, job="by-object", parallelism={"double": 3}),
        ]
        specs = [await cluster.store.get(paths.spec(outcome.job)) for outcome in outcomes]
    targets = [spec[0]["target"] for spec in specs if spec is not None]
    assert targets[:2] == [f"{__name__}:small", f"{module}:build_topology"]
    assert all(target.startswith("streamlet.backends.cluster.simulated.targets:target_") for target in targets[2:])
    assert [sorted(r.value for r in o.collected["out"]) for o in outcomes] == [[2 * n for n in range(10)]] * 5
    assert sorted(outcomes[4].ran_on) == ["double.0", "double.1", "double.2", "numbers.0", "out.0"]
    assert topology.nodes["double"].parallelism == 2


async def test_bad_kill_points_and_unknown_workers_are_refused() -> None:
    """KillAt needs exactly one point with a positive count, and a worker the cluster has."""
    with pytest.raises(sl.JobError, match=r"^KillAt\('w'\) needs exactly one of after_checkpoint=N or after_recor"):
        KillAt("w")
    with pytest.raises(sl.JobError, match=r"^KillAt\('w'\) needs exactly one"):
        KillAt("w", after_checkpoint=1, after_records=("count", 5))
    with pytest.raises(sl.JobError, match=r"^KillAt\('w'\): after_checkpoint must be >= 1, got 0$"):
        KillAt("w", after_checkpoint=0)
    async with SimulatedCluster(workers=1) as cluster:
        with pytest.raises(sl.JobError, match=r"^KillAt names worker 'worker-7'; the workers are \['worker-0'\]$"):
            await cluster.submit(small, kill=KillAt("worker-7", after_checkpoint=1))
        with pytest.raises(sl.JobError, match=r"^no live worker called 'worker-7' \(live: worker-0\)$"):
            await cluster.kill_worker("worker-7")
    with pytest.raises(sl.JobError, match=r"^the simulated cluster is not running"):
        await cluster.add_worker()


async def test_the_tests_own_error_comes_out_as_itself_and_the_clusters_errors_are_not_swallowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An assertion inside the block is raised as is (not in an exception group); an error in the cluster's
    own code (here a leader round) fails the block instead of leaving it waiting."""

    async def failing_test() -> None:
        async with SimulatedCluster(workers=1) as cluster:
            await cluster.submit(small)
            raise AssertionError("the test's own")

    async def broken_round(self: Leader) -> list[str]:
        raise RuntimeError("a bug in a leader round")

    async def run_small() -> None:
        async with SimulatedCluster(workers=1) as cluster:
            await (await cluster.submit(small)).outcome()

    with pytest.raises(AssertionError, match=r"^the test's own$"):
        await failing_test()
    monkeypatch.setattr(Leader, "round", broken_round)
    with pytest.raises(ExceptionGroup) as failed:
        await run_small()
    assert [repr(error) for error in failed.value.exceptions] == ["RuntimeError('a bug in a leader round')"]


def sockets() -> set[str]:
    """This process's open sockets."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


async def test_the_harness_leaves_no_task_socket_or_file_behind() -> None:
    """After a run with a kill and a recovery: the same tasks and sockets as before, the checkpoint directory
    gone, the handed-over target and the job's committed records forgotten."""
    tasks, before = set(asyncio.all_tasks()), sockets()
    async with SimulatedCluster(workers=2, capacity=3) as cluster:
        outcome: JobOutcome = await cluster.run(lambda: wordcount(), kill=KillAt("worker-0", after_checkpoint=1))
        directory = cluster.checkpoint_dir
        assert directory is not None
        assert sorted(directory.iterdir()) == [directory / "worker-0", directory / "worker-1"]  # a folder each
        assert sorted(path.name for path in (directory / "worker-0").iterdir()) == ["checkpoints", "replicas"]
        assert len(sockets() - before) > 0
    assert (outcome.state, outcome.attempt) == ("FINISHED", 2)
    assert set(asyncio.all_tasks()) == tasks
    assert sockets() == before
    assert not directory.exists()
    assert simulated_targets._TARGETS == {}
    assert ExactlyOnceSink.committed(f"{cluster.name}.wordcount") == {}
    assert cluster.logs
    assert {entry["event"] for entry in cluster.logs} >= {"job decision"}
