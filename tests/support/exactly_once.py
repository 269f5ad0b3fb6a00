"""A keyed running count over a replayable source into a FileSink, slowed so checkpoints land mid-stream.

Run as a script (``python -m tests.support.exactly_once CHECKPOINTS OUTPUT``)
it is the child process the SIGKILL test kills.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import streamlet as sl

RECORDS = 4000
KEYS = 40
BATCH = 10


def items() -> list[tuple[str, int]]:
    return [(f"k{index % KEYS}", index) for index in range(RECORDS)]


def expected_output() -> list[tuple[str, int]]:
    """Every (key, running count) the job emits in a failure-free run: each exactly once."""
    totals = Counter(key for key, _ in items())
    return sorted((key, n) for key, total in totals.items() for n in range(1, total + 1))


class Throttle(sl.Task):
    """Passes records on, one millisecond per batch, so the job lasts long enough to checkpoint."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await asyncio.sleep(0.001)
        outputs.emit_batch(inputs.get())


class RunningCount(sl.Task):
    """Emits (key, count so far) for every record; the count lives in keyed state."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            count = self.state.get(record.key, 0) + 1
            self.state.put(record.key, count)
            outputs.emit(record.key, count)


class Bomb(sl.Task):
    """Raises once, after ``after`` batches, if at least two checkpoints are in ``checkpoints``."""

    armed: ClassVar[bool] = False
    after: ClassVar[int] = 200
    checkpoints: ClassVar[Path | None] = None
    seen_at_crash: ClassVar[int] = 0

    def prepare(self, config: dict[str, Any]) -> None:
        self.batches = 0

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        self.batches += 1
        if type(self).armed and self.batches >= self.after and self.checkpoints is not None:
            done = len(list(self.checkpoints.glob("checkpoint-*.msgpack")))
            if done >= 2:
                type(self).armed = False
                type(self).seen_at_crash = done
                raise RuntimeError("injected crash")
        outputs.emit_batch(inputs.get())


def relay(record: sl.Record) -> tuple[Any, Any]:
    """The record as it came (a stateless stage to run off the loop)."""
    return record.key, record.value


def build(output: Path | None, source: sl.Source | None = None, run_in: dict[str, str] | None = None) -> sl.Topology:
    """source -> throttle -> bomb -> count (x2, SAME_KEY) -> FileSink (``output`` None: a CollectSink, x2);
    ``run_in`` places bomb and count (default: on the loop) and, when it names ``relay``, puts a plain
    pass-through map there after throttle."""
    places = run_in or {}
    topology = sl.Topology("exactly-once")
    lines = topology.add_source("in", source if source is not None else items())
    throttle = topology.add_task("throttle", Throttle).set_input(lines)
    if "relay" in places:
        throttle = topology.map("relay", relay, run_in=places["relay"]).set_input(throttle)
    bomb = topology.add_task("bomb", Bomb, run_in=places.get("bomb", "loop")).set_input(throttle)
    count = topology.add_task("count", RunningCount, parallelism=2, run_in=places.get("count", "loop"))
    count.set_input(bomb, partitioning=sl.SAME_KEY)
    if output is None:
        topology.add_sink("out", sl.CollectSink(), parallelism=2).set_input(count)
    else:
        topology.add_sink("out", sl.FileSink(output)).set_input(count)
    return topology


def run(
    checkpoints: Path, output: Path | None, interval: float | None = 0.02, run_in: dict[str, str] | None = None
) -> sl.JobResult:
    topology = build(output, run_in=run_in)
    return sl.run(topology, checkpoint_dir=checkpoints, checkpoint_interval=interval, batch_size=BATCH)


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]))


class DieAfterSave(sl.DirectoryCheckpointStore):
    """Saves checkpoints; after checkpoint ``die_after`` is on disk the process kills itself."""

    def __init__(self, directory: Path, die_after: int) -> None:
        super().__init__(directory)
        self.die_after = die_after

    def save(self, epoch: int, data: bytes) -> Any:
        super().save(epoch, data)
        if epoch == self.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
