"""The adaptation loop on a cluster (simulated in one process): the statistics in the workers' heartbeats,
DS2 autoscaling a bottleneck task live, and the rebalance policy giving a joined worker its share."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import streamlet as sl
from streamlet.adaptation.settings import AdaptSettings
from streamlet.backends.cluster.simulated.cluster import JobOutcome
from streamlet.backends.cluster.tree import paths
from streamlet.core.model.segments import SegmentTable, segment_of
from streamlet.errors import JobError
from streamlet.testing import ExactlyOnceSink, SimulatedCluster

BATCH = 100
WORK_RATE = 4_000  # records per second one instance of 'work' gets through (it awaits per batch)


class Paced:
    """The source's switch and tally (one event loop: the test's)."""

    stop: ClassVar[asyncio.Event]
    emitted: ClassVar[int] = 0


class PacedSource(sl.Source):
    """Batches of BATCH records as fast as they are taken until the test stops it: far more than 'work' can
    take, so the source is held back by backpressure most of the time."""

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _PacedReader()


class _PacedReader(sl.SourceReader):
    def __init__(self) -> None:
        self.sent = 0

    async def read(self, max_records: int) -> list[sl.Record] | None:
        if Paced.stop.is_set():
            return None
        batch = [sl.Record(f"k{(self.sent + n) % 97}", 1, None) for n in range(BATCH)]
        self.sent += BATCH
        Paced.emitted += BATCH
        return batch


class Work(sl.Task):
    """Gets through WORK_RATE records a second per instance (an awaited call per batch, e.g. a model)."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        batch = inputs.get()
        await asyncio.sleep(len(batch) / WORK_RATE)  # the work itself
        outputs.emit_batch(batch)


def bottleneck() -> sl.Topology:
    """an eager source -> work (x1, the bottleneck) -> an ExactlyOnceSink."""
    topology = sl.Topology("bottleneck")
    source = topology.add_source("feed", PacedSource())
    work = topology.add_task("work", Work).set_input(source)
    topology.add_sink("out", ExactlyOnceSink()).set_input(work)
    return topology


@pytest.fixture
def paced() -> Iterator[asyncio.Event]:
    Paced.stop, Paced.emitted = asyncio.Event(), 0
    yield Paced.stop
    Paced.stop.set()


async def test_heartbeats_carry_every_instances_statistics(paced: asyncio.Event) -> None:
    async with SimulatedCluster(workers=1, capacity=8) as cluster:
        job = await cluster.submit(bottleneck, checkpoint_interval=None)
        await job.wait_for("RUNNING")
        version: int | None = None
        while True:  # the next heartbeats, until one shows records through 'work' (on the node's watch)
            load, version = await cluster.store.wait_changed(paths.load("worker-0"), version)
            work = (load or {}).get("instances", {}).get("bottleneck/work.0")
            if work is not None and work["records_in"] > 0:
                break
        paced.set()
        await job.outcome()
    assert set(load["instances"]) == {"bottleneck/feed.0", "bottleneck/work.0", "bottleneck/out.0"}
    assert (work["kind"], work["index"]) == ("task", 0)
    assert work["busy"] > 0
    assert work["batches"] > 0
    assert sum(work["latency"]) == work["batches"]
    assert work["state"] in ("NORMAL", "YELLOW", "RED")


async def test_ds2_scales_the_bottleneck_up_to_its_bound_in_one_decision(paced: asyncio.Event) -> None:
    """'work' holds the source back: its true rate (per busy second) against what the source emits when not
    held back says it needs more instances than its bound of 3; the leader rescales it live to 3 (same
    attempt), records the decision with its reason, and decides nothing more; nothing is lost or doubled."""
    settings = AdaptSettings(frozenset({"autoscale"}), {"work": (1, 3)}, interval=1.0, cooldown=0.5)
    async with SimulatedCluster(workers=1, capacity=8) as cluster:
        job = await cluster.submit(bottleneck, checkpoint_interval=0.2, adapt=settings)
        await job.wait_for("RUNNING")
        await job.wait_for("RECONFIGURING")
        _, reason = await job.wait_for("RUNNING")
        layout = await cluster.store.get(paths.layout("bottleneck"))
        paced.set()
        outcome = await job.outcome()
        status = await cluster.store.get(paths.state("bottleneck"))
        decisions = await cluster.store.children(paths.decisions("bottleneck"))
        first = await cluster.store.get(f"{paths.decisions('bottleneck')}/{decisions[0]}")
    assert first is not None
    assert reason == "change 1 done: work runs 3 instances", first
    assert layout is not None
    assert layout[0]["parallelism"] == {"work": 3}
    assert len(decisions) == 1
    assert status is not None
    assert status[0]["reconfigurations"] == 1
    assert (first[0]["policy"], first[0]["action"]) == ("autoscale", "rescale work 1 -> 3")
    needs = float(first[0]["reason"].split(" needs ")[1].split(" instances")[0])
    assert needs > 3
    assert "per busy second each, 85% busy (DS2); had 1, bounds 1..3" in first[0]["reason"]
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert len(outcome.committed["out"]) == Paced.emitted  # every record once


