"""Per-instance statistics: records, batches, busy and blocked time, queue fill and state, latency."""

from __future__ import annotations

import asyncio

import pytest

import streamlet as sl
from streamlet.core.model.histogram import LatencyHistogram
from streamlet.core.runtime.statistics import QueueState, queue_state

WORK = 0.002  # seconds of (awaited) work per batch in the slow task below


class Slow(sl.Task):
    """Passes every batch on after WORK seconds (an awaited call standing for I/O or a model)."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await asyncio.sleep(WORK)  # the workload itself: what busy time must count
        outputs.emit_batch(inputs.get())


def slow_chain() -> sl.Topology:
    topology = sl.Topology("measured")
    source = topology.add_source("numbers", [(n % 7, n) for n in range(2_000)])
    slow = topology.add_task("slow", Slow).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(slow)
    return topology


def test_latencies_fall_in_doubling_buckets_and_quantiles_give_the_bucket_bound() -> None:
    histogram = LatencyHistogram()
    for seconds in [0.0000005, 0.000003, 0.000003, 0.001, 0.5]:
        histogram.add(seconds)
    assert histogram.total == 5
    assert histogram.quantile(0.2) == 1 / 1_000_000  # under 1 µs: the first bucket, bound 1 µs
    assert histogram.quantile(0.6) == 4 / 1_000_000  # 3 µs: bucket [2, 4) µs
    assert histogram.quantile(0.8) == 1024 / 1_000_000  # 1 ms: bucket [512, 1024) µs
    assert histogram.quantile(1.0) == 524288 / 1_000_000  # 0.5 s
    assert LatencyHistogram().quantile(0.99) is None
    later = histogram.copy()
    later.add(0.001)
    assert later.since(histogram).total == 1


@pytest.mark.parametrize(
    ("fill", "state"),
    [
        (0.0, QueueState.NORMAL),
        (0.49, QueueState.NORMAL),
        (0.5, QueueState.YELLOW),
        (0.8, QueueState.RED),
        (1.0, "RED"),
    ],
)
def test_queue_states_follow_the_fill_thresholds(fill: float, state: str) -> None:
    assert queue_state(fill) == state


async def test_a_running_jobs_instances_report_their_records_batches_busy_time_and_latency() -> None:
    async with sl.start(slow_chain(), batch_size=100) as job:
        await job.wait()
        snapshots = {(s.node, s.index): s for s in job.instance_statistics()}
    slow, source, sink = snapshots["slow", 0], snapshots["numbers", 0], snapshots["out", 0]
    assert (source.kind, source.records_in, source.records_out, source.batches) == ("source", 2_000, 2_000, 20)
    assert (slow.kind, slow.records_in, slow.records_out, slow.batches) == ("task", 2_000, 2_000, 20)
    assert slow.busy >= 20 * WORK  # every batch's awaited work counted as busy
    assert sum(slow.latency) == 20  # one latency per batch
    assert LatencyHistogram(slow.latency).quantile(0.5) >= WORK  # a batch stays at least its work long
    assert (sink.records_in, sink.queued, sink.fill, sink.state) == (2_000, 0, 0.0, "NORMAL")
    assert slow.to_data()["records_in"] == 2_000
