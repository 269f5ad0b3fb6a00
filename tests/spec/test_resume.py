"""Differential tests of checkpoints and source resume (docs/state.md) against ``models/resume.py``.

A job with keyed state (a task whose ``self.state`` sums per key and whose ``finish`` emits the sums; a
``reduce`` emitting the running sum after every record) and windows (``window_reduce`` on a tumbling event-time
window; with a ``ColumnarSource`` also the columnar ``aggregate``, ``emit="end"`` and windowed) takes checkpoints,
crashes at a random point after a random checkpoint and is run again from its checkpoint directory, with the
same or another parallelism, until it finishes. What it leaves must be what one run without a crash leaves:
the sums its last run's ``finish`` emits (exactly-once state), and what every ``sl.FileSink`` holds, each record
once (exactly-once output). Two drivers:

* ``sl.run`` with ``checkpoint_interval`` over a replayable source (a list, a ``FileSource``, a
  ``ColumnarSource`` of a list of batches); a task that raises once (a file marks it, so it raises once across
  runs and worker processes) when it sees a record past a random index after a checkpoint of a random epoch
  was saved; one or two crashes; each run in one process or (a smaller share) ``processes=2``;
* ``sl.start`` over a ``QueueSource`` fed by the test, which settles and takes ``await job.checkpoint()`` at
  random points, rescales the keyed tasks live (``job.rescale``), leaves the ``async with`` block with an
  exception and, in the next run, sends again what it sent after its last checkpoint; each run keeps its
  keyed state in memory or in RocksDB (drawn per run: incremental checkpoints, restored on either backend).

The columnar ``aggregate`` of ``test_columnar`` (nulls, dictionaries, big ints, ``mean``; per batch, at the
end, per on-time window) crashes and resumes the same way: its ``FileSink`` must hold the model's results once.

An ``async def`` generator cannot be replayed: resuming from its checkpoints fails with ``sl.NotReplayable``
naming the source, its instance and the checkpoint, in ``sl.run`` (one process and ``processes=2``) and
``sl.start``, reading nothing, and the job warns once when it starts.

The disagreement the differential runs found, reduced to a minimal example, is a test of its own at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import assume, event, given, note
from hypothesis import strategies as st
from structlog.testing import capture_logs

import streamlet as sl
from tests.spec import test_columnar as columnar
from tests.spec.budget import examples
from tests.spec.models import resume as model
from tests.support.held_calls import until_true

KEYS = ["k0", "k1", "k2", "k3", "k4"]
TICK = 0.001


class Crash(Exception):
    """The crash the tests cause on purpose."""


def claim(path: Path) -> bool:
    """True once: the first caller, in any process, creates the file."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def newest_epoch(directory: Path) -> int:
    epochs = sl.DirectoryCheckpointStore(directory).epochs() if directory.exists() else []
    return max(epochs, default=0)


class Boom(sl.Task):
    """Passes records on (parsing a ``FileSource`` line ``key value ts``), taking 2 ms a batch; raises
    once per planned crash ``(index, epoch)`` on the first record whose index (``value // 10``) is at least
    ``index`` once a checkpoint of at least ``epoch`` is saved (and the crash before it has happened)."""

    def prepare(self, config: dict[str, Any]) -> None:
        self.directory = Path(config["directory"])
        self.crashes = config["crashes"]
        self.lines = config["lines"]

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await asyncio.sleep(0.002)
        for record in inputs.get():
            if self.lines:
                key, value, ts = record.value.split()
                key, value, ts = key, int(value), float(ts)
            else:
                key, value, ts = record.key, record.value, record.ts
            for n, (index, epoch) in enumerate(self.crashes):
                flag = self.directory / f"crashed-{n}"
                if value // 10 < index or flag.exists():
                    continue
                if n and not (self.directory / f"crashed-{n - 1}").exists():
                    continue
                if newest_epoch(self.directory / "checkpoints") >= epoch and claim(flag):
                    raise Crash(f"crash {n} at record {value // 10}")
            outputs.emit(key, value, ts=ts)


