"""A slow keyed count over 100 000 keys for the recovery measurement: long enough to kill a worker in the
middle, with state worth replicating (its two count instances hold 50 000 keys each)."""

from __future__ import annotations

import asyncio

import streamlet as sl

KEYS = 100_000
RECORDS = 400_000


class Slow(sl.Task):
    """Passes words on as (word, 1), 25 ms per batch."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await asyncio.sleep(0.025)
        outputs.emit_batch([sl.Record(r.value, 1, r.ts) for r in inputs.get()])


class Count(sl.Task):
    """Keyed totals; at the end, how many keys it holds and their sum (100 000 totals are too many to report
    through ZooKeeper, whose nodes hold at most 1 MB)."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)

    def finish(self, outputs: sl.Outputs) -> None:
        totals = dict(self.state.items())
        outputs.emit("summary", [len(totals), sum(totals.values())])


def words() -> list[str]:
    """Every key once in each quarter, in another order each time."""
    return [f"k{(i * 7919) % KEYS}" for i in range(RECORDS)]


def build_topology() -> sl.Topology:
    """words -> slow -> count (x2, SAME_KEY) -> totals."""
    topology = sl.Topology("slow-count")
    source = topology.add_source("words", words())
    slow = topology.add_task("slow", Slow).set_input(source)
    count = topology.add_task("count", Count, parallelism=2).set_input(slow, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(count)
    return topology
