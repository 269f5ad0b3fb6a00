"""Live changes on a cluster (simulated in one process, real TCP between workers): rescale a running job's
keyed task without a new attempt, with every running count exactly once.

The job's first records flow, then the source waits for the test's gate:
the change happens while the job runs (checkpoints too), and the rest flows
through the new layout. No test sleeps: the waits are on the job's states.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from structlog.testing import capture_logs

import streamlet as sl
from streamlet.backends.cluster.client import live_changes as client_changes
from streamlet.backends.cluster.client import savepoints
from streamlet.backends.cluster.tree import layouts as reconfigure
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.status import read_status
from streamlet.core.model.segments import SegmentTable
from streamlet.core.state.savepoints import read_savepoint
from streamlet.testing import ExactlyOnceSink, JobOutcome, SimulatedCluster
from tests.unit.backends.cluster.test_simulated import Hold

WORDS = [f"w{index % 41}" for index in range(12_000)]
RUNNING_COUNTS = sorted((word, n) for word, total in Counter(WORDS).items() for n in range(1, total + 1))


FREE = 4000  # words that flow at once; the rest wait for the test's gate


class Gate:
    """The test opens ``event`` to let the rest of the words flow (an event belongs to one loop); a gated
    source sets ``reached`` once it waits there."""

    event: ClassVar[asyncio.Event]
    reached: ClassVar[asyncio.Event]


async def words() -> AsyncIterator[tuple[str, int]]:
    """The first FREE words, then the rest once the gate opens (the source waits in read: barriers go on)."""
    for index, word in enumerate(WORDS):
        if index == FREE:
            await Gate.event.wait()
        yield word, 1


def rescaled() -> sl.Topology:
    """words -> pass (x2) -> running count per word (x2, SAME_KEY) -> an ExactlyOnceSink and a CollectSink."""
    topology = sl.Topology("rescaled")
    source = topology.add_source("words", words())
    passed = topology.map("pass", lambda record: (record.key, record.value), parallelism=2).set_input(source)
    count = topology.reduce("count", lambda total, n: total + n, parallelism=2, emit="record")
    count.set_input(passed, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", ExactlyOnceSink()).set_input(count)
    topology.add_sink("seen", sl.CollectSink()).set_input(count)
    return topology


@pytest.fixture
def gate() -> Iterator[asyncio.Event]:
    Gate.event, Gate.reached = asyncio.Event(), asyncio.Event()
    yield Gate.event
    Gate.event.set()


def pairs(records: list[sl.Record]) -> list[tuple[str, int]]:
    return sorted((record.key, record.value) for record in records)


def gated_words_of(instances: int, indices: set[int]) -> int:
    """How many of the words behind the gate belong to ``indices`` of ``count`` run with ``instances``
    instances (contiguous segments): what those instances take at least once the gate opens."""
    owner = SegmentTable.contiguous(128, instances).owner_function()
    return sum(1 for word in WORDS[FREE:] if owner(word) in indices)


def count_records_on(outcome: JobOutcome, attempt: int, worker: str) -> int:
    """Records the count task took on ``worker`` in ``attempt`` (its report; moved-away instances included)."""
    nodes = outcome.attempts[attempt - 1].reports[worker]["statistics"]["nodes"]
    return int(nodes["count"]["records_in"]) if "count" in nodes else 0


async def rescale(cluster: SimulatedCluster, job: str, instances: int) -> dict[str, object]:
    """Ask as ``streamlet rescale`` does and wait until the leader says it is done."""
    asked_at = time.time()
    asked = await client_changes.ask(cluster.store, job, reconfigure.request_node("count", instances))
    return await client_changes.wait_done(cluster.store, job, asked, asked_at, 30)


@pytest.mark.parametrize("interval", [None, 0.05], ids=["no-checkpoints", "checkpoints"])
async def test_a_running_cluster_job_rescales_2_3_1_2_in_one_attempt(
    gate: asyncio.Event, interval: float | None
) -> None:
    """count goes 2 -> 3 -> 1 -> 2 instances while the job runs: RECONFIGURING and back to RUNNING three
    times, attempt 1 throughout, every running count exactly once in both sinks."""
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        job = await cluster.submit(rescaled, checkpoint_interval=interval)
        await job.wait_for("RUNNING")
        first = await rescale(cluster, "rescaled", 3)
        layout = await cluster.store.get(paths.layout("rescaled"))
        assert layout is not None
        assert layout[0]["parallelism"] == {"count": 3}
        second = await rescale(cluster, "rescaled", 1)
        third = await rescale(cluster, "rescaled", 2)  # instance 1 again: a new one, under new channel names
        gate.set()
        outcome = await job.outcome()
    changes = (first["reconfigurations"], second["reconfigurations"], third["reconfigurations"])
    assert (changes, third["attempt"]) == ((1, 2, 3), 1)
    assert [state for state, _ in outcome.states].count("RECONFIGURING") == 3
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert pairs(outcome.committed["totals"]) == pairs(outcome.collected["seen"]) == RUNNING_COUNTS
    if interval is not None:  # checkpoints went on after the changes, numbered without a gap
        epochs = [epoch for _, epoch in outcome.checkpoints]
        assert epochs == list(range(1, len(epochs) + 1))
        assert len(epochs) >= 2


async def test_a_bad_rescale_is_refused_and_the_job_runs_on(gate: asyncio.Event) -> None:
    """An unknown task, too many instances, a second request while one waits: refused with the reason."""
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        job = await cluster.submit(rescaled, checkpoint_interval=None)
        await job.wait_for("RUNNING")
        with pytest.raises(sl.ReconfigurationError, match="no task called 'nope'"):
            await client_changes.ask(cluster.store, "rescaled", reconfigure.request_node("nope", 2))
        with pytest.raises(sl.ReconfigurationError, match="1 to 128 instances"):
            await client_changes.ask(cluster.store, "rescaled", reconfigure.request_node("count", 129))
        gate.set()
        outcome = await job.outcome()
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert pairs(outcome.committed["totals"]) == RUNNING_COUNTS


def stuck() -> sl.Topology:
    """words -> pass (x2) -> count (x2, SAME_KEY) -> held -> an ExactlyOnceSink: 7 instances."""
    topology = sl.Topology("stuck")
    source = topology.add_source("words", [(word, 1) for word in WORDS])
    passed = topology.map("pass", lambda record: (record.key, record.value), parallelism=2).set_input(source)
    count = topology.reduce("count", lambda total, n: total + n, parallelism=2, emit="record")
    count.set_input(passed, partitioning=sl.SAME_KEY)
    held = topology.add_task("held", Hold).set_input(count)  # until the gate opens, the count's output backs up
    topology.add_sink("totals", ExactlyOnceSink()).set_input(held)
    return topology


async def test_a_worker_lost_during_a_change_falls_back_to_the_next_attempt_exactly_once() -> None:
    """The change cannot finish (the count's output is held); the worker of count.0 dies: RECONFIGURING ->
    RECOVERING, attempt 2 with the old layout, the client told so at once, and the sink still holds every running
    count exactly once."""
    Hold.gate = asyncio.Event()
    try:
        async with SimulatedCluster(workers=3, capacity=4) as cluster:
            job = await cluster.submit(stuck, checkpoint_interval=0.05)
            await job.wait_for("RUNNING")
            asked_at = time.time()
            asked = await client_changes.ask(cluster.store, "stuck", reconfigure.request_node("count", 3))
            await job.wait_for("RECONFIGURING")
            victim = (await job.instances())["count.0"]
            await cluster.kill_worker(victim)
            await job.wait_for("RECOVERING")
            # the client following the change hears at once that it was dropped, and why (not "not finished
            # after 600 s" once its wait is over)
            dropped = (
                rf"^the cluster dropped the change \(lost {victim} during change 1\): job 'stuck' runs on in its old "
                "shape, in a new attempt from its last checkpoint; ask again once it runs$"
            )
            with pytest.raises(sl.ReconfigurationError, match=dropped):
                await client_changes.wait_done(cluster.store, "stuck", asked, asked_at, 600)
            Hold.gate.set()
            outcome = await job.outcome()
            layout = await cluster.store.get(paths.layout("stuck"))
    finally:
        Hold.gate.set()
    assert (outcome.state, outcome.attempt) == ("FINISHED", 2)
    states = [state for state, _ in outcome.states]
    assert states[states.index("RECONFIGURING") + 1] == "RECOVERING"
    assert pairs(outcome.committed["totals"]) == RUNNING_COUNTS
    assert layout is None  # the change never finished: attempt 2 ran the old layout


class GatedWords(sl.Source):
    """WORDS from a position (seekable), the ones from FREE on only once the gate is open."""

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _GatedReader()


class _GatedReader(sl.SourceReader):
    def __init__(self) -> None:
        self.index = 0

    async def read(self, max_records: int) -> list[sl.Record] | None:
        if self.index >= len(WORDS):
            return None
        if self.index >= FREE:
            Gate.reached.set()
            await Gate.event.wait()
        batch = WORDS[self.index : self.index + min(max_records, 500)]
        self.index += len(batch)
        return [sl.Record(word, 1, None) for word in batch]

    def position(self) -> int:
        return self.index

    async def seek(self, position: int) -> None:
        self.index = position


def from_a_savepoint() -> sl.Topology:
    """gated words -> running count per word (SAME_KEY) -> an ExactlyOnceSink."""
    topology = sl.Topology("counted")
    source = topology.add_source("words", GatedWords())
    count = topology.reduce("count", lambda total, n: total + n, parallelism=2, emit="record")
    count.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", ExactlyOnceSink()).set_input(count)
    return topology


async def test_stop_with_a_savepoint_and_resume_it_as_a_new_job(gate: asyncio.Event, tmp_path: Path) -> None:
    """stop --savepoint: the sources stop, the savepoint holds all they read, the job ends KILLED; a new job
    from it (count at 3 instances) reads on from there: every word's final count is its whole count, and
    the new job's counts for each word run on without a gap or a repeat."""
    path = tmp_path / "savepoints" / "counted"
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        first = await cluster.submit(from_a_savepoint, job="first", checkpoint_interval=0.05)
        await first.wait_for("RUNNING")
        await Gate.reached.wait()  # the first FREE words are read: the savepoint holds exactly them
        epoch = await savepoints.take(cluster.store, "first", path, cluster.secret, pause=True)
        await first.kill()
        stopped = await first.outcome()
        gate.set()
        second = await cluster.submit(
            from_a_savepoint, job="second", checkpoint_interval=0.05, parallelism={"count": 3}, from_savepoint=path
        )
        resumed = await second.outcome()
    assert (stopped.state, resumed.state, resumed.attempt, resumed.restored_from) == ("KILLED", "FINISHED", 1, epoch)
    running: dict[str, list[int]] = {}
    for key, value in pairs(resumed.committed["totals"]):
        running.setdefault(key, []).append(value)
    assert read_savepoint(path)[1]["sources"]["words"] == [FREE]
    assert sum(len(values) for values in running.values()) == len(WORDS) - FREE  # the rest, each word once
    totals = Counter(WORDS)
    assert {word: values[-1] for word, values in running.items()} == totals  # on from the savepoint's counts
    assert all(values == list(range(values[0], values[-1] + 1)) for values in running.values())


async def test_a_rescale_past_the_workers_capacity_is_refused_by_the_leader(gate: asyncio.Event) -> None:
    """One worker of capacity 7 runs the job's 7 instances: an 8th has nowhere to go; the leader says so,
    the job stays RUNNING in attempt 1 and finishes exactly."""
    async with SimulatedCluster(workers=1, capacity=7) as cluster:
        job = await cluster.submit(rescaled, checkpoint_interval=None)
        await job.wait_for("RUNNING")
        with pytest.raises(sl.ReconfigurationError, match="no live worker has room for instance 2 of 'count'"):
            await rescale(cluster, "rescaled", 3)
        assert await job.state() == ("RUNNING", "running on worker-0")
        gate.set()
        outcome = await job.outcome()
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert pairs(outcome.committed["totals"]) == RUNNING_COUNTS


async def migrate(cluster: SimulatedCluster, job: str, index: int, worker: str) -> dict[str, object]:
    """Ask as ``streamlet migrate`` does and wait until the leader says it is done."""
    request, asked_at = reconfigure.request_node("count", migrate=(index, worker)), time.time()
    before = await client_changes.ask(cluster.store, job, request)
    return await client_changes.wait_done(cluster.store, job, before, asked_at, 30)


async def test_instances_migrate_to_another_worker_with_their_state(gate: asyncio.Event) -> None:
    """count.0 and then count.1 move to the other worker while the job runs: the same attempt, the layout
    records where they run now, every running count exactly once; a move nowhere new is refused."""
    async with SimulatedCluster(workers=2, capacity=5) as cluster:
        job = await cluster.submit(rescaled, checkpoint_interval=0.05)
        await job.wait_for("RUNNING")
        where = await job.instances()
        moves = {index: "worker-1" if where[f"count.{index}"] == "worker-0" else "worker-0" for index in (0, 1)}
        first = await migrate(cluster, "rescaled", 0, moves[0])
        second = await migrate(cluster, "rescaled", 1, moves[1])
        with pytest.raises(sl.ReconfigurationError, match=f"count.1 runs on {moves[1]} already"):
            await migrate(cluster, "rescaled", 1, moves[1])
        with pytest.raises(sl.ReconfigurationError, match=r"worker-9 cannot take count\.0: it is not a live worker"):
            await migrate(cluster, "rescaled", 0, "worker-9")
        layout = await cluster.store.get(paths.layout("rescaled"))
        status = await read_status(cluster.store)  # cluster status: where they run now, as jobs says
        shown = {instance: row["id"] for row in status["workers"] for instance in row["instances"]}
        gate.set()
        outcome = await job.outcome()
    assert {index: shown[f"rescaled/count.{index}"] for index in (0, 1)} == moves
    assert (first["reason"], second["reconfigurations"]) == (f"change 1 done: count.0 runs on {moves[0]}", 2)
    assert layout is not None
    assert layout[0]["placed"] == {f"count.{i}": moves[i] for i in (0, 1)}
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    for worker in set(moves.values()):  # the moved instances run there: they took their keys' later words
        held = {index for index, target in moves.items() if target == worker}
        assert count_records_on(outcome, 1, worker) >= gated_words_of(2, held) > 0
    assert pairs(outcome.committed["totals"]) == pairs(outcome.collected["seen"]) == RUNNING_COUNTS


async def test_a_savepoint_folder_not_signed_with_the_secret_gets_no_part(gate: asyncio.Event, tmp_path: Path) -> None:
    """A trigger whose export folder is signed with another secret: the workers refuse to write there (and
    say why), the savepoint fails on the part it cannot read, and the job runs on to the end."""
    path = tmp_path / "savepoints" / "forged"
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        job = await cluster.submit(from_a_savepoint, job="forged", checkpoint_interval=0.05)
        await job.wait_for("RUNNING")
        refusal = r"^checkpoint \d+ of job 'forged' cannot be read for the savepoint"
        with capture_logs() as logs, pytest.raises(sl.JobError, match=refusal):
            await savepoints.take(cluster.store, "forged", path, b"not the cluster's secret", seconds=30)
        gate.set()
        outcome = await job.outcome()
    refused = [entry for entry in logs if entry["event"] == "savepoint folder refused"]
    assert len(refused) >= 1  # each worker of the attempt, for the one epoch asked
    assert len({entry["epoch"] for entry in refused}) == 1
    assert all("is not signed with this cluster's secret" in entry["reason"] for entry in refused)
    assert outcome.state == "FINISHED"
    assert pairs(outcome.committed["totals"])[-1][1] >= 1
