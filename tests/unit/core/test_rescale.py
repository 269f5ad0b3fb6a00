"""Live reconfiguration in one process: rescale a task and move its key segments while records flow.

Every test checks exact results: a keyed count emits 1, 2, 3, ... per key in
order, so a lost record leaves a gap, a doubled one a repeat, and a reordered
one a descent, whatever instance handled it.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamlet as sl
from streamlet.core.model.segments import SegmentTable

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


class Count(sl.Task):
    """Per key: how many records so far, with the index of the instance that counted it."""

    def prepare(self, config: dict[str, Any]) -> None:
        self.index = config.get("index", -1)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            count = self.state.get(record.key, 0) + 1
            self.state.put(record.key, count)
            outputs.emit(record.key, count)


def keyed_count(parallelism: int = 2, **options: Any) -> sl.Topology:
    topology = sl.Topology("rescale")
    source = topology.add_source("in", sl.QueueSource())
    count = topology.add_task("count", Count, parallelism=parallelism, **options)
    count.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology


async def send_range(job: sl.Job, start: int, stop: int, keys: int = 97) -> None:
    for i in range(start, stop):
        await job.send("in", f"k{i % keys}", i)


def counts_by_key(records: list[sl.Record]) -> dict[Any, list[int]]:
    seen: dict[Any, list[int]] = defaultdict(list)
    for record in records:
        seen[record.key].append(record.value)
    return seen


def assert_exact_counts(
    records: list[sl.Record], total: int, keys: int = 97, start: dict[Any, int] | None = None
) -> None:
    """Every key counted 1, 2, 3, ... (from ``start``) in order: nothing lost, doubled or reordered."""
    seen = counts_by_key(records)
    assert sum(len(values) for values in seen.values()) == total
    for key, values in seen.items():
        first = (start or {}).get(key, 0) + 1
        assert values == list(range(first, first + len(values))), key


async def test_rescale_up_and_down_keeps_every_keyed_count_exact() -> None:
    """2 -> 4 -> 1 -> 3 instances while records flow: counts continue per key with nothing lost or doubled."""
    async with sl.start(keyed_count(2)) as job:
        await send_range(job, 0, 3000)
        await job.rescale("count", 4)
        assert job.segment_table("count") == SegmentTable.contiguous(128, 4, version=1)
        await send_range(job, 3000, 6000)
        await job.rescale("count", 1)
        await send_range(job, 6000, 9000)
        await job.rescale("count", 3)
        await send_range(job, 9000, 12000)
        assert job.reconfigurations == 3
    result = await job.wait()
    assert_exact_counts(result.sink("out"), 12000)
    count = result.statistics.nodes["count"]
    assert (count.parallelism, count.records_in, count.records_out) == (3, 12000, 12000)


async def test_rescale_moves_only_the_segments_that_change_owner() -> None:
    """Instances that keep their segments keep their state objects: only moved keys change hands."""
    async with sl.start(keyed_count(2)) as job:
        await send_range(job, 0, 2000)
        await job.settle()
        first = job._plan.instances["count"][0]  # type: ignore[union-attr]
        before = dict(first.state.values)  # type: ignore[attr-defined]
        await job.rescale("count", 3)
        table = job.segment_table("count")
        kept = {key: count for key, count in before.items() if table.owner(key) == 0}
        assert dict(first.state.values) == kept  # type: ignore[attr-defined]
        assert 0 < len(kept) < len(before)
        await job.close_source("in")
    assert_exact_counts((await job.wait()).sink("out"), 2000)


async def test_move_segments_hands_keys_over_with_their_state() -> None:
    """Segments moved to another instance: their keys are counted on there, from where they were."""
    async with sl.start(keyed_count(2)) as job:
        await send_range(job, 0, 2000, keys=40)
        old = job.segment_table("count")
        moves = {segment: 1 - old.owners[segment] for segment in range(0, 128, 5)}
        await job.move_segments("count", moves)
        assert job.segment_table("count") == old.moved_to(moves)
        await job.settle()
        holders = {i.index: dict(i.state.values) for i in job._plan.instances["count"]}  # type: ignore[union-attr, attr-defined]
        for index, state in holders.items():
            assert all(job.segment_table("count").owner(key) == index for key in state)
        await send_range(job, 2000, 4000, keys=40)
    assert_exact_counts((await job.wait()).sink("out"), 4000, keys=40)


async def test_stateless_round_robin_task_rescales_with_every_record_once() -> None:
    """A map fed round robin goes 1 -> 3 -> 2: every record comes out once."""
    topology = sl.Topology("stateless")
    source = topology.add_source("in", sl.QueueSource())
    double = topology.map("double", lambda r: (r.key, r.value * 2)).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(double)
    async with sl.start(topology, batch_size=50) as job:
        await send_range(job, 0, 1000)
        await job.rescale("double", 3)
        await send_range(job, 1000, 2000)
        await job.rescale("double", 2)
        await send_range(job, 2000, 3000)
    result = await job.wait()
    assert sorted(record.value for record in result.sink("out")) == [2 * i for i in range(3000)]
    assert result.statistics.nodes["double"].parallelism == 2


def windowed_count(parallelism: int) -> sl.Topology:
    topology = sl.Topology("windowed")
    source = topology.add_source("in", sl.QueueSource(), watermarks=sl.Watermarks(out_of_orderness=0))
    window = sl.TimeWindow(10, time="event")
    counts = topology.window_reduce("count", "count", window, parallelism=parallelism)
    counts.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    return topology


async def run_windowed(rescales: dict[int, int]) -> list[tuple[Any, Any, Any]]:
    async with sl.start(windowed_count(2)) as job:
        for i in range(3000):
            if i in rescales:
                await job.rescale("count", rescales[i])
            await job.send("in", f"k{i % 13}", 1, ts=i / 50)
    return sorted((r.key, r.window, r.value) for r in (await job.wait()).sink("out"))


async def test_event_time_windows_give_the_same_results_across_rescales() -> None:
    """Open windows move with their keys, watermarks reach new instances: results equal a run without change."""
    expected = await run_windowed({})
    assert len(expected) == 13 * 6
    assert await run_windowed({700: 4, 1500: 1, 2200: 3}) == expected


async def rescale_checkpoint_and_crash(checkpoints: Path, facts: dict[str, Any]) -> None:
    """Rescale 2 -> 3, move a segment, checkpoint, then crash; ``facts`` gets the table."""
    async with sl.start(keyed_count(2), checkpoint_dir=checkpoints) as job:
        await send_range(job, 0, 3000)
        await job.rescale("count", 3)
        await job.move_segments("count", {0: 2})
        await send_range(job, 3000, 4000)
        await job.settle()
        await job.checkpoint()
        facts["table"] = job.segment_table("count")
        raise Crash


async def test_a_checkpoint_after_a_rescale_restores_with_any_parallelism(tmp_path: Path) -> None:
    """The checkpoint holds the new layout: the next run resumes with it (same count) or regroups (other count);
    the CollectSink gives back the 4 000 counts it had at the checkpoint, so every key counts 1, 2, 3, ... once."""
    checkpoints, facts = tmp_path / "checkpoints", {}
    with pytest.raises(Crash):  # the job stops without a final checkpoint: the next run resumes from ours
        await rescale_checkpoint_and_crash(checkpoints, facts)
    table = facts["table"]
    for parallelism in (3, 2):
        copy = tmp_path / f"resume-{parallelism}"  # each run finishes with a final checkpoint of its own
        shutil.copytree(checkpoints, copy)
        async with sl.start(keyed_count(parallelism), checkpoint_dir=copy) as job:
            if parallelism == 3:
                assert job.segment_table("count") == table  # the moved segment stayed moved
            await send_range(job, 4000, 5000)
        assert_exact_counts((await job.wait()).sink("out"), 5000)


class Crash(Exception):
    """Stops a job the hard way."""


class Gate(sl.Sink):
    """A sink whose writes wait while it is held (to catch a reconfiguration half way); ``stuck`` is set
    once a write waits."""

    def __init__(self, held: bool = True) -> None:
        self.opened = anyio.Event()
        self.stuck = anyio.Event()
        if not held:
            self.opened.set()

    def hold(self) -> None:
        self.opened = anyio.Event()

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        gate = self

        class Writer(sl.SinkWriter):
            async def write(self, batch: list[sl.Record]) -> None:
                if not gate.opened.is_set():
                    gate.stuck.set()
                    await gate.opened.wait()

        return Writer()


def gated_count(gate: Gate) -> sl.Topology:
    topology = sl.Topology("held")
    source = topology.add_source("in", sl.QueueSource())
    count = topology.add_task("count", Count, parallelism=2).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", gate).set_input(count)
    return topology


async def crash_during_a_rescale(checkpoints: Path, facts: dict[str, Any]) -> None:
    """Checkpoint, count more, start a rescale the held sink keeps from completing, then crash."""
    gate = Gate(held=False)
    async with sl.start(gated_count(gate), checkpoint_dir=checkpoints) as job:
        await send_range(job, 0, 2000)
        await job.settle()
        await job.checkpoint()
        facts["counts"] = {i.index: dict(i.state.values) for i in job._plan.instances["count"]}  # type: ignore[union-attr, attr-defined]
        gate.hold()
        await send_range(job, 2000, 2500)  # counted, then stuck at the sink: never checkpointed
        await gate.stuck.wait()
        with anyio.move_on_after(0.2):  # the caller gives up waiting; the reconfiguration goes on in the job
            await job.rescale("count", 3)
        facts["reconfigurations"] = job.reconfigurations
        facts["under_way"] = job._env.reconfiguration is not None
        raise Crash


async def test_a_crash_during_a_rescale_recovers_to_the_checkpoint_before_it(tmp_path: Path) -> None:
    """No checkpoint crosses a reconfiguration: a crash in the middle of one resumes from the last checkpoint
    before it, with the old layout and exactly the state it recorded."""
    checkpoints, facts = tmp_path / "checkpoints", {}
    with pytest.raises(Crash):
        await crash_during_a_rescale(checkpoints, facts)
    assert (facts["reconfigurations"], facts["under_way"]) == (0, True)
    before = {key: count for state in facts["counts"].values() for key, count in state.items()}
    async with sl.start(keyed_count(2), checkpoint_dir=checkpoints) as job:
        await job.settle()
        restored = {i.index: dict(i.state.values) for i in job._plan.instances["count"]}  # type: ignore[union-attr, attr-defined]
        assert restored == facts["counts"]  # the same keys on the same instances: the old layout
        await send_range(job, 2500, 3500)
    assert_exact_counts((await job.wait()).sink("out"), 1000, start=before)


async def test_bad_reconfigurations_are_refused_and_the_job_runs_on() -> None:
    """Unknown task, a source, 0 or too many instances, a bad segment move, a second change at once,
    a window counting a whole instance's records: a clear error each, and the counts stay exact."""
    async with sl.start(keyed_count(2, max_parallelism=8)) as job:
        await send_range(job, 0, 500)
        cases: list[tuple[Any, str]] = [
            (job.rescale("nope", 2), "no task called 'nope'"),
            (job.rescale("in", 2), "no task called 'in'"),
            (job.rescale("count", 0), "1 to 8 instances"),
            (job.rescale("count", 9), "1 to 8 instances"),
            (job.move_segments("count", {8: 0}), "segments 0 to 7"),
            (job.move_segments("count", {1: 5}), "instances 0 to 1"),
        ]
        for call, message in cases:
            with pytest.raises(sl.ReconfigurationError, match=message):
                await call
        await send_range(job, 500, 1000)
    assert_exact_counts((await job.wait()).sink("out"), 1000)
    with pytest.raises(sl.ReconfigurationError, match="not running"):
        await job.rescale("count", 3)


