"""The job ``python -m benchmarks rescale`` runs on a local cluster: a paced keyed count, stamped at processing.

``paced`` reads ``STREAMLET_BENCH_TOTAL`` records (keys ``i % STREAMLET_BENCH_KEYS``) at
``STREAMLET_BENCH_RATE`` records/s, from a position (seekable, so a job resumed from a
savepoint reads on). ``stamp`` adds the wall-clock time at which each running count was made;
the sink writes JSON lines to ``STREAMLET_BENCH_OUT/<job>`` (exactly once, with checkpoints).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import streamlet as sl

BATCH = 500


class Paced(sl.Source):
    """``total`` records over ``keys`` keys at ``rate`` records/s."""

    def __init__(self, total: int, keys: int, rate: float) -> None:
        self.total, self.keys, self.rate = total, keys, rate

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _PacedReader(self)


class _PacedReader(sl.SourceReader):
    def __init__(self, source: Paced) -> None:
        self.source = source
        self.index = 0
        self.began = time.monotonic()
        self.start = 0

    async def read(self, max_records: int) -> list[sl.Record] | None:
        source = self.source
        if self.index >= source.total:
            return None
        due = self.began + (self.index - self.start) / source.rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))  # pacing the workload at the given rate
        end = min(self.index + BATCH, source.total)
        batch = [sl.Record(i % source.keys, 1, None) for i in range(self.index, end)]
        self.index = end
        return batch

    def position(self) -> int:
        return self.index

    async def seek(self, position: int) -> None:
        self.index = self.start = position
        self.began = time.monotonic()


def _build(job: str) -> sl.Topology:
    total = int(os.environ["STREAMLET_BENCH_TOTAL"])
    keys = int(os.environ["STREAMLET_BENCH_KEYS"])
    rate = float(os.environ["STREAMLET_BENCH_RATE"])
    topology = sl.Topology("rescale")
    source = topology.add_source("paced", Paced(total, keys, rate))
    count = topology.reduce("count", lambda total, one: total + one, parallelism=2)
    count.set_input(source, partitioning=sl.SAME_KEY)
    stamp = topology.map("stamp", lambda record: (record.key, [record.value, time.time()])).set_input(count)
    topology.add_sink("out", sl.FileSink(Path(os.environ["STREAMLET_BENCH_OUT"]) / job)).set_input(stamp)
    return topology


def live() -> sl.Topology:
    """The job rescaled live."""
    return _build("live")


def first() -> sl.Topology:
    """The restart baseline, before the first change."""
    return _build("first")


def second() -> sl.Topology:
    """The restart baseline, between the changes."""
    return _build("second")


def third() -> sl.Topology:
    """The restart baseline, after the second change."""
    return _build("third")
