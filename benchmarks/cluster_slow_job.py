"""A slow keyed count for the recovery measurement: long enough to kill a worker in the middle."""

from __future__ import annotations

import asyncio

import streamlet as sl


class Slow(sl.Task):
    """Passes words on as (word, 1), 50 ms per batch."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await asyncio.sleep(0.05)
        outputs.emit_batch([sl.Record(r.value, 1, r.ts) for r in inputs.get()])


class Count(sl.Task):
    """Keyed totals, emitted at the end."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(self.state.items())


def build_topology() -> sl.Topology:
    """words -> slow -> count (x2, SAME_KEY) -> totals."""
    topology = sl.Topology("slow-count")
    source = topology.add_source("words", [f"w{(i * 7919) % 97}" for i in range(100_000)])
    slow = topology.add_task("slow", Slow).set_input(source)
    count = topology.add_task("count", Count, parallelism=2).set_input(slow, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(count)
    return topology
