"""Rescale a running keyed count (2 -> 4 -> 2) against stopping it and restoring from a checkpoint.

On a local cluster (the line's figures: ZooKeeper, a master, 2 workers, each
its own process): ``benchmarks.rescale_job`` counts 100 000 keys fed at a
steady 20 000 records/s and stamps every running count with the time it was
made; ``streamlet rescale`` goes 2 -> 4 -> 2 while it runs. The baseline does
the same changes by ``stop --savepoint`` and ``submit --from-savepoint`` with
the new parallelism (the stop-and-restore a job without live rescaling
needs). Same figures for both: the pause (the longest gap between outputs of
moved keys around each change), throughput over the ``AROUND`` seconds from
a change on against the steady rate of the ``CLUSTER_WINDOW`` seconds before
it, and records
lost, doubled or out of order (every key must count 1, 2, 3, ...).

In one process (the ``in_process_*`` figures): a keyed count holding 100 000 keys of state is fed at a
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
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import uvloop

import streamlet as sl
from benchmarks.common import median_of_repeats
from streamlet.connectors.files import read_file_sink
from streamlet.core.model.segments import SegmentTable

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
    """Sends keys round the key space at ``RATE``; ``sent`` counts what went in. The pace is kept from the
    first steady phase on: what came due while nothing was sent (a restart) goes in at once when sending
    resumes, as a live source's backlog would, the live rescales and the restarts alike."""

    def __init__(self) -> None:
        self.sent = 0
        self.paced = 0  # records the steady phases sent
        self.origin: float | None = None  # when the first steady phase began

    async def load(self, job: sl.Job) -> None:
        """One record for every key: the state the change has to move."""
        for key in range(KEYS):
            await job.send("in", key, 1)
        await job.settle()
        self.sent = KEYS

    async def steady(self, job: sl.Job, seconds: float) -> None:
        if self.origin is None:
            self.origin = time.perf_counter()
        until = time.perf_counter() + seconds
        while (now := time.perf_counter()) < until:
            due = int((now - self.origin) * RATE)
            while self.paced < due:
                await job.send("in", self.sent % KEYS, 1)
                self.sent += 1
                self.paced += 1
            await asyncio.sleep(STEP)  # pacing a workload


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
        old = SegmentTable.contiguous(128, parallelism)
        await feeder.steady(job, WINDOW / 2)
        await job.settle()  # the queue source keeps no position: what it holds must be read before the stop
        began = time.perf_counter()  # from here on: the drain is not a cost the live path has
        await job.checkpoint()
        await _abandon(job_context)
        job_context = sl.start(_topology(instances, sink), checkpoint_dir=directory)
        job = await job_context.__aenter__()
        ended = time.perf_counter()
        await feeder.steady(job, 1.5 * WINDOW)
        parallelism = instances
        marks.append((began, ended, set(old.changes(SegmentTable.contiguous(128, instances)))))
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


CLUSTER_RATE = 20_000
CLUSTER_STEADY = 12.0  # seconds between changes (the AROUND window fits before the next)
CLUSTER_WINDOW = 5.0  # seconds before a change that measure the steady rate, and each side for the pause
AROUND = 10.0  # seconds from a change on whose throughput is compared with the steady rate


def on_cluster(changes: list[int], live_first: bool = True) -> dict[str, Any]:
    """Live rescales and stop-and-restore on a local cluster of 2 workers, in the order given; figures."""
    from streamlet.backends.cluster.local import local_cluster

    duration = CLUSTER_STEADY * (len(changes) + 1) + 10
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        os.environ.update({
            "STREAMLET_BENCH_TOTAL": str(int(CLUSTER_RATE * duration)), "STREAMLET_BENCH_KEYS": str(KEYS),
            "STREAMLET_BENCH_RATE": str(CLUSTER_RATE), "STREAMLET_BENCH_OUT": str(root / "out"),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
        })  # fmt: skip
        state = local_cluster.up(root / "state", "rescale", 2, 1, None, capacity=8)
        try:
            anyio.run(_ready, state)
            if live_first:
                live_marks = _cluster_live(state, root, changes)
                restart_marks = _cluster_restarts(state, root, changes)
            else:
                restart_marks = _cluster_restarts(state, root, changes)
                live_marks = _cluster_live(state, root, changes)
        finally:
            local_cluster.down(root / "state")
        live = _cluster_figures(read_file_sink(root / "out" / "live"), live_marks)
        restarts = [read_file_sink(root / "out" / job) for job in ("first", "second", "third")]
        restart = _cluster_figures([record for part in restarts for record in part], restart_marks)
    return {"live": live, "restart": restart}


