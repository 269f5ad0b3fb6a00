"""Whole jobs with every channel over loopback TCP give exactly the in-memory sink output."""

from __future__ import annotations

import asyncio

import pytest

import streamlet as sl
from examples import wordcount
from streamlet.errors import RecordTooLarge
from streamlet.transport.codec import DEFAULT_MAX_FRAME
from streamlet.transport.tcp import ServerStatistics
from streamlet.transport.tcp_client import open_loopback_transport
from tests.conftest import pairs
from tests.support import event_time_job
from tests.unit.core.test_cycles import halving_loop


async def in_memory(topology: sl.Topology) -> sl.JobResult:
    """Run ``topology`` with in-memory channels."""
    async with asyncio.timeout(5), sl.start(topology) as job:
        return await job.wait()


async def over_tcp(topology: sl.Topology, max_frame: int = DEFAULT_MAX_FRAME) -> tuple[sl.JobResult, ServerStatistics]:
    """Run ``topology`` with every channel over loopback TCP; the result and the server's counters."""
    async with (
        asyncio.timeout(5),
        open_loopback_transport(max_frame=max_frame) as transport,
        sl.start(topology, channel_factory=transport.channel_factory) as job,
    ):
        return await job.wait(), transport.server.statistics()


async def test_wordcount_over_tcp_equals_in_memory() -> None:
    """examples/wordcount.py gives the same word counts with every channel over TCP."""
    expected = wordcount.word_counts(await in_memory(wordcount.build_topology()))
    result, stats = await over_tcp(wordcount.build_topology())
    assert wordcount.word_counts(result) == expected
    assert (stats.connections, stats.bad_frames, stats.duplicates) == (1, 0, 0)


def fan_out_topology() -> sl.Topology:
    """numbers -> double (x2) -> total (x2, SAME_KEY) -> 'totals'; double -> 'doubled' too."""
    topology = sl.Topology("fan-out")
    source = topology.add_source("numbers", [(f"k{n % 7}", n) for n in range(500)])
    doubled = topology.map("double", lambda r: (r.key, r.value * 2), parallelism=2).set_input(source)
    total = topology.add_task("total", wordcount.CountWords, parallelism=2)
    total.set_input(doubled, partitioning=sl.SAME_KEY)
    topology.add_sink("doubled", sl.CollectSink()).set_input(doubled)
    topology.add_sink("totals", sl.CollectSink()).set_input(total)
    return topology


async def test_parallel_same_key_two_sinks_over_tcp_equals_in_memory() -> None:
    """Parallelism 2, SAME_KEY and two sinks: both sinks hold the same records over TCP as in memory."""
    expected = await in_memory(fan_out_topology())
    result, stats = await over_tcp(fan_out_topology())
    assert sorted(pairs(result.sink("doubled"))) == sorted(pairs(expected.sink("doubled")))
    assert sorted(pairs(result.sink("totals"))) == sorted(pairs(expected.sink("totals")))
    assert dict(pairs(expected.sink("totals"))) == {f"k{k}": sum(range(2 * k, 1000, 14)) for k in range(7)}
    assert len(result.sink("doubled")) == 500
    assert (stats.connections, stats.bad_frames, stats.duplicates) == (1, 0, 0)


async def test_loop_over_tcp_equals_in_memory() -> None:
    """A cycle with an iteration limit: same sink and drop count over TCP (records keep their iteration)."""
    expected = await in_memory(halving_loop([1, 2, 8, 16, 1024], limit=3))
    result, stats = await over_tcp(halving_loop([1, 2, 8, 16, 1024], limit=3))
    assert sorted(pairs(expected.sink("done"))) == [("1", 0), ("2", 1), ("8", 3)]
    assert (sorted(pairs(result.sink("done"))), result.statistics.dropped) == (sorted(pairs(expected.sink("done"))), 2)
    assert (stats.connections, stats.bad_frames) == (1, 0)


async def test_window_bounds_reach_a_sink_over_tcp() -> None:
    """window_reduce results keep window_start/window_end through a TCP channel to the sink."""
    topology = sl.Topology("windows")
    source = topology.add_source("in", [sl.Record(f"k{n % 3}", n, n * 0.5) for n in range(40)])
    sums = topology.window_reduce("sums", "sum", window=sl.TimeWindow(5.0, time="event")).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    result, _ = await over_tcp(topology)
    rows = sorted((r.key, r.value, r.window_start, r.window_end) for r in result.sink("out"))
    expected: dict[tuple[str, float], int] = {}
    for n in range(40):
        start = n * 0.5 - n * 0.5 % 5.0
        expected[f"k{n % 3}", start] = expected.get((f"k{n % 3}", start), 0) + n
    assert rows == sorted((key, total, start, start + 5.0) for (key, start), total in expected.items())


