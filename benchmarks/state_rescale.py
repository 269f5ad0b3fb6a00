"""A live rescale of RocksDB state: segments handed over by range vs a split snapshot.

A keyed count on RocksDB (``cache_mb=256``) holds ``keys`` keys in 2 instances; the job is live-rescaled to 3
instances in this process, then back to 2. Measured: the time each ``job.rescale`` takes (the barrier, the
hand-over, the new instances taking their keys: the job's pause), with the exporters handing their leaving
segments over by range (a scan and a range delete per run of segments; the keys that stay are not read) and,
as the baseline, with the split snapshot every other state takes (each exporter's whole state read, split by
key, and its own part restored: what a RocksDB rescale did before). ``records_per_s``: keys held per second of
pause (``keys`` / the median pause); the counts are checked exact after both.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import streamlet as sl
from benchmarks.common import report
from streamlet.core.runtime.task_instance import TaskInstance


class Count(sl.Task):
    """A keyed count; at the end, the number of keys and the total counted."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        state = self.state
        for record in inputs.get():
            state.put(record.key, state.get(record.key, 0) + 1)

    def finish(self, outputs: sl.Outputs) -> None:
        keys = total = 0
        for _, count in self.state.items():
            keys += 1
            total += count
        outputs.emit("keys", keys)
        outputs.emit("total", total)


async def pauses(keys: int, folder: Path, repeats: int) -> list[float]:
    """Seconds of each rescale (2 -> 3 -> 2, ``repeats`` times) of a count holding ``keys`` keys."""
    topology = sl.Topology("state-rescale")
    source = topology.add_source("in", sl.QueueSource())
    counts = topology.add_task("count", Count, parallelism=2).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    seconds = []
    async with sl.start(topology, state_backend=sl.RocksDBState(folder, cache_mb=256), batch_size=4096) as job:
        for n in range(keys):
            await job.send("in", f"user-{n}", 1)
        await job.settle()
        for _ in range(repeats):
            for width in (3, 2):
                began = time.perf_counter()
                await job.rescale("count", width)
                seconds.append(time.perf_counter() - began)
        await job.close_source("in")
        result = await job.wait()
    found: dict[str, int] = {}
    for record in result.sink("out"):
        found[record.key] = found.get(record.key, 0) + record.value
    assert found == {"keys": keys, "total": keys}, found
    return seconds


def main(keys: int, repeats: int) -> dict[str, Any]:
    """Rescales of a ``keys``-key RocksDB count, ``repeats`` round trips each way."""
    folder = Path(tempfile.mkdtemp(prefix="streamlet-bench-state-rescale-"))
    began = time.perf_counter()
    by_range_check = TaskInstance._rocks_by_segment
    try:
        by_range = asyncio.run(pauses(keys, folder / "by-range", repeats))
        TaskInstance._rocks_by_segment = lambda self, segments: False  # type: ignore[method-assign]
        try:
            split = asyncio.run(pauses(keys, folder / "split", repeats))
        finally:
            TaskInstance._rocks_by_segment = by_range_check  # type: ignore[method-assign]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    by_range_pause, split_pause = statistics.median(by_range), statistics.median(split)
    return report(
        "state-rescale",
        keys / by_range_pause,
        keys / split_pause,
        keys=keys,
        rescales=len(by_range),
        by_range_pause_ms=[round(s * 1000) for s in by_range],
        split_pause_ms=[round(s * 1000) for s in split],
        median_by_range_pause_ms=round(by_range_pause * 1000),
        median_split_pause_ms=round(split_pause * 1000),
        wall_seconds=round(time.perf_counter() - began, 1),
    )
