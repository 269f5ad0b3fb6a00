"""SESSION_TABLE on an embedded job: the senders count each segment's records, the balancer moves segments
live (state with them, no key's records lost or reordered), by hand and from the adaptation loop."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any, ClassVar

import pytest

import streamlet as sl
from streamlet.adaptation.session_table import imbalance, instance_loads
from streamlet.backends.local_adaptation import LocalAdaptation
from streamlet.core.model.segments import SegmentTable, segment_of

# 30 keys in the first quarter of the segments (instance 0's under contiguous ranges) and 6 elsewhere
CROWDED = [key for key in (f"user{n}" for n in range(2_000)) if segment_of(key, 128) < 32][:30]
SPREAD = [key for key in (f"user{n}" for n in range(2_000)) if segment_of(key, 128) >= 32][:6]
KEYS = CROWDED + SPREAD


def counting(partitioning: sl.Partitioning = sl.SESSION_TABLE) -> sl.Topology:
    """events (sent by the test) -> a running count per key over 4 instances -> collected."""
    topology = sl.Topology("counts")
    events = topology.add_source("events", sl.QueueSource())
    count = topology.reduce("count", lambda total, one: total + one, parallelism=4, emit="record")
    count.set_input(events, partitioning=partitioning)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology


def running_totals(records: list[sl.Record]) -> dict[Any, list[int]]:
    found: dict[Any, list[int]] = defaultdict(list)
    for record in records:
        found[record.key].append(record.value)
    return found


async def test_senders_count_each_segments_records() -> None:
    keys = [KEYS[n % len(KEYS)] for n in range(720)]
    async with sl.start(counting()) as job:
        for key in keys:
            await job.send("events", key, 1)
        await job.close_source("events")
        result = await job.wait()
        loads = job.segment_loads("count")
    expected = Counter(segment_of(key, 128) for key in keys)
    assert loads == [expected.get(segment, 0) for segment in range(128)]
    assert {key: totals[-1] for key, totals in running_totals(result.sink("out")).items()} == Counter(keys)


async def test_same_key_edges_count_nothing() -> None:
    async with sl.start(counting(sl.SAME_KEY)) as job:
        await job.send("events", "user1", 1)
        await job.close_source("events")
        await job.wait()
        assert job.segment_loads("count") == [0] * 128


async def test_the_balancer_moves_segments_live_and_every_key_keeps_its_count_in_order() -> None:
    """Phase 1 sends each key 20 times (instance 0 gets 30 of the 36 keys); one look of the balance policy
    moves segments off instance 0, with their counts; phase 2 sends the same again: each instance's share of
    it is what the balancer predicted from phase 1, and every key's running totals are 1..40 in order."""
    async with sl.start(counting()) as job:
        adaptation = LocalAdaptation(job, sl.AdaptSettings(frozenset({"balance"})))
        for _ in range(20):
            for key in KEYS:
                await job.send("events", key, 1)
        await job.settle()
        decision = await adaptation.look()
        table = job.segment_table("count")
        before = {s.index: s.records_in for s in job.instance_statistics() if s.node == "count"}
        for _ in range(20):
            for key in KEYS:
                await job.send("events", key, 1)
        await job.settle()
        after = {s.index: s.records_in for s in job.instance_statistics() if s.node == "count"}
        await job.close_source("events")
        result = await job.wait()
    phase_one = [0] * 128
    for key in KEYS:
        phase_one[segment_of(key, 128)] += 20
    predicted = instance_loads(phase_one, table.owners, 4)
    moved = sum(now != then for now, then in zip(table.owners, SegmentTable.contiguous(128, 4).owners, strict=True))
    assert decision is not None
    assert moved > 0
    assert (decision["policy"], decision["action"]) == ("balance", f"move {moved} segments of count")
    assert job.decisions == [decision]
    assert table.version == 1
    assert [after[index] - before[index] for index in range(4)] == predicted
    assert imbalance(predicted) < imbalance(instance_loads(phase_one, SegmentTable.contiguous(128, 4).owners, 4))
    assert running_totals(result.sink("out")) == {key: list(range(1, 41)) for key in KEYS}


class Feed:
    """The job the skewed source watches: it stops once the job has a decision."""

    job: ClassVar[sl.Job | None] = None
    sent: ClassVar[Counter[str]] = Counter()


class UntilDecided(sl.Source):
    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _UntilDecided()


class _UntilDecided(sl.SourceReader):
    async def read(self, max_records: int) -> list[sl.Record] | None:
        if Feed.job is not None and Feed.job.decisions:
            return None
        Feed.sent.update(KEYS)
        return [sl.Record(key, 1, None) for key in KEYS]


