"""Testing topologies in-process: a manual clock and one-line runners.

Example:
    >>> import streamlet as sl
    >>> from streamlet.testing import run_topology
    >>> t = sl.Topology("double")
    >>> numbers = t.add_source("numbers", sl.QueueSource())
    >>> twice = t.map("twice", lambda r: (r.key, r.value * 2)).set_input(numbers)
    >>> _ = t.add_sink("out", lambda r: None).set_input(twice)
    >>> [r.value for r in run_topology(t, inputs={"numbers": [("a", 1), ("b", 2)]})["out"]]
    [2, 4]

Under pytest, the ``manual_clock`` fixture (registered by streamlet's pytest
plugin) gives each test a fresh :class:`ManualClock` starting at 0. A test of
a running job (``sl.start``) waits with ``await job.settle()`` until every
record sent so far has been processed, then advances the clock: no sleeps.

:class:`SimulatedCluster` runs a job on a whole cluster in this process (a
leader, workers talking TCP on loopback, one in-memory store) and kills
workers where a test says (:class:`KillAt`, ``kill_worker``); the
:class:`JobOutcome` says how the job recovered and what each sink got, and
:class:`ExactlyOnceSink` keeps exactly what the checkpoints committed. See
``streamlet.backends.cluster.simulated.cluster``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from streamlet.backends.cluster.simulated.cluster import (
    Attempt,
    ExactlyOnceSink,
    JobOutcome,
    Kill,
    KillAt,
    SimulatedCluster,
    SimulatedJob,
)
from streamlet.backends.local import run, start
from streamlet.core.model.clock import Clock
from streamlet.core.model.record import Record
from streamlet.core.model.sinks import CollectSink, Sink
from streamlet.core.model.sources import IterableSource, Source
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.clock import ManualClock
from streamlet.core.runtime.job import JobResult
from streamlet.errors import TopologyError

__all__ = (
    "Attempt",
    "ExactlyOnceSink",
    "JobOutcome",
    "Kill",
    "KillAt",
    "ManualClock",
    "SimulatedCluster",
    "SimulatedJob",
    "arun_topology",
    "replaced_io",
    "run_topology",
    "with_test_io",
)


def with_test_io(topology: Topology, inputs: dict[str, Iterable[Any]]) -> Topology:
    """A copy of ``topology`` whose named sources read ``inputs`` and whose sinks all collect."""
    sources: dict[str, Source] = {name: IterableSource(list(items)) for name, items in inputs.items()}
    return replaced_io(topology, sources, CollectSink)


def replaced_io(topology: Topology, sources: dict[str, Source], sink: Callable[[], Sink]) -> Topology:
    """A copy of ``topology`` whose named sources are ``sources`` and whose every sink is a new ``sink()``."""
    unknown = sorted(set(sources) - {n.name for n in topology.nodes.values() if n.kind == "source"})
    if unknown:
        raise TopologyError(f"topology '{topology.name}' has no source called {unknown[0]!r}")
    test_copy = copy.copy(topology)
    test_copy.nodes = {}
    for name, node in topology.nodes.items():
        if node.kind == "source" and name in sources:
            node = dataclasses.replace(node, source=sources[name])
        elif node.kind == "sink":
            node = dataclasses.replace(node, sink=sink())
        test_copy.nodes[name] = node
    test_copy.edges = list(topology.edges)
    return test_copy


def _collected(topology: Topology, result: JobResult) -> dict[str, list[Record]]:
    return {name: result.sink(name) for name, node in topology.nodes.items() if node.kind == "sink"}


def run_topology(
    topology: Topology, inputs: dict[str, Iterable[Any]] | None = None, clock: Clock | None = None, **options: Any
) -> dict[str, list[Record]]:
    """Run ``topology`` with ``inputs`` replacing the named sources; return every sink's records.

    Items are ``Record``s, ``(key, value)`` pairs or plain values. The run is
    deterministic for the same input (one event loop, no real timers when a
    :class:`ManualClock` is given). Call it from synchronous tests; in async
    tests use :func:`arun_topology`.
    """
    test_copy = with_test_io(topology, inputs or {})
    return _collected(test_copy, run(test_copy, clock=clock, **options))


async def arun_topology(
    topology: Topology, inputs: dict[str, Iterable[Any]] | None = None, clock: Clock | None = None, **options: Any
) -> dict[str, list[Record]]:
    """:func:`run_topology` inside a running event loop."""
    test_copy = with_test_io(topology, inputs or {})
    async with start(test_copy, clock=clock, **options) as job:
        result = await job.wait()
    return _collected(test_copy, result)