class Total(sl.Task):
    """Each key's sum in ``self.state``, emitted by ``finish``."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)

    def finish(self, outputs: sl.Outputs) -> None:
        for key, total in self.state.items():
            outputs.emit(key, total)


def add(total: int, value: int) -> int:
    return total + value


# ----------------------------------------------------------------------------------------------- inputs


@st.composite
def on_time_records(draw: st.DrawFn, min_size: int, max_size: int, out_of_orderness: int) -> list[model.Rec]:
    """Records ``(key, value, ts)`` never more than ``out_of_orderness`` behind the newest before them; the value of
    record i is ``10 * i + v`` (so a task can tell its index)."""
    n = draw(st.integers(min_size, max_size))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=5, unique=True))
    front, records = 0, []
    for i in range(n):
        front += draw(st.sampled_from([0, 0, 1, 1, 2]))
        ts = front - draw(st.integers(0, out_of_orderness))
        records.append((draw(st.sampled_from(keys)), 10 * i + draw(st.integers(0, 9)), float(max(0, ts))))
    assert model.on_time(records, out_of_orderness)
    return records


@dataclass
class Case:
    records: list[model.Rec]
    source: str  # "list", "file" or "columnar"
    size: int  # window size, s
    out_of_orderness: int
    batch_size: int
    interval: float
    crashes: list[tuple[int, int]]  # (record index, checkpoint epoch)
    parallelism: list[int]  # per run
    processes: list[int]  # per run
    cuts: list[int] = field(default_factory=list)  # columnar batches


@st.composite
def cases(draw: st.DrawFn, processes: bool = False) -> Case:
    out_of_orderness = draw(st.integers(0, 4))
    records = draw(on_time_records(20, 120, out_of_orderness))
    n = len(records)
    crashes = []
    for _ in range(draw(st.integers(1, 2))):
        index = draw(st.integers(0, n * 2 // 3))
        epoch = draw(st.integers(1, 2)) + (crashes[-1][1] if crashes else 0)
        crashes.append((index, epoch))
    runs = len(crashes) + 1
    source = draw(st.sampled_from(["list", "list", "file", "columnar"]))
    cuts = []
    if source == "columnar":
        cuts = sorted({0, n, *draw(st.lists(st.integers(1, n - 1), min_size=n // 4, max_size=n))})
    return Case(
        records=records,
        source=source,
        size=draw(st.integers(1, 6)),
        out_of_orderness=out_of_orderness,
        batch_size=draw(st.sampled_from([1, 2, 3, 5])),
        interval=draw(st.sampled_from([0.002, 0.005, 0.01])),
        crashes=crashes,
        parallelism=[draw(st.sampled_from([1, 3])) for _ in range(runs)],
        processes=[draw(st.sampled_from([1, 2])) if processes else 1 for _ in range(runs)],
        cuts=cuts,
    )


# ----------------------------------------------------------------------------------------------- the job


def source_of(case: Case, directory: Path) -> sl.Source:
    if case.source == "file":
        path = directory / "input.txt"
        if not path.exists():
            path.write_text("".join(f"{k} {v} {ts}\n" for k, v, ts in case.records), encoding="utf-8")
        return sl.FileSource(path)
    if case.source == "columnar":
        batches = []
        for a, b in itertools.pairwise(case.cuts):
            rows = case.records[a:b]
            batches.append(
                pa.RecordBatch.from_arrays(
                    [
                        pa.array([r[0] for r in rows], pa.string()),
                        pa.array([r[1] for r in rows], pa.int64()),
                        pa.array([r[2] for r in rows], pa.float64()),
                    ],
                    names=["key", "value", "ts"],
                )
            )
        return sl.ColumnarSource(batches, key="key", value="value", ts="ts")
    return sl.IterableSource([sl.Record(k, v, ts) for k, v, ts in case.records])


def build(
    source: Any, directory: Path, parallelism: int, size: int, out_of_orderness: int, boom: dict[str, Any] | None
) -> sl.Topology:
    """The job: ``source`` (through ``Boom`` when ``boom`` configures one) into the keyed tasks, each feeding a
    ``FileSink`` under ``directory``; a ``ColumnarSource`` feeds the columnar aggregates too."""
    topology = sl.Topology("spec-resume")
    src = topology.add_source("src", source, watermarks=sl.Watermarks(out_of_orderness=out_of_orderness))
    upstream = src
    if boom is not None:
        upstream = topology.add_task("boom", Boom, parallelism=parallelism, config=boom)
        upstream.set_input(src, partitioning=sl.SAME_KEY)
    total = topology.add_task("total", Total, parallelism=parallelism).set_input(upstream, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(total)
    topology.add_sink("file-totals", sl.FileSink(directory / "totals")).set_input(total)
    running = topology.reduce("running", add, emit="record", parallelism=parallelism)
    running.set_input(upstream, partitioning=sl.SAME_KEY)
    topology.add_sink("file-running", sl.FileSink(directory / "running")).set_input(running)
    window = sl.TimeWindow(size, time="event")
    if not isinstance(source, sl.FileSource):  # its records' ts is the clock's: Boom's parsed times would be late
        windows = topology.window_reduce("windows", "sum", window=window, parallelism=parallelism)
        windows.set_input(upstream, partitioning=sl.SAME_KEY)
        topology.add_sink("file-windows", sl.FileSink(directory / "windows")).set_input(windows)
    if isinstance(source, sl.ColumnarSource):
        ctotal = topology.aggregate("ctotal", "sum", emit="end", parallelism=parallelism)
        ctotal.set_input(src, partitioning=sl.SAME_KEY)
        topology.add_sink("ctotals", sl.CollectSink()).set_input(ctotal)
        topology.add_sink("file-ctotals", sl.FileSink(directory / "ctotals")).set_input(ctotal)
        cwindows = topology.aggregate("cwindows", "sum", window=window, parallelism=parallelism)
        cwindows.set_input(src, partitioning=sl.SAME_KEY)
        topology.add_sink("file-cwindows", sl.FileSink(directory / "cwindows")).set_input(cwindows)
    return topology


def per_key(records: list[sl.Record], with_ts: bool = False) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = defaultdict(list)
    for record in records:
        out[record.key].append((record.value, record.ts) if with_ts else record.value)
    return dict(out)


def check_outputs(
    records: list[model.Rec], size: int, directory: Path, result: sl.JobResult, source: str = "list"
) -> None:
    """The last run's totals and every FileSink against the model's run without a crash."""
    totals = model.totals(records)
    running = model.running(records)
    windows = model.windows(records, size)
    got_totals = [(r.key, r.value) for r in result.sink("totals")]
    note(f"totals: {sorted(got_totals)} (model {sorted(totals.items())})")
    assert sorted(got_totals) == sorted(totals.items())
    assert sorted((r.key, r.value) for r in sl.read_file_sink(directory / "totals")) == sorted(totals.items())
    assert per_key(sl.read_file_sink(directory / "running")) == running
    if source != "file":
        assert per_key(sl.read_file_sink(directory / "windows"), with_ts=True) == windows
    if source == "columnar":
        assert sorted((r.key, r.value) for r in result.sink("ctotals")) == sorted(totals.items())
        assert sorted((r.key, r.value) for r in sl.read_file_sink(directory / "ctotals")) == sorted(totals.items())
        assert per_key(sl.read_file_sink(directory / "cwindows"), with_ts=True) == windows


# ----------------------------------------------------------------------------------------------- sl.run


def run_with_crashes(case: Case, directory: Path) -> None:
    note(repr(case))
    checkpoints = directory / "checkpoints"
    boom = {"directory": str(directory), "crashes": case.crashes, "lines": case.source == "file"}
    crashes = 0
    for run, (parallelism, processes) in enumerate(zip(case.parallelism, case.processes, strict=True)):
        topology = build(source_of(case, directory), directory, parallelism, case.size, case.out_of_orderness, boom)
        try:
            result = sl.run(
                topology,
                batch_size=case.batch_size,
                checkpoint_dir=checkpoints,
                checkpoint_interval=case.interval,
                processes=processes,
            )
        except sl.TaskError as error:
            if "crash" not in str(error):
                raise
            crashes += 1
            note(f"run {run} crashed ({error}); checkpoints {sl.DirectoryCheckpointStore(checkpoints).epochs()}")
            continue
        break
    else:
        raise AssertionError("the job crashed more often than planned")
    event(f"crashes: {crashes}")
    event(f"source: {case.source}")
    check_outputs(case.records, case.size, directory, result, case.source)


@pytest.mark.timeout(240)
@examples(0.25)
@given(case=cases())
def test_resume_after_crashes_matches_the_model(case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
    run_with_crashes(case, tmp_path_factory.mktemp("resume"))


@pytest.mark.timeout(240)
@examples(0.05)
@given(case=cases(processes=True))
def test_resume_in_two_processes_matches_the_model(case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each run (the crashed ones and the last) in one process or in two worker processes."""
    run_with_crashes(case, tmp_path_factory.mktemp("resume2"))


