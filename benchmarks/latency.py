"""Latency of a topology embedded in a service's loop, fed with ``job.send``.

First the peak: push records as fast as ``job.send`` takes them through
queue source -> parse -> enrich -> callback sink. Then pace the sends at
half that rate, in 1 ms ticks, and measure send -> sink callback per record.
The baseline is the same three stages written by hand with per-record
``asyncio.Queue`` hand-offs (what a service does without a framework),
measured the same way in the same run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

import streamlet as sl
from benchmarks.common import alternating, latency_ms, report

TICK = 0.001
Send = Callable[[float], Awaitable[None]]


async def _pace(send: Send, records: int, rate: float) -> None:
    """Send ``records`` at ``rate`` per second in bursts of one tick."""
    per_tick = max(1, round(rate * TICK))
    began = time.perf_counter()
    for sent in range(0, records, per_tick):
        for _ in range(min(per_tick, records - sent)):
            await send(time.perf_counter())
        delay = began + (sent + per_tick) / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


async def _flood(send: Send, records: int) -> None:
    for _ in range(records):
        await send(time.perf_counter())


def _topology(on_record: Callable[[sl.Record], None]) -> sl.Topology:
    topology = sl.Topology("latency-bench")
    requests = topology.add_source("requests", sl.QueueSource(maxsize=10_000))
    parse = topology.map("parse", lambda r: (r.key, r.value)).set_input(requests)
    enrich = topology.map("enrich", lambda r: (r.key, r.value)).set_input(parse)
    topology.add_sink("reply", sl.CallbackSink(on_record)).set_input(enrich)
    return topology


async def _streamlet(records: int, rate: float | None) -> tuple[float, list[float]]:
    """Seconds to deliver ``records`` (flooded, or paced at ``rate``) and each latency."""
    latencies: list[float] = []
    done = asyncio.Event()

    def on_record(record: sl.Record) -> None:
        latencies.append(time.perf_counter() - record.value)
        if len(latencies) == records:
            done.set()

    async with sl.start(_topology(on_record)) as job:

        async def send(stamp: float) -> None:
            await job.send("requests", "user42", stamp)

        began = time.perf_counter()
        await (_flood(send, records) if rate is None else _pace(send, records, rate))
        await done.wait()
        elapsed = time.perf_counter() - began
        await job.close_source("requests")
    return elapsed, latencies


async def _stage(inbox: asyncio.Queue[Any], out: asyncio.Queue[Any]) -> None:
    while (item := await inbox.get()) is not None:
        await out.put((item[0], item[1]))
    await out.put(None)


async def _baseline(records: int, rate: float | None) -> tuple[float, list[float]]:
    queues: list[asyncio.Queue[Any]] = [asyncio.Queue(10_000) for _ in range(3)]
    latencies: list[float] = []

    async def reply() -> None:
        while (item := await queues[2].get()) is not None:
            latencies.append(time.perf_counter() - item[1])

    async def send(stamp: float) -> None:
        await queues[0].put(("user42", stamp))

    workers = [asyncio.ensure_future(c) for c in (_stage(queues[0], queues[1]), _stage(queues[1], queues[2]), reply())]
    began = time.perf_counter()
    await (_flood(send, records) if rate is None else _pace(send, records, rate))
    await queues[0].put(None)
    await asyncio.gather(*workers)
    return time.perf_counter() - began, latencies


def main(records: int, repeats: int) -> dict[str, Any]:
    """Peak rates (median of ``repeats``), then latency at half of streamlet's peak."""
    timings = alternating(
        repeats,
        {
            "streamlet": lambda: uvloop.run(_streamlet(records, None)),
            "baseline": lambda: uvloop.run(_baseline(records, None)),
        },
    )
    peak = statistics.median(records / elapsed for _, (elapsed, _) in timings["streamlet"])
    base_peak = statistics.median(records / elapsed for _, (elapsed, _) in timings["baseline"])
    _, latencies = uvloop.run(_streamlet(records, peak / 2))
    _, base_latencies = uvloop.run(_baseline(records, peak / 2))
    return report(
        "latency",
        peak,
        base_peak,
        paced_rate=round(peak / 2),
        **latency_ms(latencies),
        **latency_ms(base_latencies, prefix="baseline_"),
        records=records,
    )
