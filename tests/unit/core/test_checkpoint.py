"""Checkpoints: exactly-once state and FileSink output across a crash (an exception, and SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.runtime.channel import LocalChannel
from tests.conftest import as_listed, self_loop
from tests.support import exactly_once
from tests.support.exact_values import same_shape
from tests.support.exactly_once import Bomb, expected_output

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

ROOT = Path(__file__).resolve().parents[3]


def written(output: Path) -> list[tuple[str, int]]:
    return sorted((record.key, record.value) for record in sl.read_file_sink(output))


def test_failure_free_run_writes_every_count_once(tmp_path: Path) -> None:
    """The reference: without a crash the FileSink holds each (key, n) exactly once."""
    result = exactly_once.run(tmp_path / "checkpoints", tmp_path / "out")
    assert written(tmp_path / "out") == expected_output()
    assert result.statistics.checkpoints >= 2


def test_exception_mid_stream_then_restart_is_exactly_once(tmp_path: Path, armed_bomb: Path) -> None:
    """A task raises after two checkpoints; the rerun resumes and the output has no duplicate and no gap."""
    with pytest.raises(sl.TaskError, match=r"^task 'bomb' instance 0 failed on a batch of 10 records"):
        exactly_once.run(armed_bomb, tmp_path / "out")
    assert Bomb.seen_at_crash >= 2
    committed_before_restart = len(sl.read_file_sink(tmp_path / "out"))
    assert 0 < committed_before_restart < len(expected_output())

    result = exactly_once.run(armed_bomb, tmp_path / "out")
    assert written(tmp_path / "out") == expected_output()
    assert result.statistics.nodes["in"].records_out < exactly_once.RECORDS  # it resumed, not restarted


def test_a_collect_sink_keeps_what_it_collected_before_the_checkpoint_it_resumes_from(armed_bomb: Path) -> None:
    """A CollectSink's records up to a checkpoint are part of it: after the crash the rerun's result holds every
    (key, running count) exactly once, not only what came after the restore."""
    with pytest.raises(sl.TaskError, match=r"^task 'bomb' instance 0 failed"):
        exactly_once.run(armed_bomb, None)
    result = exactly_once.run(armed_bomb, None)
    assert result.statistics.nodes["in"].records_out < exactly_once.RECORDS  # it resumed, not restarted
    assert sorted((record.key, record.value) for record in result.sink("out")) == expected_output()


@pytest.mark.parametrize(
    "run_in",
    [{"bomb": "thread", "count": "thread"}, {"relay": "process"}, {"relay": "thread", "count": "thread"}],
    ids=["bomb-and-count-in-threads", "relay-in-a-process", "relay-and-count-in-threads"],
)
def test_tasks_off_the_loop_resume_exactly_once(tmp_path: Path, armed_bomb: Path, run_in: dict[str, str]) -> None:
    """The same crash and rerun with the failing task, the keyed count (its state read and written in a thread)
    or a stateless stage before them in a thread or a process of the job's pool: barriers pass through them,
    the count's state is checkpointed and restored, and the output has no duplicate and no gap."""
    with pytest.raises(sl.TaskError, match=r"^task 'bomb' instance 0 failed on a batch of 10 records"):
        exactly_once.run(armed_bomb, tmp_path / "out", run_in=run_in)
    assert 0 < len(sl.read_file_sink(tmp_path / "out")) < len(expected_output())
    result = exactly_once.run(armed_bomb, tmp_path / "out", run_in=run_in)
    assert written(tmp_path / "out") == expected_output()
    assert result.statistics.nodes["in"].records_out < exactly_once.RECORDS  # it resumed, not restarted


