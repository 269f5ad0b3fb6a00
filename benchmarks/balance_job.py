"""The jobs ``python -m benchmarks balance`` runs on a local cluster: Zipf-distributed keys into 4 instances.

``zipf`` reads for ``STREAMLET_BENCH_SECONDS`` as fast as it is let (closed loop: backpressure from the
fullest instance holds it back), keys drawn from ``KEYS`` ranks with exponent 1.1 or 1.5 (the job's
name says which; the same sequence every run). ``work`` keeps a count per key (keyed state,
moved with its segment) and is a server of fixed capacity per instance: each batch is an awaited call
taking ``COST`` per record (a model, a store with one connection), so a record's cost is time on its
instance, not CPU on this 2-core machine, and an instance with more keys' records is a bottleneck
whatever the cores. ``hashed`` routes by ``SAME_KEY``; ``session`` by ``SESSION_TABLE``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import streamlet as sl

KEYS = 10_000
BATCH = 500
COST = 50e-6  # seconds per record on one instance of 'work': 20 000 records/s each
SEED = 11


def zipf_keys(exponent: float, count: int) -> list[str]:
    """``count`` keys over KEYS ranks, rank r drawn with weight 1 / r ** exponent (fixed seed)."""
    weights = [1 / rank**exponent for rank in range(1, KEYS + 1)]
    return random.Random(SEED).choices([f"user{rank}" for rank in range(KEYS)], weights, k=count)


class Zipf(sl.Source):
    """Zipf keys for ``seconds``, as fast as they are taken."""

    def __init__(self, exponent: float, seconds: float) -> None:
        self.exponent, self.seconds = exponent, seconds

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _ZipfReader(zipf_keys(self.exponent, 200_000), self.seconds)


class _ZipfReader(sl.SourceReader):
    def __init__(self, keys: list[str], seconds: float) -> None:
        self.keys, self.ends, self.at = keys, time.monotonic() + seconds, 0

    async def read(self, max_records: int) -> list[sl.Record] | None:
        if time.monotonic() >= self.ends:
            return None
        keys, at = self.keys, self.at
        batch = [sl.Record(keys[(at + n) % len(keys)], 1, None) for n in range(BATCH)]
        self.at = (at + BATCH) % len(keys)
        return batch


class Work(sl.Task):
    """A count per key, then an awaited call costing COST per record."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        batch = inputs.get()
        state = self.state
        for record in batch:
            state.put(record.key, state.get(record.key, 0) + 1)
        await asyncio.sleep(len(batch) * COST)  # the instance's fixed capacity: the call it makes


def _build(partitioning: sl.Partitioning, exponent: float) -> sl.Topology:
    seconds = float(os.environ["STREAMLET_BENCH_SECONDS"])
    topology = sl.Topology("balance")
    source = topology.add_source("zipf", Zipf(exponent, seconds))
    topology.add_task("work", Work, parallelism=4).set_input(source, partitioning=partitioning)
    return topology


def hashed_11() -> sl.Topology:
    """SAME_KEY (each key's segment by contiguous ranges, never moved), exponent 1.1."""
    return _build(sl.SAME_KEY, 1.1)


def session_11() -> sl.Topology:
    """SESSION_TABLE (the balancer moves segments: submitted with --adapt balance), exponent 1.1."""
    return _build(sl.SESSION_TABLE, 1.1)


def hashed_15() -> sl.Topology:
    """SAME_KEY, exponent 1.5."""
    return _build(sl.SAME_KEY, 1.5)


def session_15() -> sl.Topology:
    """SESSION_TABLE, exponent 1.5."""
    return _build(sl.SESSION_TABLE, 1.5)
