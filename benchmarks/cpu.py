"""Queue-state CPU scheduling: a heavy task with a burst sharing one event loop with light tasks.

One heavy chain (an open-loop source at HEAVY_RATE records/s, twice that for
BURST seconds in the middle -> a task spending WORK_US of CPU per record -> a
sink) and LIGHTS light chains (LIGHT_RATE records/s each -> a cheap map -> a
sink) run side by side in one process for SECONDS. The burst asks for more
than the loop can give: the heavy task's queue goes RED. Run alternately under
queue-state scheduling (RED: 8 batches a turn, YELLOW 2, NORMAL 1) and plain
turn-taking (one batch each, the baseline). Latency counts from each record's
*scheduled* arrival (a source held back by backpressure makes it later) to
its sink, so the backlog of the burst is in the heavy figures.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import uvloop

import streamlet as sl

HEAVY_RATE = 8_000
LIGHT_RATE = 2_000
LIGHTS = 6
WORK_US = 60
BATCH = 50
SECONDS = 4.0
BURST = (1.5, 2.5)  # seconds into the run when the heavy source sends at twice its rate
CAPACITY = 16  # batches a channel holds: room for a queue to show its state


class OpenLoop(sl.Source):
    """``rate`` records a second (``burst`` times that inside BURST) for SECONDS; a record's value is its due time."""

    def __init__(self, rate: float, burst: float = 1.0) -> None:
        self.rate, self.burst = rate, burst

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _Schedule(self.rate, self.burst)


class _Schedule(sl.SourceReader):
    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.began = time.perf_counter()
        self.sent = 0

    def due(self, record: int) -> float:
        """When record number ``record`` is due, seconds into the run."""
        start, end = BURST
        before = start * self.rate  # records due before the burst
        during = (end - start) * self.rate * self.burst
        if record < before:
            return record / self.rate
        if record < before + during:
            return start + (record - before) / (self.rate * self.burst)
        return end + (record - before - during) / self.rate

    async def read(self, max_records: int) -> list[sl.Record] | None:
        if self.due(self.sent) >= SECONDS:
            return None
        wait = self.began + self.due(self.sent + BATCH - 1) - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        batch = [sl.Record(n % 10, self.began + self.due(self.sent + n), None) for n in range(BATCH)]
        self.sent += BATCH
        return batch


def _spin(record: sl.Record) -> tuple[Any, Any]:
    end = time.perf_counter() + WORK_US / 1_000_000
    while time.perf_counter() < end:  # CPU work standing for parsing, scoring, compressing
        pass
    return record.key, record.value


def _topology(latencies: dict[str, list[float]]) -> sl.Topology:
    topology = sl.Topology("cpu-bench")

    def sink(name: str) -> sl.CallbackSink:
        found = latencies.setdefault(name, [])
        return sl.CallbackSink(lambda record: found.append(time.perf_counter() - record.value))

    heavy_in = topology.add_source("heavy_in", OpenLoop(HEAVY_RATE, burst=2.0))
    heavy = topology.map("heavy", _spin).set_input(heavy_in)
    topology.add_sink("heavy_out", sink("heavy")).set_input(heavy)
    for index in range(LIGHTS):
        light_in = topology.add_source(f"light_in{index}", OpenLoop(LIGHT_RATE))
        light = topology.map(f"light{index}", lambda r: (r.key, r.value)).set_input(light_in)
        topology.add_sink(f"light_out{index}", sink("light")).set_input(light)
    return topology


def _percentile(values: list[float], share: float) -> float:
    return values[int(share * (len(values) - 1))] * 1000


async def _run(scheduling: str) -> dict[str, float]:
    latencies: dict[str, list[float]] = {}
    began = time.perf_counter()
    options = {"batch_size": BATCH, "channel_capacity": CAPACITY, "cpu_scheduling": scheduling}
    async with sl.start(_topology(latencies), **options) as job:
        await job.wait()
    elapsed = time.perf_counter() - began
    heavy, light = sorted(latencies["heavy"]), sorted(latencies["light"])
    return {
        "records_per_s": (len(heavy) + len(light)) / elapsed,
        "heavy_p99_ms": _percentile(heavy, 0.99),
        "heavy_p50_ms": _percentile(heavy, 0.5),
        "light_p99_ms": _percentile(light, 0.99),
        "light_p50_ms": _percentile(light, 0.5),
    }


def main(repeats: int) -> dict[str, Any]:
    """Alternate the two schedulings ``repeats`` times; medians of each figure."""
    runs: dict[str, list[dict[str, float]]] = {"queue-state": [], "turns": []}
    for repeat in range(repeats):
        order = ["queue-state", "turns"] if repeat % 2 == 0 else ["turns", "queue-state"]
        for scheduling in order:
            runs[scheduling].append(uvloop.run(_run(scheduling)))

    def median(scheduling: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[scheduling])

    line: dict[str, Any] = {
        "name": "cpu",
        "records_per_s": round(median("queue-state", "records_per_s")),
        "baseline_records_per_s": round(median("turns", "records_per_s")),
    }
    line["ratio"] = round(line["records_per_s"] / line["baseline_records_per_s"], 3)
    for key in ("heavy_p99_ms", "heavy_p50_ms", "light_p99_ms", "light_p50_ms"):
        line[key] = round(median("queue-state", key), 1)
        line[f"{key}_turns"] = round(median("turns", key), 1)
    line["heavy_p99_improvement"] = round(line["heavy_p99_ms_turns"] / line["heavy_p99_ms"], 2)
    line["repeats"] = repeats
    return line