def test_sigkill_mid_stream_then_restart_is_exactly_once(tmp_path: Path) -> None:
    """A child process running the job is killed with SIGKILL after two checkpoints; the rerun is exactly-once."""
    checkpoints, output = tmp_path / "checkpoints", tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.exactly_once", str(checkpoints), str(output)], cwd=ROOT
    )
    try:
        deadline = time.monotonic() + 30
        while len(list(checkpoints.glob("checkpoint-*.msgpack"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
            assert child.poll() is None, "the job ended before it could be killed"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert len(sl.read_file_sink(output)) < len(expected_output())

    result = exactly_once.run(checkpoints, output)
    assert written(output) == expected_output()
    assert result.statistics.nodes["in"].records_out < exactly_once.RECORDS


def test_restart_skips_a_corrupt_newest_checkpoint(tmp_path: Path) -> None:
    """With the newest checkpoint file damaged, the job resumes from the one before and the state is exact."""
    store = sl.InMemoryCheckpointStore()

    class Totals(sl.Task):
        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            for record in inputs.get():
                self.state.put(record.key, self.state.get(record.key, 0) + 1)

        def finish(self, outputs: sl.Outputs) -> None:
            outputs.emit_all(sorted(self.state.items()))

    def topology() -> sl.Topology:
        built = sl.Topology("totals")
        source = built.add_source("in", sl.QueueSource())
        totals = built.add_task("totals", Totals).set_input(source)
        built.add_sink("out", sl.CollectSink()).set_input(totals)
        return built

    async def first_run() -> None:
        async with sl.start(topology(), checkpoint_store=store) as job:
            for epoch_items in (["a", "b"], ["a"], ["c"]):
                for key in epoch_items:
                    await job.send("in", key, 1)
                await job.checkpoint()
            raise KeyboardInterrupt  # leave without finishing, like a crash

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(first_run())
    assert store.epochs() == [1, 2, 3]
    store.corrupt(3, b"STLTCKPT torn")

    async def second_run() -> list[tuple[str, int]]:
        async with sl.start(topology(), checkpoint_store=store) as job:
            await job.close_source("in")
            result = await job.wait()
        return [(r.key, r.value) for r in result.sink("out")]

    assert asyncio.run(second_run()) == [("a", 2), ("b", 1)]  # epoch 2's state: 'c' came after it


def test_finished_job_leaves_a_final_checkpoint_and_a_rerun_starts_fresh(tmp_path: Path) -> None:
    """After a normal end the newest checkpoint is marked finished; running again reads everything again."""
    checkpoints = tmp_path / "checkpoints"
    first = exactly_once.run(checkpoints, tmp_path / "first", interval=None)
    latest = sl.DirectoryCheckpointStore(checkpoints).latest()
    assert latest is not None
    assert latest[1]["finished"] is True
    second = exactly_once.run(checkpoints, tmp_path / "second", interval=None)
    assert first.statistics.nodes["in"].records_out == second.statistics.nodes["in"].records_out == 4000
    assert written(tmp_path / "second") == expected_output()


def test_checkpoints_refuse_cycles() -> None:
    """A topology with a loop cannot take checkpoints yet, and says which edge closes the loop."""
    topology = self_loop()
    message = "topology 'loop': checkpoints are not supported with cycles yet (back edge from 'step' into 'step')"
    with pytest.raises(sl.TopologyError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        sl.run(topology, checkpoint_store=sl.InMemoryCheckpointStore())


def test_checkpoint_without_a_store_is_refused() -> None:
    """job.checkpoint() on a job without a store names the missing option."""
    topology = sl.Topology("plain")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", sl.QueueSource()))

    async def attempt() -> None:
        async with sl.start(topology) as job:
            await job.checkpoint()

    with pytest.raises(sl.JobError, match=r"^job 'plain' has no checkpoint store \(pass checkpoint_dir=\.\.\.\)$"):
        asyncio.run(attempt())


class _AsyncRestoreSink(sl.Sink):
    """A sink whose writer's ``restore`` is ``async def`` and records the restore point it was given."""

    restored: list[sl.RestorePoint | None]

    def __init__(self) -> None:
        self.restored = []

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        return _AsyncRestoreWriter(self.restored)


class _AsyncRestoreWriter(sl.SinkWriter):
    def __init__(self, restored: list[sl.RestorePoint | None]) -> None:
        self.restored = restored

    def write(self, batch: list[sl.Record]) -> None:
        pass

    async def restore(self, point: sl.RestorePoint | None) -> None:
        await asyncio.sleep(0)
        self.restored.append(point)


def restore_job(sink: sl.Sink, directory: Path, attempt: str) -> sl.Job:
    """source [1, 2, 3] -> ``sink``, as run ``attempt``, with checkpoints in ``directory``."""
    topology = sl.Topology("restore")
    topology.add_sink("out", sink).set_input(topology.add_source("in", [1, 2, 3]))
    return sl.Job(
        topology, channel_factory=LocalChannel, checkpoint_store=sl.DirectoryCheckpointStore(directory), attempt=attempt
    )


async def test_an_async_sink_restore_is_awaited_with_the_epoch_and_attempt(tmp_path: Path) -> None:
    """A sink's ``async def restore`` runs at the start of each run: None, then (final epoch, the run that took it)."""
    sink = _AsyncRestoreSink()
    await restore_job(sink, tmp_path, "first").run()
    await restore_job(sink, tmp_path, "second").run()
    assert sink.restored == [None, sl.RestorePoint(1, "first")]


async def test_a_checkpoint_records_the_attempt_that_took_it(tmp_path: Path) -> None:
    """The checkpoint document names the run (``Job(attempt=...)``) that took it."""
    await restore_job(_AsyncRestoreSink(), tmp_path, "run-7").run()
    point = sl.DirectoryCheckpointStore(tmp_path).latest()
    assert point is not None
    assert (point[0], point[1]["attempt"]) == (1, "run-7")


class _ContextSink(sl.Sink):
    """A sink that keeps the contexts it was opened with."""

    def __init__(self) -> None:
        self.contexts: list[sl.SinkContext] = []

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        self.contexts.append(context)
        return _AsyncRestoreWriter([])


def test_sinks_learn_the_job_id_and_a_new_attempt_per_run() -> None:
    """Each run's sinks get job id ``local.<topology>`` and an attempt token no other run has."""
    sink = _ContextSink()
    topology = sl.Topology("ids")
    topology.add_sink("out", sink).set_input(topology.add_source("in", [1]))
    sl.run(topology)
    sl.run(topology)
    first, second = sink.contexts
    assert (first.job_id, second.job_id) == ("local.ids", "local.ids")
    assert first.attempt != second.attempt
    assert re.fullmatch(r"[0-9a-f]{12}", first.attempt)


def test_an_attempt_that_is_no_file_name_is_refused() -> None:
    """``Job(attempt=...)`` must be a safe file name; the error names what was given."""
    topology = sl.Topology("bad")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", [1]))
    with pytest.raises(sl.JobError, match=r"^attempt '\.\./x' is not a usable run token: "):
        sl.Job(topology, channel_factory=LocalChannel, attempt="../x")


class _FailingCommitSink(sl.Sink):
    """A sink whose ``commit`` raises."""

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        return _FailingCommitWriter()


class _FailingCommitWriter(_AsyncRestoreWriter):
    def __init__(self) -> None:
        super().__init__([])

    def commit(self, epoch: int) -> None:
        raise OSError(f"cannot publish epoch {epoch}")


def test_a_failing_sink_commit_stops_the_job_with_that_error(tmp_path: Path) -> None:
    """An error in a sink's commit is what run() raises (not wrapped in an exception group)."""
    topology = sl.Topology("commit")
    topology.add_sink("out", _FailingCommitSink()).set_input(topology.add_source("in", [1, 2, 3]))
    with pytest.raises(OSError, match=r"^cannot publish epoch 1$"):
        sl.run(topology, checkpoint_dir=tmp_path)


# -- values keep their types across a resume --------------------------------------------


class _CrashOnKey(sl.Task):
    """Passes records on; a record keyed ``"crash"`` makes it raise (sent once, in the first run only)."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        batch = inputs.get()
        if any(record.key == "crash" for record in batch):
            raise RuntimeError("injected crash")
        outputs.emit_batch(batch)


class _Buffered(sl.Task):
    """A windowed task: emits every buffered record of its window as it came."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit(record.key, record.value)


class _TupleState(sl.Task):
    """Keeps, per key, the tuple of every value seen (tuple + tuple: a list back from a restore would fail)."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, (*self.state.get(record.key, ()), record.value))

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(list(self.state.items()))


def _resumable(fold: Any) -> sl.Topology:
    """in -> crash -> {window_reduce(fold), buffered window, tuple state} -> one CollectSink each."""
    topology = sl.Topology("exact")
    source = topology.add_source("in", sl.QueueSource())
    passed = topology.add_task("crash", _CrashOnKey).set_input(source)
    reduced = topology.window_reduce("reduce", fold, window=sl.CountWindow(100)).set_input(passed)
    buffered = topology.add_task("buffer", _Buffered, window=sl.CountWindow(100)).set_input(passed)
    kept = topology.add_task("state", _TupleState).set_input(passed)
    for name, node in (("reduced", reduced), ("buffered", buffered), ("kept", kept)):
        topology.add_sink(name, sl.CollectSink()).set_input(node)
    return topology


def _crash_after_a_checkpoint(fold: Any, checkpoints: Path, before: list[tuple[Any, Any]]) -> None:
    """Run 1: send ``before``, take a checkpoint, then a record that makes a task raise."""

    async def first_run() -> None:
        async with sl.start(_resumable(fold), checkpoint_dir=checkpoints) as job:
            for key, value in before:
                await job.send("in", key, value)
            await job.checkpoint()
            await job.send("in", "crash", (0, 0))
            await job.wait()

    with pytest.raises(
        sl.TaskError, match=r"^task 'crash' instance 0 failed on record with key 'crash': RuntimeError: injected crash$"
    ):
        asyncio.run(first_run())


def _resume(fold: Any, checkpoints: Path, after: list[tuple[Any, Any]]) -> sl.JobResult:
    """Run 2, from the checkpoint: send ``after`` and end the input."""

    async def second_run() -> sl.JobResult:
        async with sl.start(_resumable(fold), checkpoint_dir=checkpoints) as job:
            for key, value in after:
                await job.send("in", key, value)
            await job.close_source("in")
            return await job.wait()

    return asyncio.run(second_run())


def _results(result: sl.JobResult, sink: str) -> list[tuple[Any, Any]]:
    return [(record.key, record.value) for record in result.sink(sink)]


@pytest.mark.parametrize(
    ("fold", "expected"),
    [
        (lambda a, b: (a[0] + b[0], a[1] + b[1]), [("a", (6, 60)), (("u", 1), (5, 50))]),
        (lambda a, b: a + b, [("a", (1, 10, 2, 20, 3, 30)), (("u", 1), (5, 50))]),
    ],
    ids=["pairwise-sum", "concatenate"],
)
def test_a_window_reduce_folding_tuples_resumes_with_tuples(tmp_path: Path, fold: Any, expected: Any) -> None:
    """Folded tuples come back from the checkpoint as tuples: the fold goes on (a list + a tuple used to be
    a TypeError), and a key with nothing after the restore still emits a tuple."""
    checkpoints = tmp_path / "checkpoints"
    _crash_after_a_checkpoint(fold, checkpoints, [("a", (1, 10)), ("a", (2, 20)), (("u", 1), (5, 50))])
    result = _resume(fold, checkpoints, [("a", (3, 30))])
    reduced = _results(result, "reduced")
    assert reduced == expected
    assert all(same_shape(got, want) for got, want in zip(reduced, expected, strict=True))


def test_buffered_window_records_and_state_keep_tuples_across_a_resume(tmp_path: Path, each_state_backend: str) -> None:
    """Records buffered in an open window, and self.state values and keys, are restored with their tuples."""
    checkpoints = tmp_path / "checkpoints"
    before: list[tuple[Any, Any]] = [("a", (1, (2, "x"))), (("u", 1), [(3,), {4: (5,)}])]
    fold = lambda a, b: a  # noqa: E731 - the reduce branch is not what this test looks at
    _crash_after_a_checkpoint(fold, checkpoints, before)
    result = _resume(fold, checkpoints, [("a", (6,))])
    expected_buffer = [*before, ("a", (6,))]
    expected_state = [("a", ((1, (2, "x")), (6,))), (("u", 1), ([(3,), {4: (5,)}],))]
    buffered, kept = _results(result, "buffered"), as_listed(_results(result, "kept"), each_state_backend)
    assert buffered == expected_buffer
    assert same_shape(buffered, expected_buffer)
    assert kept == as_listed(expected_state, each_state_backend)
    assert same_shape(kept, expected_state)
