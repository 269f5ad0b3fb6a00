"""Keyed event-time window sums into a SparkSink, slowed so checkpoints land mid-stream.

Run as a script (``python -m tests.support.spark_job CHECKPOINTS OUTPUT``) it
is the child process the SIGKILL test kills.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import streamlet as sl

EVENTS = 3000
KEYS = 5
WINDOW = 5.0
BATCH = 10


def events(count: int = EVENTS, seed: int = 7) -> list[sl.Record]:
    """Readings 10 ms apart with up to 50 ms of disorder (less than the allowed lateness: none is late)."""
    rng = random.Random(seed)
    return [
        sl.Record(f"s{rng.randrange(KEYS)}", rng.randrange(100), i * 0.01 + rng.random() * 0.05) for i in range(count)
    ]


def window_of(ts: float) -> tuple[float, float]:
    start = ts - ts % WINDOW
    return start, start + WINDOW


def expected_sums(records: list[sl.Record]) -> list[tuple[str, int, float, float]]:
    """``(key, sum, window_start, window_end)`` computed without streamlet, sorted."""
    sums: Counter[tuple[str, float, float]] = Counter()
    for record in records:
        sums[(record.key, *window_of(record.ts))] += record.value
    return sorted((key, total, start, end) for (key, start, end), total in sums.items())


def expected_counts(records: list[sl.Record]) -> list[tuple[str, int, float, float]]:
    """``(key, count, window_start, window_end)`` computed without streamlet, sorted."""
    counts = Counter((record.key, *window_of(record.ts)) for record in records)
    return sorted((key, n, start, end) for (key, start, end), n in counts.items())


class Throttle(sl.Task):
    """Passes batches on, ``delay`` seconds each, so the job lasts long enough to checkpoint."""

    delay: ClassVar[float] = 0.002

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await asyncio.sleep(self.delay)
        outputs.emit_batch(inputs.get())


class Bomb(sl.Task):
    """Raises once, after an epoch with rows reached Spark under ``output`` (waiting for that, when armed).

    It waits only once an epoch with rows is sealed in the sink's staging (or
    written already): that epoch's checkpoint completes without the bomb, so
    Spark writes it.
    """

    armed: ClassVar[bool] = False
    output: ClassVar[Path | None] = None
    crashed: ClassVar[bool] = False

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        cls = type(self)
        if cls.armed and cls.output is not None and (written(cls.output) or sealed(cls.output)):
            deadline = time.monotonic() + 20
            while not written(cls.output) and time.monotonic() < deadline:  # noqa: ASYNC110 - polls the disk
                await asyncio.sleep(0.01)
            cls.armed, cls.crashed = False, True
            raise RuntimeError("injected crash")
        outputs.emit_batch(inputs.get())


def sealed(output: Path) -> bool:
    """Whether instance 0 has an epoch with rows sealed in its staging directory."""
    return any(output.glob("_staging/to-spark/*/0000-[0-9]*/chunk-*"))  # <sink>/<run>/<index>-<epoch>


def written(output: Path) -> bool:
    """Whether Spark has written an epoch of instance 0."""
    return any(output.glob("epoch=*/instance=0/_SUCCESS"))


class HeldEvents(sl.Source):
    """``records``, holding those from event time ``hold_from`` on until a checkpoint holding every record
    before them completed: the windows that closed before then reach the sink in an epoch of their own, and
    the later ones in later epochs, however slow the machine is. A checkpoint's barrier goes out while the
    reader waits."""

    def __init__(self, records: list[sl.Record], hold_from: float) -> None:
        self.records = records
        self.split = next(i for i, record in enumerate(records) if record.ts >= hold_from)

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _HeldReader(self.records, self.split)


class _HeldReader(sl.SourceReader):
    def __init__(self, records: list[sl.Record], split: int) -> None:
        self.records, self.split, self.done = records, split, 0
        self.released = asyncio.Event()

    async def read(self, max_records: int) -> list[sl.Record] | None:
        if self.done == len(self.records):
            return None
        if self.done == self.split:
            await self.released.wait()
        end = min(self.split if self.done < self.split else len(self.records), self.done + max_records)
        batch, self.done = self.records[self.done : end], end
        return batch

    def position(self) -> int:
        return self.done

    async def seek(self, position: int) -> None:
        self.done = position
        if position >= self.split:
            self.released.set()

    def checkpoint_complete(self, epoch: int, position: int) -> None:
        if position >= self.split:
            self.released.set()


def build(
    sink: sl.Sink, records: list[sl.Record] | sl.Source | None = None, how: Any = "sum", sinks: int = 1
) -> sl.Topology:
    """events -> throttle -> bomb -> window_reduce(how) per key over 5 s event-time windows -> ``sinks`` x sink."""
    topology = sl.Topology("spark-sums")
    source = topology.add_source(
        "events", events() if records is None else records, watermarks=sl.Watermarks(out_of_orderness=0.1)
    )
    throttle = topology.add_task("throttle", Throttle).set_input(source)
    bomb = topology.add_task("bomb", Bomb).set_input(throttle)
    window = sl.TimeWindow(WINDOW, time="event")
    sums = topology.window_reduce("sums", how, window=window).set_input(bomb, partitioning=sl.SAME_KEY)
    topology.add_sink("to-spark", sink, parallelism=sinks).set_input(sums, partitioning=sl.SAME_KEY)
    return topology


def run(checkpoints: Path, output: Path, interval: float = 0.05) -> sl.JobResult:
    """The job with checkpoints every ``interval`` seconds, writing Parquet under ``output``."""
    topology = build(sl.SparkSink(output))
    return sl.run(topology, checkpoint_dir=checkpoints, checkpoint_interval=interval, batch_size=BATCH)


if __name__ == "__main__":
    Throttle.delay = 0.01  # slower still: the parent kills it mid-stream
    run(Path(sys.argv[1]), Path(sys.argv[2]))
