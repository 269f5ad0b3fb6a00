"""Savepoints: a snapshot taken without stopping, kept as a file, and a (changed) job started from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from tests.unit.core.test_rescale import Count, assert_exact_counts, counts_by_key, keyed_count, send_range

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


class CountTwice(sl.Task):
    """New code for the same task: counts by two, from the same state."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            count = self.state.get(record.key, 0) + 2
            self.state.put(record.key, count)
            outputs.emit(record.key, count)


async def take_savepoint(tmp_path: Path) -> tuple[Path, dict[Any, int]]:
    """A job rescaled 2 -> 3 takes a savepoint after 3000 records and goes on to 4000; returns the savepoint
    and every key's count in it."""
    async with sl.start(keyed_count(2), checkpoint_dir=tmp_path / "first") as job:
        await send_range(job, 0, 2000)
        await job.rescale("count", 3)
        await send_range(job, 2000, 3000)
        await job.settle()
        path = await job.savepoint(tmp_path / "savepoints" / "sp-1")
        counts = {key: values[-1] for key, values in counts_by_key(job._result().sink("out")).items()}
        await send_range(job, 3000, 4000)  # after the savepoint: not in it
    assert_exact_counts((await job.wait()).sink("out"), 4000)
    return path, counts


async def test_a_job_starts_from_a_savepoint_with_other_parallelism(tmp_path: Path) -> None:
    """The savepoint holds what was counted when it was taken; a job with 1 instance goes on from there (its
    CollectSink starts empty: a savepoint carries no sink's output, so the counts after it alone come out)."""
    path, counts = await take_savepoint(tmp_path)
    assert path.is_file()
    async with sl.start(keyed_count(1), checkpoint_dir=tmp_path / "second", from_savepoint=path) as job:
        await send_range(job, 3000, 4000)
    assert_exact_counts((await job.wait()).sink("out"), 1000, start=counts)


async def test_changed_code_with_the_same_names_takes_the_state(tmp_path: Path) -> None:
    """New code for task 'count' (it counts by two) starts from the state the old code kept."""
    path, counts = await take_savepoint(tmp_path)
    topology = sl.Topology("rescale")
    source = topology.add_source("in", sl.QueueSource())
    count = topology.add_task("count", CountTwice, parallelism=4).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    async with sl.start(topology, checkpoint_dir=tmp_path / "second", from_savepoint=path) as job:
        await job.send("in", "k5", 1)
    assert [(r.key, r.value) for r in (await job.wait()).sink("out")] == [("k5", counts["k5"] + 2)]


def other_topology(task: str = "count", window: sl.TimeWindow | None = None, sources: int = 1) -> sl.Topology:
    topology = sl.Topology("rescale")
    source = topology.add_source("in", sl.QueueSource(), parallelism=sources)
    count = topology.add_task(task, Count, window=window).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology


async def test_a_savepoint_that_does_not_fit_is_refused_naming_the_node(tmp_path: Path) -> None:
    """A renamed task, a source of other parallelism, a missing or foreign file, no checkpoint_dir: clear errors."""
    path, _ = await take_savepoint(tmp_path)
    (tmp_path / "foreign").write_bytes(b"not a savepoint")
    cases: list[tuple[sl.Topology, Any, dict[str, Any], str]] = [
        (other_topology("counter"), path, {}, "task 'count', which topology 'rescale' has not"),
        (other_topology(sources=2), path, {}, "source 'in' ran with parallelism 1"),
        (other_topology(), tmp_path / "missing", {}, "cannot read the savepoint"),
        (other_topology(), tmp_path / "foreign", {}, "not an intact streamlet savepoint"),
        (other_topology(), path, {"checkpoint_dir": None}, "from_savepoint needs checkpoint_dir"),
    ]
    for topology, savepoint, options, message in cases:
        with pytest.raises(sl.JobError, match=message):
            await start_and_leave(
                topology, **{"checkpoint_dir": tmp_path / "again", **options}, from_savepoint=savepoint
            )


async def start_and_leave(topology: sl.Topology, **options: Any) -> None:
    async with sl.start(topology, **options) as job:
        await job.stop()


async def test_a_savepoint_needs_a_checkpoint_store(tmp_path: Path) -> None:
    """Without checkpoint_dir there is nothing to take the snapshot with: a clear error, the job runs on."""
    async with sl.start(keyed_count(1)) as job:
        with pytest.raises(sl.JobError, match="checkpoint_dir"):
            await job.savepoint(tmp_path / "sp")
        await send_range(job, 0, 10)
    assert_exact_counts((await job.wait()).sink("out"), 10)