# ----------------------------------------------------------------------------------------------- sl.start, QueueSource

TASKS = ["total", "running", "windows"]


@dataclass
class QueueCase:
    records: list[model.Rec]
    size: int
    out_of_orderness: int
    batch_size: int
    parallelism: list[int]  # per run
    runs: list[list[tuple[Any, ...]]]  # per run: ("send", n), ("checkpoint",), ("rescale", task, n), ("settle",)
    backends: list[str] = field(default_factory=list)  # per run: the keyed state "memory" or in "rocksdb"


@st.composite
def queue_cases(draw: st.DrawFn) -> QueueCase:
    out_of_orderness = draw(st.integers(0, 4))
    records = draw(on_time_records(10, 80, out_of_orderness))
    runs = []
    for _ in range(draw(st.integers(1, 2)) + 1):  # one or two crashed runs, then the last
        steps: list[tuple[Any, ...]] = []
        for _ in range(draw(st.integers(0, 8))):
            kind = draw(st.sampled_from(["send", "send", "send", "checkpoint", "checkpoint", "rescale", "settle"]))
            if kind == "send":
                steps.append(("send", draw(st.integers(1, 15))))
            elif kind == "rescale":
                steps.append(("rescale", draw(st.sampled_from(TASKS)), draw(st.integers(1, 4))))
            else:
                steps.append((kind,))
        runs.append(steps)
    return QueueCase(
        records=records,
        size=draw(st.integers(1, 6)),
        out_of_orderness=out_of_orderness,
        batch_size=draw(st.sampled_from([1, 3, 1000])),
        parallelism=[draw(st.sampled_from([1, 3])) for _ in runs],
        runs=runs,
        backends=[draw(st.sampled_from(["memory", "rocksdb"])) for _ in runs],
    )


