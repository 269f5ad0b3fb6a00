"""The jobs ``python -m benchmarks balance`` runs on a local cluster: Zipf-distributed keys into 4 instances.

``zipf`` sends ``PACED_RATE`` records/s for the first ``PACED_SECONDS`` (an offered load every
layout can take, to compare the workers' loads), then reads as fast as it is let until
``STREAMLET_BENCH_SECONDS`` (closed loop: backpressure from the fullest instance holds it back, to
compare throughput); keys drawn from ``KEYS`` ranks with exponent 1.1 or 1.5 (the job's name says
which; the same sequence every run). ``work`` keeps a count per key (keyed state, moved with its
segment) and is a server of fixed capacity per instance: each record costs ``COST``, ``CPU_COST`` of
it CPU work and the rest an awaited call (a model, a store with one connection), so a record's cost is
mostly time on its instance, not CPU on this 2-core machine, and an instance with more keys' records
is a bottleneck whatever the cores. ``hashed_*`` route by ``SAME_KEY``, ``session_*`` by
``SESSION_TABLE``.
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
CPU_COST = 10e-6  # of which CPU work (parsing, scoring): what makes a worker's CPU load follow its records
SEED = 11
PACED_RATE = 20_000  # records/s in the paced phase: below what hashing gets through at either exponent
PACED_SECONDS = 12.0


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
        self.keys, self.began, self.at, self.sent = keys, time.monotonic(), 0, 0
        self.ends, self.paced_until = self.began + seconds, self.began + PACED_SECONDS

    async def read(self, max_records: int) -> list[sl.Record] | None:
        now = time.monotonic()
        if now >= self.ends:
            return None
        if now < self.paced_until:  # the paced phase: the next batch is due at its place in the schedule
            await asyncio.sleep(max(0.0, self.began + self.sent / PACED_RATE - now))
        self.sent += BATCH
        keys, at = self.keys, self.at
        batch = [sl.Record(keys[(at + n) % len(keys)], 1, None) for n in range(BATCH)]
        self.at = (at + BATCH) % len(keys)
        return batch


class Work(sl.Task):
    """A count per key and CPU_COST of CPU per record, then an awaited call: COST per record in all."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        batch = inputs.get()
        state = self.state
        began = time.perf_counter()
        for record in batch:
            state.put(record.key, state.get(record.key, 0) + 1)
        while time.perf_counter() < began + len(batch) * CPU_COST:
            pass  # the CPU part of the work
        await asyncio.sleep(len(batch) * (COST - CPU_COST))  # the instance's fixed capacity: the call it makes


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