async def test_a_second_change_during_a_reconfiguration_is_refused() -> None:
    """While one rescale waits (its downstream sink is held), another is refused; both ends stay exact."""
    gate = Gate()
    async with sl.start(gated_count(gate)) as job, anyio.create_task_group() as group:
        await send_range(job, 0, 300)
        group.start_soon(job.rescale, "count", 3)
        while job.reconfigurations == 0 and job._env.reconfiguration is None:
            await anyio.lowlevel.checkpoint()
        with pytest.raises(sl.ReconfigurationError, match="one change at a time"):
            await job.rescale("count", 1)
        gate.opened.set()
    assert job.reconfigurations == 1
    assert job.statistics().nodes["count"].records_out == 300


async def test_count_windows_over_a_whole_instance_cannot_be_rescaled() -> None:
    """CountWindow without per_key counts an instance's records, not a key's: refused, named."""
    topology = sl.Topology("counted")
    source = topology.add_source("in", sl.QueueSource())
    counts = topology.window_reduce("count", "count", sl.CountWindow(5), parallelism=2)
    counts.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    async with sl.start(topology) as job:
        with pytest.raises(sl.ReconfigurationError, match="per_key=True"):
            await job.rescale("count", 3)
        await send_range(job, 0, 100)
    assert sum(record.value for record in (await job.wait()).sink("out")) == 100


def test_max_parallelism_below_parallelism_is_a_topology_error() -> None:
    """More instances than segments cannot be: named at add_task, and for an override at validation."""
    topology = sl.Topology("segments")
    with pytest.raises(sl.TopologyError, match="task 'count': parallelism 5 is more than max_parallelism 4"):
        topology.add_task("count", Count, parallelism=5, max_parallelism=4)
    source = topology.add_source("in", [1])
    topology.add_task("count", Count, parallelism=2, max_parallelism=4).set_input(source)
    topology.nodes["count"].parallelism = 6
    with pytest.raises(sl.TopologyError, match="task 'count': parallelism 6 is more than max_parallelism 4"):
        topology.validate()
