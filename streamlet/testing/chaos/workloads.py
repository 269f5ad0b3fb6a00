"""What a chaos run runs: a topology, its input, paced over virtual time, and how the run steers it.

A :class:`Workload` is a function building a topology, the items each named
source reads, and the options of the run (checkpoints, a live rescale under
load). The harness replaces each named source by a :class:`PacedSource` (the
same items, ``per_read`` at a time every ``every`` seconds of virtual time,
so faults land while records flow, replayable from a checkpoint) and every
sink by an :class:`~streamlet.testing.ExactlyOnceSink`; the checker compares
what those committed with the same topology run in-process.

The built-in workloads (:data:`WORKLOADS`): keyed counts into an exactly-once
sink, event-time windows, a loop, live changes under load (a rescale, a rescale
onto a worker that joins the cluster, a migration), shedding half the
input for a while with ``recover`` (every shed record replayed), and a task
that skips poison records after writing their state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import streamlet as sl
from streamlet.core.model.record import Batch
from streamlet.core.model.sources import Source, SourceContext, SourceReader, to_elements

RECORDS = 10_000  # records of each built-in workload
POISON_EVERY = 97  # the poison workload's task fails on values divisible by it


class PacedSource(Source):
    """``items``, ``per_read`` at a time every ``every`` seconds; replayable by position.

    With parallelism n, instance i reads items i, i+n, ... (like ``IterableSource``).
    """

    def __init__(self, items: Iterable[Any], per_read: int = 50, every: float = 0.05) -> None:
        self.items = list(items)
        self.per_read = per_read
        self.every = every

    def open(self, context: SourceContext) -> SourceReader:
        share = self.items[context.index :: context.parallelism]
        return _PacedReader(share, self.per_read, self.every, context)


class _PacedReader(SourceReader):
    gives_elements = True

    def __init__(self, items: list[Any], per_read: int, every: float, context: SourceContext) -> None:
        self.items = items
        self.per_read = per_read
        self.every = every
        self.clock = context.clock
        self.read_so_far = 0

    async def read(self, max_records: int) -> Batch | None:
        if self.read_so_far >= len(self.items):
            return None
        if self.read_so_far:
            await asyncio.sleep(self.every)
        upto = min(len(self.items), self.read_so_far + min(max_records, self.per_read))
        items, self.read_so_far = self.items[self.read_so_far : upto], upto
        return to_elements(items, self.clock.now())

    def position(self) -> int:
        return self.read_so_far

    async def seek(self, position: Any) -> None:
        self.read_so_far = int(position)


@dataclass(frozen=True)
class Workload:
    """A topology to run under faults: ``build()`` makes it, ``inputs`` feed its named sources.

    ``checkpoint_interval``: seconds between checkpoints (``None``: none; a
    topology with a loop takes none, and a failure restarts it from the
    start). ``rescale``: (task, parallelism) asked for at a random moment
    while the job runs (``add_worker``: a new worker joins the cluster a second before, and takes the new
    instance). ``migrate``: a task one of whose instances (drawn) moves to another worker (drawn) at a random
    moment. ``shed``: (ratio, seconds) the sources shed, as the
    leader's shed policy sets it, from a random moment on (with a QoS that
    recovers, every shed record is replayed). ``per_read`` and ``every`` pace
    the sources.
    """

    name: str
    build: Callable[[], sl.Topology]
    inputs: dict[str, list[Any]]
    checkpoint_interval: float | None = 0.5
    rescale: tuple[str, int] | None = None
    add_worker: bool = False  # a new worker joins the cluster a second before the rescale
    migrate: str | None = None  # a task one of whose instances moves to another worker at a random moment
    shed: tuple[float, float] | None = None  # (ratio, seconds): the sources shed that much for that long
    per_read: int = 50
    every: float = 0.05
    notes: dict[str, Any] = field(default_factory=dict)


def _keyed(records: int) -> list[sl.Record]:
    return [sl.Record(f"k{n % 20}", 1, n * 0.001) for n in range(records)]


def _numbers(records: int) -> list[sl.Record]:
    return [sl.Record(str(n), n % 1000 + 1, n * 0.001) for n in range(records)]


def counts_topology() -> sl.Topology:
    """Keyed running counts: every record's count leaves, into an exactly-once sink."""
    topology = sl.Topology("counts")
    words = topology.add_source("words", [])
    counts = topology.reduce("count", lambda a, b: a + b, emit="record", parallelism=2)
    counts.set_input(words, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    return topology


def recovering_counts_topology() -> sl.Topology:
    """The keyed running counts under a QoS whose shed records are held and replayed (``recover``)."""
    topology = counts_topology()
    topology.name = "recovering"
    return topology.set_qos(sl.QoS(max_latency=5.0, max_shed_ratio=0.5, recover=True, preserve_order=True))


def windows_topology() -> sl.Topology:
    """Event-time tumbling windows of one second, a sum per key and window."""
    topology = sl.Topology("windows")
    events = topology.add_source("events", [], watermarks=sl.Watermarks(out_of_orderness=0.05))
    sums = topology.window_reduce("sums", "sum", window=sl.TimeWindow(1.0, time="event"), parallelism=2)
    sums.set_input(events, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    return topology


class _Halve(sl.Task):
    """Halve each value round the loop until it is 1; then leave with the rounds it took."""

    def declare_ports(self, ports: Any) -> None:
        ports.set_outputs(2)

    def execute(self, inputs: Any, outputs: Any) -> None:
        for record in inputs.get():
            if record.value <= 1:
                outputs.emit(record.key, record.iteration, port=1, ts=record.ts)
            else:
                outputs.emit(record.key, record.value // 2, port=0, ts=record.ts)


def loop_topology() -> sl.Topology:
    """Numbers halved round a loop; each leaves with the number of rounds it took."""
    topology = sl.Topology("halving")
    numbers = topology.add_source("numbers", [])
    halve = topology.add_task("halve", _Halve, parallelism=2)
    halve.set_input(numbers).set_input(halve, out_port=0, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(halve, out_port=1)
    topology.set_max_iterations(20)
    return topology


class _CountSkippingPoison(sl.Task):
    """Counts each key's records in keyed state and emits the running count; a poison value (every 97th)
    fails the call after its state write, and the ``skip`` policy drops that record: its write must go."""

    def execute(self, inputs: Any, outputs: Any) -> None:
        for record in inputs.get():
            count = self.state.get(record.key, 0) + 1
            self.state.put(record.key, count)
            if record.value % POISON_EVERY == 0:
                raise ValueError(f"poison value {record.value}")
            outputs.emit(record.key, count, ts=record.ts)


def poison_topology() -> sl.Topology:
    """Keyed counts whose task skips poison records (``on_error="skip"``): each skipped record counts zero."""
    topology = sl.Topology("poison")
    words = topology.add_source("words", [])
    counts = topology.add_task("count", _CountSkippingPoison, parallelism=2, on_error="skip")
    counts.set_input(words, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    return topology


def _valued(records: int) -> list[sl.Record]:
    return [sl.Record(f"k{n % 20}", n, n * 0.001) for n in range(records)]


WORKLOADS: dict[str, Workload] = {
    "counts": Workload("counts", counts_topology, {"words": _keyed(RECORDS)}),
    "windows": Workload("windows", windows_topology, {"events": _keyed(RECORDS)}),
    "loop": Workload("loop", loop_topology, {"numbers": _numbers(RECORDS)}, checkpoint_interval=None),
    "rescale": Workload("rescale", counts_topology, {"words": _keyed(RECORDS)}, rescale=("count", 3)),
    "grow": Workload("grow", counts_topology, {"words": _keyed(RECORDS)}, rescale=("count", 3), add_worker=True),
    "migrate": Workload("migrate", counts_topology, {"words": _keyed(RECORDS)}, migrate="count"),
    "poison": Workload("poison", poison_topology, {"words": _valued(RECORDS)}),
    "shedding": Workload("shedding", recovering_counts_topology, {"words": _keyed(RECORDS)}, shed=(0.5, 3.0)),
}
