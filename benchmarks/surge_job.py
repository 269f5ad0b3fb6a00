"""The job ``python -m benchmarks surge`` runs on a local cluster: an open-loop load that surges tenfold.

``gen`` is an open-loop generator: record n is *due* at a fixed time (BASE records/s for BEFORE seconds,
SURGE_FACTOR times that for SURGE seconds, BASE again for AFTER seconds); its value is that due time, so
latency counts from when the record should have arrived, not from when the source got round to it (a
source held back by backpressure makes its records late). ``work`` is a server of CAPACITY records/s per
instance (an awaited call per batch: adding instances adds capacity, on any number of cores); BASE is a
fifth of one instance's capacity, the surge twice it. ``out`` and ``dropped`` (the source's SHED port)
count records and latencies per wall-clock second into ``STREAMLET_BENCH_OUT/<job id>-<sink>-<pid>.json``
when they end.
The topology's QoS: 1 s, at most half the input shed.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import streamlet as sl

CAPACITY = 5_000  # records/s one instance of 'work' gets through
BASE = CAPACITY // 5
SURGE_FACTOR = 10
BEFORE, SURGE, AFTER = 10.0, 20.0, 15.0
BATCH = 100
QOS = sl.QoS(max_latency=1.0, max_shed_ratio=0.5)


def due(record: int) -> float:
    """Seconds into the run when record number ``record`` is due."""
    before = BEFORE * BASE
    during = SURGE * BASE * SURGE_FACTOR
    if record < before:
        return record / BASE
    if record < before + during:
        return BEFORE + (record - before) / (BASE * SURGE_FACTOR)
    return BEFORE + SURGE + (record - before - during) / BASE


TOTAL = int(BEFORE * BASE + SURGE * BASE * SURGE_FACTOR + AFTER * BASE)


class Generator(sl.Source):
    """TOTAL records, each on its schedule from when the source opens (wall clock: it crosses processes)."""

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _Schedule(time.time())


class _Schedule(sl.SourceReader):
    def __init__(self, start: float) -> None:
        self.start, self.sent = start, 0

    async def read(self, max_records: int) -> list[sl.Record] | None:
        if self.sent >= TOTAL:
            return None
        count = min(BATCH, TOTAL - self.sent)
        wait = self.start + due(self.sent + count - 1) - time.time()
        if wait > 0:
            await asyncio.sleep(wait)  # the schedule: an open loop
        batch = [sl.Record(n % 100, self.start + due(n), None) for n in range(self.sent, self.sent + count)]
        self.sent += count
        return batch


class Work(sl.Task):
    """CAPACITY records/s per instance: an awaited call per batch."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        batch = inputs.get()
        await asyncio.sleep(len(batch) / CAPACITY)
        outputs.emit_batch(batch)


class PerSecond(sl.Sink):
    """Counts records and their latency (now - due time) per second of the run; written to a file at the end."""

    def __init__(self, name: str) -> None:
        self.name = name

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        return _PerSecondWriter(f"{context.job_id}-{self.name}-{os.getpid()}")


class _PerSecondWriter(sl.SinkWriter):
    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: dict[int, int] = defaultdict(int)  # by wall-clock second
        self.latency: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # second -> ms -> records

    def write(self, batch: list[sl.Record]) -> None:
        now = time.time()
        second = int(now)
        self.counts[second] += len(batch)
        histogram = self.latency[second]
        for record in batch:
            histogram[int(max(now - record.value, 0.0) * 1000)] += 1

    def close(self) -> None:
        out = Path(os.environ["STREAMLET_BENCH_OUT"]) / f"{self.name}.json"
        data: dict[str, Any] = {
            "counts": dict(self.counts),
            "latency": {second: dict(histogram) for second, histogram in self.latency.items()},
        }
        out.write_text(json.dumps(data), encoding="utf-8")


def surge() -> sl.Topology:
    """gen -> work (1 instance to begin with) -> out; gen's shed records -> dropped."""
    topology = sl.Topology("surge").set_qos(QOS)
    source = topology.add_source("gen", Generator())
    work = topology.add_task("work", Work, max_parallelism=16).set_input(source)
    topology.add_sink("out", PerSecond("out")).set_input(work)
    topology.add_sink("dropped", PerSecond("dropped")).set_input(source, out_port=sl.SHED)
    return topology
