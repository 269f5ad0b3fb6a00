"""Rescale a running keyed count (2 -> 4 -> 2) against stopping it and restoring from a checkpoint.

In one process: a keyed count holding 100 000 keys of state is fed at a
steady rate (below its capacity) through a ``QueueSource``; every output is
time-stamped at the sink. Measured, for each change:

- the **pause**: the longest gap between two outputs of keys whose segment
  moved, in the second around the change (at the steady rate a key's records
  come every few milliseconds, so a gap is the time the change held them);
- **throughput around the change** (the ``window`` seconds on each side)
  relative to the steady rate before it;
- records **lost or duplicated**: every key's counts must run 1, 2, 3, ...

The baseline does the same change the way an engine without live rescaling
must: take a checkpoint, stop the job, start it again with the new
parallelism from that checkpoint (state regrouped by key), and go on feeding.
``records_per_s`` is the throughput around the live changes,
``baseline_records_per_s`` around the restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

import streamlet as sl

KEYS = 100_000
RATE = 100_000  # records per second fed during the steady phases
STEP = 0.01  # seconds between two sends of RATE * STEP records
WINDOW = 1.0  # seconds on each side of a change


class _Arrivals(sl.Sink):
    """Keeps (arrival time, key, value) of every output."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, Any, Any]] = []

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        seen = self.seen

        class Writer(sl.SinkWriter):
            def write(self, batch: list[sl.Record]) -> None:
                now = time.perf_counter()
                seen.extend((now, record.key, record.value) for record in batch)

        return Writer()


def _topology(parallelism: int, sink: _Arrivals) -> sl.Topology:
    topology = sl.Topology("rescale")
    source = topology.add_source("in", sl.QueueSource(maxsize=100_000))
    counts = topology.reduce("count", lambda total, one: total + one, parallelism=parallelism)
    counts.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sink).set_input(counts)
    return topology


class _Feeder:
    """Sends keys round the key space at ``RATE``; ``sent`` counts what went in."""

    def __init__(self) -> None:
        self.sent = 0

    async def load(self, job: sl.Job) -> None:
        """One record for every key: the state the change has to move."""
        for key in range(KEYS):
            await job.send("in", key, 1)
        await job.settle()
        self.sent = KEYS

    async def steady(self, job: sl.Job, seconds: float) -> None:
        per_step = int(RATE * STEP)
        began = time.perf_counter()
        steps = 0
        while time.perf_counter() - began < seconds:
            for _ in range(per_step):
                await job.send("in", self.sent % KEYS, 1)
                self.sent += 1
            steps += 1
            await asyncio.sleep(max(0.0, began + steps * STEP - time.perf_counter()))  # pacing a workload


async def _live(sink: _Arrivals, feeder: _Feeder, changes: list[int]) -> list[tuple[float, float, set[int]]]:
    """Run with live rescales; per change: when it began, when it ended, the segments that moved."""
    marks = []
    async with sl.start(_topology(2, sink)) as job:
        await feeder.load(job)
        await feeder.steady(job, WINDOW)
        for instances in changes:
            old = job.segment_table("count")
            began = time.perf_counter()
            async with asyncio.TaskGroup() as group:
                group.create_task(feeder.steady(job, 2 * WINDOW))
                await asyncio.sleep(WINDOW / 2)
                began = time.perf_counter()
                await job.rescale("count", instances)
                ended = time.perf_counter()
            marks.append((began, ended, set(old.changes(job.segment_table("count")))))
    return marks


Marks = list[tuple[float, float, set[int]]]


async def _restarts(sink: _Arrivals, feeder: _Feeder, changes: list[int], directory: Path) -> Marks:
    """The same changes by checkpoint, stop and restore with the new parallelism."""
    marks = []
    parallelism = 2
    job_context = sl.start(_topology(parallelism, sink), checkpoint_dir=directory)
    job = await job_context.__aenter__()
    await feeder.load(job)
    await feeder.steady(job, WINDOW)
    for instances in changes:
        old = sl.SegmentTable.contiguous(128, parallelism)
        await feeder.steady(job, WINDOW / 2)
        began = time.perf_counter()
        await job.settle()  # drain first, as a stop with a savepoint would: nothing read is lost
        await job.checkpoint()
        await _abandon(job_context)
        job_context = sl.start(_topology(instances, sink), checkpoint_dir=directory)
        job = await job_context.__aenter__()
        ended = time.perf_counter()
        await feeder.steady(job, 1.5 * WINDOW)
        parallelism = instances
        marks.append((began, ended, set(old.changes(sl.SegmentTable.contiguous(128, instances)))))
    await job_context.__aexit__(None, None, None)
    return marks