async def drive_queue(case: QueueCase, directory: Path) -> sl.JobResult:
    """Each run sends on from the last checkpoint it knows of (taken after a settle: it holds everything sent
    before); every run but the last leaves its block with an exception."""
    checkpointed = 0  # records the newest checkpoint holds
    for run, (steps, parallelism) in enumerate(zip(case.runs, case.parallelism, strict=True)):
        last = run == len(case.runs) - 1
        topology = build(sl.QueueSource(), directory, parallelism, case.size, case.out_of_orderness, None)
        sent = checkpointed
        rocks = case.backends[run] == "rocksdb"
        backend = sl.RocksDBState(directory / f"rocks{run}", cache_entries=3) if rocks else None
        try:
            async with sl.start(
                topology, checkpoint_dir=directory / "checkpoints", batch_size=case.batch_size, state_backend=backend
            ) as job:
                for step in steps:
                    if step[0] == "send":
                        for key, value, ts in case.records[sent : sent + step[1]]:
                            await job.send("src", key, value, ts=ts)
                        sent = min(len(case.records), sent + step[1])
                    elif step[0] == "checkpoint":
                        await job.settle()
                        await job.checkpoint()
                        checkpointed = sent
                    elif step[0] == "rescale":
                        await job.rescale(step[1], step[2])
                    else:
                        await job.settle()
                if not last:
                    raise Crash(f"run {run}")
                for key, value, ts in case.records[sent:]:
                    await job.send("src", key, value, ts=ts)
                await job.close_source("src")
                return await job.wait()
        except Crash:
            note(f"run {run} crashed after sending {sent}; the newest checkpoint holds {checkpointed}")
    raise AssertionError("unreachable")


