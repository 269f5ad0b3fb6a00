"""The job ``python -m benchmarks rescale`` runs on a local cluster: a paced keyed count, stamped at processing.

``paced`` reads ``STREAMLET_BENCH_TOTAL`` records (keys ``i % STREAMLET_BENCH_KEYS``) at
``STREAMLET_BENCH_RATE`` records/s, from a position (seekable, so a job resumed from a
savepoint reads on). Record ``i`` is due at ``origin + i / rate`` on the wall clock, the origin
being when the variant's first job began (kept in a file beside the output, shared by the
restart baseline's three jobs): a job resumed from a savepoint catches up the records that
came due while it was stopped, as a live source's backlog would, just as the live job does
after its rescales. ``stamp`` adds the wall-clock time at which each running count was made;
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
    """``total`` records over ``keys`` keys at ``rate`` records/s from the origin kept in ``origin_file``."""

    def __init__(self, total: int, keys: int, rate: float, origin_file: Path) -> None:
        self.total, self.keys, self.rate, self.origin_file = total, keys, rate, origin_file

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _PacedReader(self, _origin(self.origin_file))


def _origin(path: Path) -> float:
    """The wall-clock time the variant's first job began: written by that job, read by the later ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x", encoding="ascii") as handle:
            now = time.time()
            handle.write(repr(now))
            return now
    except FileExistsError:
        return float(path.read_text(encoding="ascii"))


class _PacedReader(sl.SourceReader):
    def __init__(self, source: Paced, origin: float) -> None:
        self.source = source
        self.index = 0
        self.origin = origin

    async def read(self, max_records: int) -> list[sl.Record] | None:
        source = self.source
        if self.index >= source.total:
            return None
        due = self.origin + self.index / source.rate
        await asyncio.sleep(max(0.0, due - time.time()))  # pacing the workload at the given rate
        end = min(self.index + BATCH, source.total)
        batch = [sl.Record(i % source.keys, 1, None) for i in range(self.index, end)]
        self.index = end
        return batch

    def position(self) -> int:
        return self.index

    async def seek(self, position: int) -> None:
        self.index = position  # the origin stays: what came due meanwhile is read at once


def _build(job: str) -> sl.Topology:
    total = int(os.environ["STREAMLET_BENCH_TOTAL"])
    keys = int(os.environ["STREAMLET_BENCH_KEYS"])
    rate = float(os.environ["STREAMLET_BENCH_RATE"])
    out = Path(os.environ["STREAMLET_BENCH_OUT"])
    topology = sl.Topology("rescale")
    source = topology.add_source("paced", Paced(total, keys, rate, out / f"{_variant(job)}.origin"))
    count = topology.reduce("count", lambda total, one: total + one, parallelism=2)
    count.set_input(source, partitioning=sl.SAME_KEY)
    stamp = topology.map("stamp", lambda record: (record.key, [record.value, time.time()])).set_input(count)
    topology.add_sink("out", sl.FileSink(out / job)).set_input(stamp)
    return topology


def _variant(job: str) -> str:
    """``live``, or ``restart`` for the three jobs of the stop-and-restore baseline (one origin)."""
    return "live" if job == "live" else "restart"


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