async def _abandon(context: Any) -> None:
    """Stop a job the hard way (what a restart does): the next run resumes from the checkpoint."""
    with contextlib.suppress(RuntimeError):
        await context.__aexit__(RuntimeError, RuntimeError("restart"), None)


def _figures(sink: _Arrivals, marks: list[tuple[float, float, set[int]]]) -> dict[str, Any]:
    arrivals = sorted(sink.seen)
    pauses, around, steady = [], [], []
    for began, ended, moved in marks:
        moved_times = [t for t, key, _ in arrivals if began - WINDOW <= t <= ended + WINDOW and _segment(key) in moved]
        gaps = [b - a for a, b in itertools.pairwise(moved_times)]
        pauses.append(max(gaps, default=0.0))
        span = ended - began + 2 * WINDOW
        around.append(sum(1 for t, _, _ in arrivals if began - WINDOW <= t <= ended + WINDOW) / span)
        steady.append(sum(1 for t, _, _ in arrivals if began - 2 * WINDOW <= t < began - WINDOW) / WINDOW)
    counts: dict[Any, list[int]] = defaultdict(list)
    for _, key, value in sink.seen:
        counts[key].append(value)
    lost = duplicated = reordered = 0
    for values in counts.values():  # every key must count 1, 2, 3, ... in order
        distinct = set(values)
        duplicated += len(values) - len(distinct)
        lost += max(values) - len(distinct)
        reordered += sum(1 for a, b in itertools.pairwise(values) if b < a)
    return {"pauses_ms": [round(p * 1000, 1) for p in pauses], "around": around, "steady": steady, "lost": lost,
            "duplicated": duplicated, "reordered": reordered}  # fmt: skip


def _segment(key: Any) -> int:
    from streamlet.core.model.segments import segment_of

    return segment_of(key, 128)


def _run(coroutine: Callable[[], Awaitable[Any]]) -> Any:
    return uvloop.run(coroutine())


def main(records: int, repeats: int) -> dict[str, Any]:
    """Live rescales 2 -> 4 -> 2 against restarts from a checkpoint; ``records`` is unused (the rate is fixed)."""
    changes = [4, 2]
    live_sink, live_feeder = _Arrivals(), _Feeder()
    live = _figures(live_sink, _run(lambda: _live(live_sink, live_feeder, changes)))
    directory = Path(tempfile.mkdtemp(prefix="streamlet-rescale-"))
    try:
        restart_sink, restart_feeder = _Arrivals(), _Feeder()
        restart = _figures(restart_sink, _run(lambda: _restarts(restart_sink, restart_feeder, changes, directory)))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    live_around = sum(live["around"]) / len(live["around"])
    restart_around = sum(restart["around"]) / len(restart["around"])
    steady = sum(live["steady"]) / len(live["steady"])
    return {
        "name": "rescale",
        "records_per_s": round(live_around),
        "baseline_records_per_s": round(restart_around),
        "ratio": round(live_around / restart_around, 3),
        "steady_records_per_s": round(steady),
        "around_vs_steady": round(live_around / steady, 3),
        "pause_ms": live["pauses_ms"],
        "restart_pause_ms": restart["pauses_ms"],
        "pause_vs_restart": round(max(restart["pauses_ms"]) / max(max(live["pauses_ms"]), 0.001), 1),
        "lost": live["lost"],
        "duplicated": live["duplicated"],
        "reordered": live["reordered"],
        "keys": KEYS,
        "rate": RATE,
        "changes": "2 -> 4 -> 2",
        "where": "in-process",
    }