async def _ready(state: Any) -> None:
    from streamlet.backends.cluster.client.status import wait_until_ready

    await wait_until_ready(state.settings(), 2)


def _cluster_live(state: Any, root: Path, changes: list[int]) -> Marks:
    from streamlet.backends.cluster.client import api as client

    _submit(state, root, "live", {})
    time.sleep(CLUSTER_STEADY)  # the steady phase before the first change
    marks, before = [], 2
    for instances in changes:
        began = time.time()
        anyio.run(client.rescale, state.settings(), "live", "count", instances, 120)
        marks.append((began, time.time(), _moved(before, instances)))
        before = instances
        time.sleep(CLUSTER_STEADY)
    _wait_state(state, "live", {"FINISHED"})
    return marks


def _cluster_restarts(state: Any, root: Path, changes: list[int]) -> Marks:
    from streamlet.backends.cluster.client import api as client

    jobs = ["first", "second", "third"]
    _submit(state, root, "first", {})
    time.sleep(CLUSTER_STEADY)
    marks, before = [], 2
    for step, instances in enumerate(changes):
        savepoint = root / f"savepoint-{step}"
        began = time.time()
        anyio.run(client.savepoint, state.settings(), jobs[step], savepoint, True)
        _wait_state(state, jobs[step], {"KILLED"})
        _submit(state, root, jobs[step + 1], {"count": instances}, savepoint)
        marks.append((began, time.time(), _moved(before, instances)))
        before = instances
        time.sleep(CLUSTER_STEADY)
    _wait_state(state, jobs[len(changes)], {"FINISHED"})
    return marks


def _submit(state: Any, root: Path, job: str, parallelism: dict[str, int], savepoint: Path | None = None) -> None:
    from streamlet.backends.cluster.client import api as client

    checkpoint = {"interval": 1.0, "replicas": None}
    submission = client.Submission(f"benchmarks.rescale_job:{job}", job, parallelism, checkpoint, savepoint)
    anyio.run(client.submit_and_wait, state.settings(), submission, False, 60)
    _wait_state(state, job, {"RUNNING"})


def _wait_state(state: Any, job: str, wanted: set[str]) -> None:
    from streamlet.backends.cluster.client import api as client

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        states = {status["job"]: status["state"] for status in anyio.run(client.list_jobs, state.settings())}
        if states.get(job) in wanted:
            return
        time.sleep(0.05)  # a benchmark driver polling the cluster, not a test
    raise RuntimeError(f"job '{job}' did not reach {wanted}")


def _moved(before: int, after: int) -> set[int]:
    return set(SegmentTable.contiguous(128, before).changes(SegmentTable.contiguous(128, after)))


def _cluster_figures(records: list[sl.Record], marks: Marks) -> dict[str, Any]:
    stamped = sorted((value[1], key, value[0]) for key, value, _ in ((r.key, r.value, r.ts) for r in records))
    pauses, around, steady = [], [], []
    for began, ended, moved in marks:
        window = [(t, key) for t, key, _ in stamped if began - CLUSTER_WINDOW <= t <= ended + CLUSTER_WINDOW]
        moved_times = [t for t, key in window if _segment(key) in moved]
        pauses.append(max((b - a for a, b in itertools.pairwise(moved_times)), default=0.0))
        after = [t for t, _, _ in stamped if began <= t < began + AROUND]  # the 10 s from the change on
        around.append(len(after) / AROUND)
        before = [t for t, _, _ in stamped if began - CLUSTER_WINDOW <= t < began]
        steady.append(len(before) / CLUSTER_WINDOW)
    counts: dict[Any, list[int]] = defaultdict(list)
    for _, key, value in stamped:
        counts[key].append(value)
    lost = sum(max(values) - len(set(values)) for values in counts.values())
    duplicated = sum(len(values) - len(set(values)) for values in counts.values())
    return {
        "pauses_ms": [round(p * 1000) for p in pauses], "around": around, "steady": steady,
        "lost": lost, "duplicated": duplicated, "records": len(stamped),
    }  # fmt: skip