async def test_the_adaptation_loop_balances_a_running_job() -> None:
    Feed.job, Feed.sent = None, Counter()
    topology = sl.Topology("until-balanced")
    events = topology.add_source("events", UntilDecided())
    count = topology.reduce("count", lambda total, one: total + one, parallelism=4, emit="record")
    count.set_input(events, partitioning=sl.SESSION_TABLE)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    settings = sl.AdaptSettings(frozenset({"balance"}), interval=0.05, cooldown=0)
    async with sl.start(topology, adapt=settings) as job:
        Feed.job = job
        result = await job.wait()
    assert [decision["policy"] for decision in job.decisions] == ["balance"]
    assert job.segment_table("count").version == 1
    finals = {key: totals for key, totals in running_totals(result.sink("out")).items()}
    assert {key: totals[-1] for key, totals in finals.items()} == dict(Feed.sent)
    assert all(totals == list(range(1, len(totals) + 1)) for totals in finals.values())


@pytest.mark.parametrize("policy", ["rebalance", "migrate", "spread"])
def test_moving_instances_between_workers_needs_a_cluster(policy: str) -> None:
    with pytest.raises(sl.JobError, match=f"the {policy} policy moves instances between workers: it needs a cluster"):
        sl.run(counting(), adapt=sl.AdaptSettings(frozenset({policy})))


WORK_RATE = 4_000  # records a second one instance of 'work' gets through: it awaits per batch (I/O-bound)


class Eager:
    """The eager source's switch and tally, and the event 'work' sets once it has done enough to measure."""

    stop: ClassVar[asyncio.Event]
    measured: ClassVar[asyncio.Event]
    later: ClassVar[asyncio.Event] = asyncio.Event()  # 20 batches after that
    emitted: ClassVar[int] = 0
    batches: ClassVar[int] = 0


class EagerSource(sl.Source):
    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _EagerReader()


class _EagerReader(sl.SourceReader):
    async def read(self, max_records: int) -> list[sl.Record] | None:
        if Eager.stop.is_set():
            return None
        Eager.emitted += 100
        return [sl.Record(n, 1, None) for n in range(100)]


class Work(sl.Task):
    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        batch = inputs.get()
        await asyncio.sleep(len(batch) / WORK_RATE)  # the work itself: a call to a service
        outputs.emit_batch(batch)
        Eager.batches += 1
        if Eager.batches == 20:
            Eager.measured.set()
        if Eager.batches == 40:
            Eager.later.set()


async def test_embedded_autoscale_gives_an_io_bound_bottleneck_more_instances() -> None:
    Eager.stop, Eager.measured, Eager.emitted, Eager.batches = asyncio.Event(), asyncio.Event(), 0, 0
    topology = sl.Topology("io-bound")
    source = topology.add_source("feed", EagerSource())
    work = topology.add_task("work", Work).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(work)
    settings = sl.AdaptSettings(frozenset({"autoscale"}), {"work": (1, 3)})
    async with sl.start(topology, batch_size=100) as job:
        adaptation = LocalAdaptation(job, settings)
        await Eager.measured.wait()
        decision = await adaptation.look()
        instances = job.segment_table("work").instances
        Eager.stop.set()
        result = await job.wait()
    assert decision is not None
    assert (decision["policy"], decision["action"]) == ("autoscale", "rescale work 1 -> 3")
    assert "had 1, bounds 1..3" in decision["reason"]
    assert instances == 3
    assert len(result.sink("out")) == Eager.emitted


async def test_embedded_shedding_sheds_at_a_held_back_source_and_accounts_for_every_record() -> None:
    """'work' holds the eager source back and cannot grow (no autoscale): the shed policy sheds 10% at the
    source; what 'out' got and what went to the SHED port add up to what the source read."""
    Eager.stop, Eager.measured, Eager.emitted, Eager.batches = asyncio.Event(), asyncio.Event(), 0, 0
    Eager.later = asyncio.Event()
    topology = sl.Topology("overloaded").set_qos(sl.QoS(max_latency=5.0, max_shed_ratio=0.5))
    source = topology.add_source("feed", EagerSource())
    work = topology.add_task("work", Work).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(work)
    topology.add_sink("shed", sl.CollectSink()).set_input(source, out_port=sl.SHED)
    async with sl.start(topology, batch_size=100) as job:
        adaptation = LocalAdaptation(job, sl.AdaptSettings(frozenset({"shed"})))
        await Eager.measured.wait()
        decision = await adaptation.look()
        ratio = job.shed_ratio
        await Eager.later.wait()  # some batches read while shedding
        Eager.stop.set()
        result = await job.wait()
    assert decision is not None
    assert (decision["policy"], decision["action"]) == ("shed", "shed 10% at the sources")
    assert decision["reason"].startswith("sources held back ")
    assert ratio == 0.1
    assert len(result.sink("shed")) == job.statistics().shed > 0
    assert len(result.sink("out")) + len(result.sink("shed")) == Eager.emitted