async def work_moved_by_the_loop(
    settings: AdaptSettings, checkpoint_interval: float | None, cpu: dict[str, float] | None = None
) -> tuple[str, dict[str, Any], JobOutcome]:
    """The bottleneck job on worker-0, then worker-1 joins (with the CPU shares ``cpu`` says, if any); the
    loop moves an instance, live: (the change's reason, the one decision, the outcome)."""
    async with SimulatedCluster(workers=1, capacity=8) as cluster:
        job = await cluster.submit(bottleneck, checkpoint_interval=checkpoint_interval, adapt=settings)
        await job.wait_for("RUNNING")
        await cluster.add_worker()
        for worker, share in (cpu or {}).items():
            cluster.set_cpu(worker, share)
        await job.wait_for("RECONFIGURING")
        _, reason = await job.wait_for("RUNNING")
        Paced.stop.set()
        outcome = await job.outcome()
        decisions = await cluster.store.children(paths.decisions("bottleneck"))
        first = await cluster.store.get(f"{paths.decisions('bottleneck')}/{decisions[0]}")
    assert first is not None
    assert len(decisions) == 1
    return reason, first[0], outcome


async def test_the_rebalance_policy_gives_a_joined_worker_its_share(paced: asyncio.Event) -> None:
    """The job runs on worker-0; worker-1 joins; with the rebalance policy on, the loop moves 'work' (the
    only instance that can move) to it, live, once: then 2 and 1 instances is as even as it gets."""
    settings = AdaptSettings(frozenset({"rebalance"}), interval=0.5, cooldown=0.5)
    reason, decision, outcome = await work_moved_by_the_loop(settings, None)
    assert reason == "change 1 done: work.0 runs on worker-1"
    assert (decision["policy"], decision["action"]) == ("rebalance", "migrate work.0 to worker-1")
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert len(outcome.committed["out"]) == Paced.emitted


# 30 keys crowded into the first quarter of the segments (instance 0's under contiguous ranges), 6 elsewhere
CROWDED = [key for key in (f"user{n}" for n in range(2_000)) if segment_of(key, 128) < 32][:30]
SKEWED = CROWDED + [key for key in (f"user{n}" for n in range(2_000)) if segment_of(key, 128) >= 32][:6]


class SkewedSource(sl.Source):
    """Every key of SKEWED once per batch, until the test stops it (backpressure gives the others their turn)."""

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _SkewedReader()


class _SkewedReader(sl.SourceReader):
    async def read(self, max_records: int) -> list[sl.Record] | None:
        if Paced.stop.is_set():
            return None
        Paced.emitted += len(SKEWED)
        return [sl.Record(key, 1, None) for key in SKEWED]


def skewed_counts() -> sl.Topology:
    """skewed keys -> a running count per key, 4 instances behind a SESSION_TABLE edge -> an ExactlyOnceSink."""
    topology = sl.Topology("skewed")
    source = topology.add_source("feed", SkewedSource())
    count = topology.reduce("count", lambda total, one: total + one, parallelism=4)
    count.set_input(source, partitioning=sl.SESSION_TABLE)
    topology.add_sink("out", ExactlyOnceSink()).set_input(count)
    return topology