def main(records: int, repeats: int) -> dict[str, Any]:
    """Live rescales 2 -> 4 -> 2 against restarts from a checkpoint, ``repeats`` times with the variant going
    first alternating; medians (``records`` is unused: the rate is fixed)."""
    lines = [_repeat(live_first=repeat % 2 == 0) for repeat in range(repeats)]
    return {"name": "rescale", **median_of_repeats(lines)}


def _repeat(live_first: bool) -> dict[str, Any]:
    """One round: in one process, then on a fresh local cluster; each variant in the order given."""
    changes = [4, 2]
    in_process = _in_process(changes, live_first)
    live, restart = in_process["live"], in_process["restart"]
    live_around = sum(live["around"]) / len(live["around"])
    restart_around = sum(restart["around"]) / len(restart["around"])
    steady = sum(live["steady"]) / len(live["steady"])
    cluster = on_cluster(changes, live_first)
    c_live, c_restart = cluster["live"], cluster["restart"]
    c_around = sum(c_live["around"]) / len(c_live["around"])
    c_restart_around = sum(c_restart["around"]) / len(c_restart["around"])
    c_steady = sum(c_live["steady"]) / len(c_live["steady"])
    return {
        "records_per_s": round(c_around),
        "baseline_records_per_s": round(c_restart_around),
        "ratio": round(c_around / c_restart_around, 3),
        "steady_records_per_s": round(c_steady),
        "around_vs_steady": round(c_around / c_steady, 3),
        "pause_ms": c_live["pauses_ms"],
        "restart_pause_ms": c_restart["pauses_ms"],
        "pause_vs_restart": round(max(c_restart["pauses_ms"]) / max(max(c_live["pauses_ms"]), 1), 1),
        "lost": c_live["lost"],
        "duplicated": c_live["duplicated"],
        "restart_lost": c_restart["lost"],
        "restart_duplicated": c_restart["duplicated"],
        "cluster_records": c_live["records"],
        "in_process_records_per_s": round(live_around),
        "in_process_baseline_records_per_s": round(restart_around),
        "in_process_steady_records_per_s": round(steady),
        "in_process_pause_ms": live["pauses_ms"],
        "in_process_restart_pause_ms": restart["pauses_ms"],
        "in_process_pause_vs_restart": round(max(restart["pauses_ms"]) / max(max(live["pauses_ms"]), 0.1), 1),
        "in_process_lost": live["lost"],
        "in_process_duplicated": live["duplicated"],
        "in_process_reordered": live["reordered"],
        "restart_in_process_lost": restart["lost"],
        "restart_in_process_duplicated": restart["duplicated"],
        "live_first": live_first,
        "keys": KEYS,
        "rate": CLUSTER_RATE,
        "in_process_rate": RATE,
        "changes": "2 -> 4 -> 2",
    }


def _in_process(changes: list[int], live_first: bool) -> dict[str, dict[str, Any]]:
    """Both variants in this process, in the order given; their figures."""

    def live() -> dict[str, Any]:
        sink, feeder = _Arrivals(), _Feeder()
        return _figures(sink, _run(lambda: _live(sink, feeder, changes)))

    def restart() -> dict[str, Any]:
        directory = Path(tempfile.mkdtemp(prefix="streamlet-rescale-"))
        try:
            sink, feeder = _Arrivals(), _Feeder()
            return _figures(sink, _run(lambda: _restarts(sink, feeder, changes, directory)))
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    variants = {"live": live, "restart": restart}
    order = ["live", "restart"] if live_first else ["restart", "live"]
    return {name: variants[name]() for name in order}
