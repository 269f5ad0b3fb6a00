"""Core hooks for connectors: completed checkpoints reach sources, source dead letters, async sink abort."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio.lowlevel
import pytest

import streamlet as sl


class CountingReader(sl.SourceReader):
    """Reads 0..n-1 in batches of one, records which checkpoints completed with which position."""

    completed: list[tuple[int, Any]]

    def __init__(self, context: sl.SourceContext, n: int, poison: set[int]) -> None:
        self.context, self.n, self.poison, self.next = context, n, poison, 0
        self.completed = []

    async def read(self, max_records: int) -> list[sl.Record] | None:
        while self.next < self.n:
            value, self.next = self.next, self.next + 1
            if value in self.poison:  # what a connector does with a record it cannot decode
                self.context.dead_letters.append(
                    sl.DeadLetter(self.context.node, self.context.index, sl.Record(None, value), "bad", ValueError())
                )
                continue
            return [sl.Record(None, value)]
        return None

    def position(self) -> int:
        return self.next

    async def seek(self, position: Any) -> None:
        self.next = position

    async def checkpoint_complete(self, epoch: int, position: Any) -> None:
        self.completed.append((epoch, position))


class CountingSource(sl.Source):
    def __init__(self, n: int, poison: set[int] | None = None) -> None:
        self.n, self.poison = n, poison or set()
        self.readers: list[CountingReader] = []

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        reader = CountingReader(context, self.n, self.poison)
        self.readers.append(reader)
        return reader


def one_source_topology(source: sl.Source, sink: sl.Sink | None = None) -> sl.Topology:
    topology = sl.Topology("hooks")
    node = topology.add_source("in", source)
    topology.add_sink("out", sink or sl.CollectSink()).set_input(node)
    return topology


async def test_reader_hears_of_each_completed_checkpoint_with_its_position(tmp_path: Path) -> None:
    """checkpoint_complete(epoch, position) reaches the reader after the save, also after it closed."""
    source = CountingSource(5)
    async with sl.start(one_source_topology(source), checkpoint_dir=tmp_path) as job:
        first = await job.checkpoint()
    [reader] = source.readers
    assert reader.completed[0][0] == first
    assert reader.completed[-1] == (first + 1, 5)  # the final checkpoint, after the source ended and closed
    assert len(reader.completed) == 2


def test_without_checkpoints_no_reader_hears_of_any() -> None:
    """No checkpoint store: checkpoint_complete is never called."""
    source = CountingSource(3)
    sl.run(one_source_topology(source))
    assert source.readers[0].completed == []


def test_source_dead_letters_are_the_jobs() -> None:
    """What a reader appends to context.dead_letters is in the result and counted."""
    result = sl.run(one_source_topology(CountingSource(4, poison={1, 2})))
    assert [letter.record.value for letter in result.dead_letters] == [1, 2]
    assert result.statistics.dead_lettered == 2
    assert [record.value for record in result.sink("out")] == [0, 3]


class AsyncAbortSink(sl.Sink):
    def __init__(self) -> None:
        self.aborted = 0

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        return AsyncAbortWriter(self)


class AsyncAbortWriter(sl.SinkWriter):
    def __init__(self, sink: AsyncAbortSink) -> None:
        self.sink = sink

    def write(self, batch: list[sl.Record]) -> None:
        raise RuntimeError("disk full")

    async def abort(self) -> None:
        self.sink.aborted += 1


def test_an_async_abort_is_awaited_when_the_job_fails() -> None:
    """A writer's async def abort() runs to its end when the job stops with an error."""
    sink = AsyncAbortSink()
    # the source's batches: one record each
    failure = r"^sink 'out' instance 0 failed writing the record with key None: RuntimeError: disk full$"
    with pytest.raises(sl.SinkError, match=failure) as failed:
        sl.run(one_source_topology(CountingSource(3), sink))
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert sink.aborted == 1


class SlowCloseSink(sl.Sink):
    """A sink whose close takes a checkpoint interval (the clock moves while it closes)."""

    def __init__(self, clock: sl.ManualClock) -> None:
        self.clock = clock
        self.prepared_after_close: list[int] = []

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        return SlowCloseWriter(self)


class SlowCloseWriter(sl.SinkWriter):
    def __init__(self, sink: SlowCloseSink) -> None:
        self.sink = sink
        self.closed = False

    def write(self, batch: list[sl.Record]) -> None:
        pass

    def prepare_commit(self, epoch: int) -> None:
        if self.closed:
            self.sink.prepared_after_close.append(epoch)

    async def close(self) -> None:
        self.closed = True
        self.sink.clock.advance(10)  # the interval passes while the writer closes (a producer's stop, say)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()


async def test_no_checkpoint_is_triggered_after_the_final_one(tmp_path: Path) -> None:
    """Once the final checkpoint has begun, the interval timer triggers no other: sinks are closing."""
    clock = sl.ManualClock()
    sink = SlowCloseSink(clock)
    async with sl.start(
        one_source_topology(CountingSource(3), sink), clock=clock, checkpoint_dir=tmp_path, checkpoint_interval=1.0
    ) as job:
        result = await job.wait()
    assert sink.prepared_after_close == []
    assert result.statistics.checkpoints == 1
