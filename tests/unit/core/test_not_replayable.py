"""A source that cannot be replayed (an ``async def`` generator) never "resumes" into a wrong total: a job
whose checkpoint holds no position for it refuses to resume, in every runner, naming the source; a job that
starts with checkpoints says so once at the start. A ``QueueSource`` resumes: its program feeds it."""

from __future__ import annotations

import asyncio
import re
import runpy
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

import streamlet as sl
from streamlet.cli import main

HALF, NUMBERS = 50, 100


class Sum(sl.Task):
    """Each key's total, at the end."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)

    def finish(self, outputs: sl.Outputs) -> None:
        for key, total in self.state.items():
            outputs.emit(key, total)


JOB = '''
import anyio
from pathlib import Path

import streamlet as sl
from streamlet.core.state.store import DirectoryCheckpointStore

HERE = Path(__file__).parent
HALF, NUMBERS = 50, 100


async def numbers():
    """0..99; the second half only once a checkpoint of the first is on disk."""
    for n in range(HALF):
        yield (n % 3, n)
    with anyio.fail_after(30):
        while not DirectoryCheckpointStore(HERE / "state").epochs():
            await anyio.sleep(0.01)  # the condition is a file another process writes: looked at, not timed
    for n in range(HALF, NUMBERS):
        yield (n % 3, n)


def crash_once(record):
    marker = HERE / "crash-once"
    if record.value >= HALF and marker.exists():
        marker.unlink()
        raise RuntimeError("crash once")
    return record.key, record.value


class Sum(sl.Task):
    def execute(self, inputs, outputs):
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)

    def finish(self, outputs):
        for key, total in self.state.items():
            outputs.emit(key, total)


topology = sl.Topology("generated")
source = topology.add_source("numbers", numbers())
checked = topology.map("crash-once", crash_once).set_input(source)
sums = topology.add_task("sum", Sum).set_input(checked, partitioning=sl.SAME_KEY)
topology.add_sink("sums", sl.CollectSink()).set_input(sums)
'''

REFUSAL = (
    r"source 'numbers' instance 0 cannot be replayed: checkpoint \d+ of job 'generated' holds no position for "
    r"it, so resuming would read it again from its start and count its records twice; use a replayable source "
    r"\(a list, a file, Kafka, a reader with position\(\) and seek\(\)\), or run without checkpoints, or start "
    r"afresh without the checkpoint"
)


def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "generated_job.py"
    path.write_text(JOB, encoding="utf-8")
    (tmp_path / "crash-once").touch()
    return path


def topology_of(path: Path) -> sl.Topology:
    topology: sl.Topology = runpy.run_path(str(path))["topology"]
    return topology


@pytest.mark.parametrize("processes", [1, 2])
def test_a_generator_source_refuses_to_resume_instead_of_counting_twice(tmp_path: Path, processes: int) -> None:
    """The first run crashes after a checkpoint; the rerun fails with NotReplayable, never a wrong sum."""
    path = job_file(tmp_path)
    options: dict[str, Any] = {"checkpoint_dir": tmp_path / "state", "checkpoint_interval": 0.01}
    with pytest.raises(sl.TaskError, match="crash once"):
        sl.run(topology_of(path), processes=processes, **options)
    with pytest.raises(sl.NotReplayable, match=f"^{REFUSAL}$") as refused:
        sl.run(topology_of(path), processes=processes, **options)
    assert (refused.value.source, refused.value.instance) == ("numbers", 0)


def test_without_a_crash_the_generator_job_is_exact_and_warned_of_once(tmp_path: Path) -> None:
    """With checkpoints and no crash the sums are exact; the start says once that it cannot resume."""
    path = job_file(tmp_path)
    (tmp_path / "crash-once").unlink()
    with capture_logs() as logs:
        result = sl.run(topology_of(path), checkpoint_dir=tmp_path / "state", checkpoint_interval=0.01)
    assert sorted((r.key, r.value) for r in result.sink("sums")) == [(k, sum(range(k, NUMBERS, 3))) for k in range(3)]
    warnings = [entry for entry in logs if entry["event"].startswith("source cannot be replayed")]
    assert [(entry["event"], entry["source"]) for entry in warnings] == [
        ("source cannot be replayed: this job will not be able to resume from its checkpoints", "numbers")
    ]


def test_streamlet_run_refuses_to_resume_a_generator_source(tmp_path: Path) -> None:
    """The CLI rerun with the same --state-dir: exit 1 and the refusal, not a report of wrong sums."""
    path = job_file(tmp_path)
    options = ("--state-dir", str(tmp_path / "state"), "--checkpoint-interval", "0.01")
    crashed = CliRunner().invoke(main, ["run", str(path), *options])
    assert crashed.exit_code == 1
    assert "RuntimeError: crash once" in crashed.stderr
    resumed = CliRunner().invoke(main, ["run", str(path), *options])
    assert (resumed.exit_code, resumed.stdout) == (1, "")
    assert re.fullmatch(f"error: NotReplayable: {REFUSAL}\n", resumed.stderr), resumed.stderr


def test_a_queue_source_resumes_with_what_its_program_sends() -> None:
    """The program feeds a QueueSource: after a restore it sends what comes next, and the state is kept."""
    store = sl.InMemoryCheckpointStore()

    def topology() -> sl.Topology:
        built = sl.Topology("fed")
        counts = built.add_task("count", Sum)
        counts.set_input(built.add_source("in", sl.QueueSource()), partitioning=sl.SAME_KEY)
        built.add_sink("out", sl.CollectSink()).set_input(counts)
        return built

    async def first_run() -> None:
        async with sl.start(topology(), checkpoint_store=store) as job:
            await job.send("in", "a", 1)
            await job.checkpoint()
            raise KeyboardInterrupt  # leave without finishing, like a crash

    async def second_run() -> list[tuple[Any, Any]]:
        async with sl.start(topology(), checkpoint_store=store) as job:
            await job.send("in", "a", 1)
            await job.close_source("in")
            result = await job.wait()
        return [(r.key, r.value) for r in result.sink("out")]

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(first_run())
    assert asyncio.run(second_run()) == [("a", 2)]