async def test_the_balance_policy_moves_segments_off_the_crowded_instance(paced: asyncio.Event) -> None:
    """30 of the 36 keys start on count.0: the heartbeats carry the source's segment loads, the balancer
    moves segments off count.0 live (same attempt), and every key's running totals are 1..n, in order."""
    settings = AdaptSettings(frozenset({"balance"}), interval=0.5, cooldown=60)
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        job = await cluster.submit(skewed_counts, checkpoint_interval=0.2, adapt=settings)
        await job.wait_for("RUNNING")
        await job.wait_for("RECONFIGURING")
        await job.wait_for("RUNNING")
        layout = await cluster.store.get(paths.layout("skewed"))
        paced.set()
        outcome = await job.outcome()
        decisions = await cluster.store.children(paths.decisions("skewed"))
        first = await cluster.store.get(f"{paths.decisions('skewed')}/{decisions[0]}")
    assert layout is not None
    owners = SegmentTable.from_data(layout[0]["tables"]["count"]).owners
    before = SegmentTable.contiguous(128, 4).owners
    moved = sum(now != then for now, then in zip(owners, before, strict=True))
    assert first is not None
    assert len(decisions) == 1  # the cooldown outlasts the job
    assert (first[0]["policy"], first[0]["action"]) == ("balance", f"move {moved} segments of count")
    assert first[0]["reason"].endswith(f"by moving {moved} segments")
    per_instance = Counter(owners[segment_of(key, 128)] for key in SKEWED)
    assert max(per_instance.values()) < 30  # count.0 no longer holds 30 keys
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    totals: dict[str, list[int]] = {}
    for record in outcome.committed["out"]:
        totals.setdefault(record.key, []).append(record.value)
    assert totals == {key: list(range(1, Paced.emitted // len(SKEWED) + 1)) for key in SKEWED}


def overloaded() -> sl.Topology:
    """The bottleneck job with a QoS that lets it shed half its input; shed records kept apart, exactly once."""
    topology = sl.Topology("overloaded").set_qos(sl.QoS(max_latency=5.0, max_shed_ratio=0.5))
    source = topology.add_source("feed", PacedSource())
    work = topology.add_task("work", Work).set_input(source)
    topology.add_sink("out", ExactlyOnceSink()).set_input(work)
    topology.add_sink("dropped", ExactlyOnceSink()).set_input(source, out_port=sl.SHED)
    return topology


async def test_the_shed_policy_sheds_at_the_sources_of_every_worker(paced: asyncio.Event) -> None:
    """'work' holds the source back and may not grow: the leader sets a shed ratio of 10%, the worker
    running the source applies it, and what 'out' and 'dropped' committed add up to what the source read."""
    settings = AdaptSettings(frozenset({"shed"}), interval=0.5, cooldown=60)
    async with SimulatedCluster(workers=1, capacity=8) as cluster:
        job = await cluster.submit(overloaded, checkpoint_interval=0.2, adapt=settings)
        await job.wait_for("RUNNING")
        ratio, version = await cluster.store.wait_changed(paths.shedding("overloaded"), None)
        while ratio is None:
            ratio, version = await cluster.store.wait_changed(paths.shedding("overloaded"), version)
        beat: int | None = None
        while True:  # the next heartbeats, until one shows the source shedding
            load, beat = await cluster.store.wait_changed(paths.load("worker-0"), beat)
            if (load or {}).get("instances", {}).get("overloaded/feed.0", {}).get("shed", 0) > 0:
                break
        paced.set()
        outcome = await job.outcome()
        decisions = await cluster.store.children(paths.decisions("overloaded"))
        first = await cluster.store.get(f"{paths.decisions('overloaded')}/{decisions[0]}")
    assert ratio["ratio"] == 0.1
    assert first is not None
    assert (first[0]["policy"], first[0]["action"]) == ("shed", "shed 10% at the sources")
    assert first[0]["reason"].startswith("sources held back ")
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert len(outcome.committed["dropped"]) > 0
    assert len(outcome.committed["out"]) + len(outcome.committed["dropped"]) == Paced.emitted


async def test_an_overloaded_worker_hands_its_hottest_instance_to_the_least_loaded(paced: asyncio.Event) -> None:
    """The whole job runs on worker-0, whose beats say 97 % of a core with 'work' backed up (OVERLOADED);
    worker-1 says 10 %. With the migrate policy the loop moves work.0 (the only movable, and busiest,
    instance) to worker-1, live, once; nothing lost or doubled."""
    settings = AdaptSettings(frozenset({"migrate"}), interval=0.5, cooldown=60)
    cpu = {"worker-0": 0.97, "worker-1": 0.1}
    reason, decision, outcome = await work_moved_by_the_loop(settings, 0.2, cpu)
    assert reason == "change 1 done: work.0 runs on worker-1"
    assert (decision["policy"], decision["action"]) == ("migrate", "migrate work.0 to worker-1")
    assert decision["reason"].startswith("worker-0 is overloaded (CPU 97%, full queues): its hottest instance work.0")
    assert decision["reason"].endswith("goes to worker-1 (CPU 10%)")
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert len(outcome.committed["out"]) == Paced.emitted


async def test_the_shed_policy_needs_a_qos() -> None:
    async with SimulatedCluster(workers=1) as cluster:
        with pytest.raises(JobError, match=r"--adapt shed keeps a QoS: topology 'bottleneck' has none"):
            await cluster.submit(bottleneck, adapt=AdaptSettings(frozenset({"shed"})))


def parallel_work() -> sl.Topology:
    """An eager source -> work (x2) -> an ExactlyOnceSink: dispatch packs all of it onto one worker."""
    topology = sl.Topology("parallel-work")
    source = topology.add_source("feed", PacedSource())
    work = topology.add_task("work", Work, parallelism=2).set_input(source)
    topology.add_sink("out", ExactlyOnceSink()).set_input(work)
    return topology


async def test_by_default_a_cpu_bound_task_spreads_over_the_workers(paced: asyncio.Event) -> None:
    """A job that names no policy runs under 'spread': its two instances of 'work', packed on worker-0 whose
    beats say 97 % of a core (worker-1: 5 %), take nearly all of it from the first beats on: the loop records
    the task's CPU hint and, once the part has run SETTLED seconds, moves work.1 to worker-1, live, once, and
    records the decision; nothing is lost or doubled."""
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        cluster.set_cpu("worker-0", 0.97)
        cluster.set_cpu("worker-1", 0.05)
        job = await cluster.submit(parallel_work, checkpoint_interval=None)
        await job.wait_for("RUNNING")
        assignment = await cluster.store.get(paths.assignment("parallel-work"))
        await job.wait_for("RECONFIGURING")
        _, reason = await job.wait_for("RUNNING")
        paced.set()
        outcome = await job.outcome()
        decisions = await cluster.store.children(paths.decisions("parallel-work"))
        first = await cluster.store.get(f"{paths.decisions('parallel-work')}/{decisions[0]}")
        hints = await cluster.store.get(paths.CPU_HINTS)
    assert assignment is not None
    assert set(assignment[0]["instances"].values()) == {"worker-0"}
    assert reason == "change 1 done: work.1 runs on worker-1"
    assert first is not None
    assert len(decisions) == 1
    assert (first[0]["policy"], first[0]["action"]) == ("spread", "migrate work.1 to worker-1")
    assert first[0]["reason"].startswith("work is CPU-bound on worker-0: its 2 instances there take ")
    assert hints is not None
    assert list(hints[0]) == ["parallel-work"]
    assert list(hints[0]["parallel-work"]) == ["work"]
    assert hints[0]["parallel-work"]["work"]["job"] == "parallel-work"
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert len(outcome.committed["out"]) == Paced.emitted


async def test_a_task_hinted_cpu_bound_is_placed_spread_from_the_start(paced: asyncio.Event) -> None:
    """With a CPU hint for 'work' of the topology (from an earlier run), the scheduler gives its instances a
    worker each; the cheap stages are co-located as ever: the source with work.0, the sink (a tie between its
    upstream instances) with work.1, on the less loaded worker."""
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        hint = {"cpu": 0.9, "at": 0.0, "job": "earlier"}  # as the loop left it
        await cluster.store.create(paths.CPU_HINTS, {"parallel-work": {"work": hint}})
        job = await cluster.submit(parallel_work, checkpoint_interval=None, adapt=AdaptSettings(frozenset()))
        _, reason = await job.wait_for("SCHEDULED")
        await job.wait_for("RUNNING")
        assignment = await cluster.store.get(paths.assignment("parallel-work"))
        paced.set()
        outcome = await job.outcome()
    assert reason == "assigned to worker-0, worker-1 (work spread: CPU hint)"
    assert assignment is not None
    assert assignment[0]["instances"] == {
        "feed.0": "worker-0", "work.0": "worker-0", "work.1": "worker-1", "out.0": "worker-1",
    }  # fmt: skip
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert len(outcome.committed["out"]) == Paced.emitted