@pytest.mark.timeout(240)
@examples(0.5)
@given(case=queue_cases())
def test_queue_source_resume_matches_the_model(case: QueueCase, tmp_path_factory: pytest.TempPathFactory) -> None:
    note(repr(case))
    directory = tmp_path_factory.mktemp("queue")
    result = asyncio.run(drive_queue(case, directory))
    event(f"checkpoints before a crash: {any(s[0] == 'checkpoint' for run in case.runs[:-1] for s in run)}")
    event(f"rescales: {any(s[0] == 'rescale' for run in case.runs for s in run)}")
    check_outputs(case.records, case.size, directory, result)


# ----------------------------------------------------------------------------------------------- not replayable


async def generated(records: list[model.Rec], started: list[bool]) -> Any:
    """An ``async def`` generator: no position, so it cannot be replayed."""
    for key, value, ts in records:
        started.append(True)
        await asyncio.sleep(0.001)
        yield sl.Record(key, value, ts)


def generator_job(records: list[model.Rec], directory: Path, parallelism: int, crashes: list[Any], started: list[bool]):
    boom = {"directory": str(directory), "crashes": crashes, "lines": False}
    return build(sl.IterableSource(generated(records, started)), directory, parallelism, 3, 4, boom)


@pytest.mark.timeout(240)
@examples(0.1)
@given(
    records=on_time_records(40, 80, 4),
    index=st.integers(0, 20),
    epoch=st.integers(1, 2),
    parallelism=st.sampled_from([1, 3]),
    processes=st.sampled_from([1, 1, 2]),
    batch_size=st.sampled_from([1, 2, 3]),
)
def test_an_async_generator_refuses_to_resume(
    records: list[model.Rec],
    index: int,
    epoch: int,
    parallelism: int,
    processes: int,
    batch_size: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A job over an ``async def`` generator warns once when it starts, crashes after a checkpoint; running it
    again fails at once with ``NotReplayable`` naming the source, its instance and the checkpoint (in one process
    or two), reading nothing."""
    directory = tmp_path_factory.mktemp("generator")
    checkpoints = directory / "checkpoints"
    with capture_logs() as logs, pytest.raises(sl.TaskError, match="crash"):
        sl.run(
            generator_job(records, directory, parallelism, [(index, epoch)], []),
            batch_size=batch_size,
            checkpoint_dir=checkpoints,
            checkpoint_interval=0.002,
            processes=processes,
        )
    if processes == 1:  # the workers' logs stay in the workers
        assert [entry["log_level"] for entry in logs if entry["event"] == WARNING] == ["warning"]
    newest = max(sl.DirectoryCheckpointStore(checkpoints).epochs())
    started: list[bool] = []
    with pytest.raises(sl.NotReplayable) as info:
        sl.run(
            generator_job(records, directory, parallelism, [], started),
            batch_size=batch_size,
            checkpoint_dir=checkpoints,
            checkpoint_interval=0.002,
            processes=processes,
        )
    note(str(info.value))
    check_not_replayable(info.value, newest)
    if processes == 1:
        assert started == []
    assert not (directory / "totals").exists() or sl.read_file_sink(directory / "totals") == []


WARNING = "source cannot be replayed: this job will not be able to resume from its checkpoints"


def check_not_replayable(error: sl.NotReplayable, epoch: int) -> None:
    """The error names the source, its instance and the checkpoint."""
    message = str(error)
    assert "'src'" in message
    assert "instance 0" in message
    assert f"checkpoint {epoch}" in message


def test_an_async_generator_refuses_to_resume_in_start(tmp_path: Path) -> None:
    """``sl.start``: a checkpoint, a crash (an exception leaves the block), then the next ``sl.start`` fails."""
    records = [(KEYS[i % 3], 10 * i, float(i)) for i in range(200)]
    checkpoints = tmp_path / "checkpoints"

    async def crash() -> int:
        reading: list[bool] = []
        async with sl.start(generator_job(records, tmp_path, 2, [], reading), checkpoint_dir=checkpoints) as job:
            await until_true(lambda: len(reading) > 0)  # the generator is being read
            epoch = await job.checkpoint()
            raise Crash(epoch)

    with pytest.raises(Crash) as crashed:
        asyncio.run(crash())
    started: list[bool] = []

    async def resume() -> None:
        async with sl.start(generator_job(records, tmp_path, 2, [], started), checkpoint_dir=checkpoints) as job:
            await job.wait()

    with pytest.raises(sl.NotReplayable) as info:
        asyncio.run(resume())
    check_not_replayable(info.value, crashed.value.args[0])
    assert started == []


# ----------------------------------------------------------------------------------------------- columnar aggregate


class CrashOnce(sl.Task):
    """Takes 3 ms a batch and raises once per planned crash, on its first batch once a checkpoint of at least
    that epoch is saved (and the crash before it has happened). Records its branch needs nothing of."""

    def prepare(self, config: dict[str, Any]) -> None:
        self.directory = Path(config["directory"])
        self.epochs = config["epochs"]

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await asyncio.sleep(0.003)
        for n, epoch in enumerate(self.epochs):
            flag = self.directory / f"crashed-{n}"
            if flag.exists() or (n and not (self.directory / f"crashed-{n - 1}").exists()):
                continue
            if newest_epoch(self.directory / "checkpoints") >= epoch and claim(flag):
                raise Crash(f"crash {n}")


def columnar_job(scenario: columnar.Scenario, directory: Path, parallelism: int, epochs: list[int]) -> sl.Topology:
    """The aggregate of a columnar scenario into a ``FileSink``; beside it, the ``ColumnarSource`` feeds
    ``CrashOnce``."""
    topology = sl.Topology("spec-resume-columnar")
    watermarks = None if scenario.window is None else sl.Watermarks(out_of_orderness=scenario.window[1] / 1000)
    source = sl.ColumnarSource(columnar.source_data(scenario), key="k", value="v", ts="ts")
    src = topology.add_source("src", source, watermarks=watermarks)
    crash = topology.add_task("crash", CrashOnce, config={"directory": str(directory), "epochs": epochs})
    crash.set_input(src)
    node = src
    if scenario.where is not None:
        threshold = pa.scalar(scenario.where, type=columnar.ARROW[scenario.value_kind])
        node = topology.where("where", pc.field("v") > threshold).set_input(node)
    agg = topology.aggregate("agg", scenario.how, parallelism=parallelism, **columnar.aggregate_options(scenario))
    agg.set_input(node, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.FileSink(directory / "out")).set_input(agg)
    return topology


def state_past_64_bits(scenario: columnar.Scenario) -> bool:
    """Whether a ``sum`` or ``mean`` holds, after some row, a sum no 64-bit integer holds (per key, or per key and
    window): what a checkpoint then fails on (``test_a_checkpoint_keeps_a_sum_past_64_bits``)."""
    if scenario.how not in ("sum", "mean") or scenario.value_kind == "float":
        return False
    sums: dict[Any, int] = {}
    for key, value, ts in scenario.rows:
        if value is None or not scenario.kept((key, value, ts)):
            continue
        group = (repr(key), None if scenario.window is None else round(ts * 1000) // scenario.window[0])
        sums[group] = sums.get(group, 0) + value
        if not -(2**63) <= sums[group] <= 2**64 - 1:
            return True
    return False


@pytest.mark.timeout(240)
@examples(0.25)
@given(
    scenario=st.booleans().flatmap(
        lambda windowed: columnar.scenarios(
            windowed=windowed, on_time=True, max_rows=80, min_cuts=10, max_cuts=40, records=False
        )
    ),
    crashes=st.lists(st.integers(1, 2), min_size=1, max_size=2),
    parallelism=st.lists(st.sampled_from([1, 3]), min_size=3, max_size=3),
    interval=st.sampled_from([0.002, 0.005]),
)
def test_columnar_aggregate_resumes_exactly(
    scenario: columnar.Scenario,
    crashes: list[int],
    parallelism: list[int],
    interval: float,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The columnar aggregate of ``test_columnar`` (nulls, dictionaries, sums past 64 bits, ``mean``; per batch,
    at the end, or per on-time window) crashes after checkpoints and resumes, maybe with another parallelism:
    its ``FileSink`` holds the model's results of a run without a crash, each once, in order per key."""
    note(repr(scenario))
    assume(not state_past_64_bits(scenario))  # test_a_checkpoint_keeps_a_sum_past_64_bits
    directory = tmp_path_factory.mktemp("columnar")
    epochs = list(itertools.accumulate(crashes))
    if scenario.columns:
        parallelism = [1, 1, 1]  # SAME_KEY routes by the source's key role: one instance keeps g's rows together
    want, want_late = columnar.run_model(scenario)
    assert want_late == []
    if scenario.window is not None:
        want = [item[:3] for item in want]  # a FileSink keeps key, value and ts
    for run, instances in enumerate(parallelism):
        try:
            sl.run(
                columnar_job(scenario, directory, instances, epochs),
                checkpoint_dir=directory / "checkpoints",
                checkpoint_interval=interval,
            )
        except sl.TaskError as error:
            if "crash" not in str(error):
                raise
            note(f"run {run} crashed: {error}")
            continue
        break
    else:
        raise AssertionError("the job crashed more often than planned")
    event(f"crashes: {run}")
    got = [columnar.typed((r.key, r.value, r.ts)) for r in sl.read_file_sink(directory / "out")]
    note(f"model:     {want}\nstreamlet: {got}")
    assert columnar.by_key(got) == columnar.by_key(want)


def _big_sum(directory: Path, emit: str | None) -> list[Any]:
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array(["a"]), pa.array([v], pa.uint64()), pa.array([float(i)])], ["k", "v", "ts"]
        )
        for i, v in enumerate([2**64 - 1, 1])
    ]
    topology = sl.Topology("spec-resume-big-sum")
    src = topology.add_source("src", sl.ColumnarSource(batches, key="k", value="v", ts="ts"))
    options: dict[str, Any] = {"emit": emit} if emit else {"window": sl.TimeWindow(10, time="event")}
    agg = topology.aggregate("agg", "sum", **options).set_input(src)
    topology.add_sink("out", sl.CollectSink()).set_input(agg)
    return [(r.key, r.value) for r in sl.run(topology, checkpoint_dir=directory).sink("out")]


def test_a_checkpoint_keeps_a_sum_past_64_bits_in_a_window(tmp_path: Path) -> None:
    """The windowed form with a checkpoint directory: the final checkpoint has nothing open, and the sum leaves."""
    assert _big_sum(tmp_path, None) == [("a", 2**64)]


@pytest.mark.parametrize("emit", ["batch", "end"])
def test_a_checkpoint_keeps_a_sum_past_64_bits(tmp_path: Path, emit: str) -> None:
    """uint64 rows 2^64 - 1 and 1 (two batches) summed with a checkpoint directory: the results are those of a run
    without one (found by the differential run: streamlet stops the job at its final checkpoint with an
    EncodingError, "keyed state: the value at ['a'] ... the int 18446744073709551616 does not fit in 64 bits";
    windowed, the same when a checkpoint settles an open window holding such a sum)."""
    want = [("a", 2**64 - 1), ("a", 2**64)] if emit == "batch" else [("a", 2**64)]
    assert _big_sum(tmp_path, emit) == want