async def test_loop_with_batches_in_pieces_equals_in_memory() -> None:
    """A 256-byte frame limit splits the loop's batches; the loop still ends exactly as in memory."""
    numbers = list(range(1, 300))
    expected = await in_memory(halving_loop(numbers, limit=5))
    result, stats = await over_tcp(halving_loop(numbers, limit=5), max_frame=256)
    assert sorted(pairs(result.sink("done"))) == sorted(pairs(expected.sink("done")))
    assert result.statistics.dropped == expected.statistics.dropped > 0
    assert stats.bad_frames == 0  # unsplit, the source's batch of 299 records (~2.5 KB) would be refused for ever


async def test_record_over_the_frame_limit_fails_the_job() -> None:
    """A record bigger than the frame limit stops the job with RecordTooLarge naming the channel."""
    topology = sl.Topology("big")
    source = topology.add_source("in", [("small", "x"), ("huge", "x" * 5000)])
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    with pytest.raises(RecordTooLarge, match=r"^channel 'c1' cannot send the record with key 'huge': alone it needs"):
        await over_tcp(topology, max_frame=4096)


def rows(records: list[sl.Record]) -> list[tuple[object, object, object, object]]:
    """Records as sortable rows: key, value, ts and window bounds."""
    return sorted((r.key, r.value, r.ts, r.window) for r in records)


@pytest.mark.parametrize("parallelism", [1, 2, 3])
async def test_an_event_time_job_gives_the_same_output_at_any_parallelism_in_memory_and_over_tcp(
    parallelism: int,
) -> None:
    """Cascaded event-time sums with late records: the sums and the late records are those of parallelism 1
    in memory, at parallelism 1, 2 and 3, in memory and with every channel (and watermark) over TCP."""
    reference = await in_memory(event_time_job.build_topology(1))
    late = rows(reference.sink("late"))
    assert len(late) == 10  # the job has late records, and they are the same everywhere below
    memory = await in_memory(event_time_job.build_topology(parallelism))
    tcp, stats = await over_tcp(event_time_job.build_topology(parallelism))
    for result in (memory, tcp):
        assert (rows(result.sink("sums")), rows(result.sink("late"))) == (rows(reference.sink("sums")), late)
    assert stats.bad_frames == 0


async def test_late_firings_keep_their_mark_over_tcp() -> None:
    """allowed_lateness: the late firing of a window crosses TCP as a FiredWindowRecord marked 'late'."""
    topology = sl.Topology("late-firings")
    records = [sl.Record("k", 1, 1.0), sl.Record("k", 1, 12.0), sl.Record("k", 5, 8.0)]
    source = topology.add_source("in", records)
    window = sl.TimeWindow(10, time="event", allowed_lateness=10)
    sums = topology.window_reduce("sums", "sum", window=window).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    async with (
        asyncio.timeout(5),
        open_loopback_transport() as transport,
        sl.start(topology, channel_factory=transport.channel_factory, batch_size=1) as job,
    ):
        result = await job.wait()
    fired = [(r.key, r.value, r.window, r.firing, type(r).__name__) for r in result.sink("out")]
    assert fired == [
        ("k", 1, (0.0, 10.0), "on_time", "WindowRecord"),
        ("k", 6, (0.0, 10.0), "late", "FiredWindowRecord"),
        ("k", 1, (10.0, 20.0), "on_time", "WindowRecord"),
    ]


async def test_a_rescale_runs_over_tcp_channels() -> None:
    """Every channel TCP (RECONFIGURE frames, channels to new instances opened while running): a keyed
    count rescaled 2 -> 3 -> 1 keeps every key's counts exact and in order."""
    topology = sl.Topology("tcp-rescale")
    source = topology.add_source("in", sl.QueueSource())
    counts = topology.reduce("count", lambda total, one: total + one, parallelism=2, emit="record")
    counts.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    async with (
        asyncio.timeout(20),
        open_loopback_transport() as transport,
        sl.start(topology, channel_factory=transport.channel_factory, batch_size=100) as job,
    ):
        for i in range(3000):
            await job.send("in", f"k{i % 31}", 1)
            if i in (1000, 2000):
                await job.rescale("count", 3 if i == 1000 else 1)
        await job.close_source("in")
        result = await job.wait()
    running: dict[str, list[int]] = {}
    for record in result.sink("out"):
        running.setdefault(record.key, []).append(record.value)
    assert sorted(running) == sorted(f"k{i}" for i in range(31))
    assert all(values == list(range(1, len(values) + 1)) for values in running.values())
    assert sum(len(values) for values in running.values()) == 3000
    assert job.reconfigurations == 2
