"""Embedding a job in a running event loop: start, send, statistics, stop, errors."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

import streamlet as sl
from tests.conftest import pairs, values


def service_topology(sink: sl.Sink) -> sl.Topology:
    topology = sl.Topology("service")
    requests = topology.add_source("requests", sl.QueueSource(maxsize=100))
    upper = topology.map("upper", lambda r: (r.key, r.value.upper())).set_input(requests)
    topology.add_sink("replies", sink).set_input(upper)
    return topology


async def test_send_close_and_wait_return_the_result() -> None:
    """Records pushed with job.send come out of the sink; close_source ends the job."""
    async with sl.start(service_topology(sl.CollectSink())) as job:
        for index in range(5):
            await job.send("requests", f"k{index}", f"v{index}", ts=float(index))
        await job.close_source("requests")
        result = await job.wait()
    assert pairs(result.sink("replies")) == [(f"k{i}", f"V{i}") for i in range(5)]
    assert [r.ts for r in result.sink("replies")] == [0.0, 1.0, 2.0, 3.0, 4.0]


async def test_a_single_record_is_delivered_without_waiting_for_a_full_batch() -> None:
    """A partial batch is flushed as soon as the inputs are idle."""
    arrived = asyncio.Event()
    async with sl.start(service_topology(sl.CallbackSink(lambda r: arrived.set()))) as job:
        await job.send("requests", "only", "one")
        await asyncio.wait_for(arrived.wait(), timeout=5)
        assert job.statistics().nodes["replies"].records_in == 1
        assert job.statistics().running is True


async def test_leaving_the_block_stops_sources_and_drains() -> None:
    """Exiting the context stops an endless source; everything it read reaches the sink."""
    seen: list[int] = []

    def endless() -> Iterator[int]:
        return itertools.count()

    class Endless(sl.Source):
        def open(self, context: sl.SourceContext) -> sl.SourceReader:
            return EndlessReader(endless())

    class EndlessReader(sl.SourceReader):
        def __init__(self, numbers: Iterator[int]) -> None:
            self.numbers = numbers

        async def read(self, max_records: int) -> list[sl.Record] | None:
            await asyncio.sleep(0.001)
            return [sl.Record(None, next(self.numbers)) for _ in range(10)]

    enough = asyncio.Event()

    def collect(record: sl.Record) -> None:
        seen.append(record.value)
        if len(seen) >= 50:
            enough.set()

    topology = sl.Topology("endless")
    source = topology.add_source("numbers", Endless())
    topology.add_sink("out", sl.CallbackSink(collect)).set_input(source)
    async with sl.start(topology) as job:
        await enough.wait()
    stats = job.statistics()
    assert stats.running is False
    assert seen == list(range(len(seen)))
    assert stats.nodes["numbers"].records_out == len(seen) == stats.nodes["out"].records_in


async def test_stop_closes_queue_sources() -> None:
    """job.stop() ends a QueueSource and waits until the job has drained."""
    async with sl.start(service_topology(sl.CollectSink())) as job:
        await job.send("requests", "a", "x")
        await job.stop()
        result = await job.wait()
    assert values(result.sink("replies")) == ["X"]


async def test_error_inside_the_block_cancels_the_job() -> None:
    """An exception in the embedding code propagates and the job is cancelled."""

    async def embed() -> None:
        async with sl.start(service_topology(sl.CollectSink())) as job:
            await job.send("requests", "a", "x")
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await embed()


async def test_task_failure_is_raised_from_wait() -> None:
    """A failing task stops the job; wait() raises the TaskError."""
    topology = sl.Topology("failing")
    requests = topology.add_source("requests", sl.QueueSource())
    node = topology.map("explode", lambda r: (r.key, 1 / 0)).set_input(requests)
    topology.add_sink("out", sl.CollectSink()).set_input(node)

    async def embed() -> None:
        async with sl.start(topology) as job:
            await job.send("requests", "k", 1)
            await job.wait()

    with pytest.raises(sl.TaskError, match=r"^task 'explode' instance 0 failed on record with key 'k'"):
        await embed()


async def test_send_to_unknown_or_closed_source_is_refused() -> None:
    """send names the job and the source it cannot feed."""
    async with sl.start(service_topology(sl.CollectSink())) as job:
        with pytest.raises(sl.JobError, match=r"^job 'service' has no QueueSource called 'nope'$"):
            await job.send("nope", "k", "v")
        await job.close_source("requests")
        with pytest.raises(sl.JobError, match=r"^source 'requests' of job 'service' is closed$"):
            await job.send("requests", "k", "v")


async def test_send_waits_while_the_queue_is_full() -> None:
    """A full QueueSource makes send wait (backpressure to the service)."""
    release = asyncio.Event()

    async def slow(record: sl.Record) -> None:
        await release.wait()

    topology = sl.Topology("full")
    requests = topology.add_source("requests", sl.QueueSource(maxsize=2))
    topology.add_sink("out", sl.CallbackSink(slow)).set_input(requests)
    async with sl.start(topology, batch_size=1, channel_capacity=1) as job:
        sent = 0

        async def push() -> None:
            nonlocal sent
            for index in range(50):
                await job.send("requests", index, index)
                sent += 1

        pusher = asyncio.ensure_future(push())
        await asyncio.sleep(0.05)
        blocked_at = sent
        release.set()
        await pusher
    assert blocked_at < 10
    assert sent == 50
