"""Input modes: sync runs when every open port has data; async when any port has."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import streamlet as sl

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


class Recorder(sl.Task):
    """Logs, per wake-up, the size of each port's batch (and the waking port)."""

    calls: ClassVar[list[Any]] = []
    sync = True

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_inputs(2)
        ports.sync_inputs(self.sync)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        type(self).calls.append((inputs.port, len(inputs.get(0)), len(inputs.get(1))))
        for record in inputs.get():
            outputs.emit(record.key, record.value)


class AsyncRecorder(Recorder):
    calls: ClassVar[list[Any]] = []
    sync = False


def two_port_job(task: type[Recorder], left: int, right: int) -> sl.JobResult:
    topology = sl.Topology("two-ports")
    first = topology.add_source("left", [("l", i) for i in range(left)])
    second = topology.add_source("right", [("r", i) for i in range(right)])
    node = topology.add_task("join", task).set_input(first, in_port=0).set_input(second, in_port=1)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    return sl.run(topology, batch_size=2)


def test_sync_mode_waits_for_every_port_then_continues_alone_after_one_ends() -> None:
    """Both ports' first batches arrive together; once 'right' ends, 'left' continues alone with get(1) == []."""
    Recorder.calls = []
    result = two_port_job(Recorder, left=6, right=2)
    assert Recorder.calls == [(None, 2, 2), (None, 2, 0), (None, 2, 0)]
    assert [(r.key, r.value) for r in result.sink("out")] == [
        ("l", 0), ("l", 1), ("r", 0), ("r", 1), ("l", 2), ("l", 3), ("l", 4), ("l", 5),
    ]  # fmt: skip


def test_sync_mode_with_an_empty_port_runs_on_the_other() -> None:
    """A port that ends without data does not block the other."""
    Recorder.calls = []
    two_port_job(Recorder, left=3, right=0)
    assert Recorder.calls == [(None, 2, 0), (None, 1, 0)]


def test_async_mode_wakes_per_port_batch() -> None:
    """In async mode each wake-up carries one port's batch, and inputs.port says which."""
    AsyncRecorder.calls = []
    result = two_port_job(AsyncRecorder, left=4, right=2)
    assert sorted(AsyncRecorder.calls) == [(0, 2, 0), (0, 2, 0), (1, 0, 2)]
    assert sorted((r.key, r.value) for r in result.sink("out")) == [
        ("l", 0), ("l", 1), ("l", 2), ("l", 3), ("r", 0), ("r", 1),
    ]  # fmt: skip


def test_merge_ports_example_matches_every_order() -> None:
    """The sync-mode example pairs orders and payments and broadcasts to both sinks."""
    from examples.merge_ports import build_topology

    result = sl.run(build_topology())
    expected = [("o1", "paid"), ("o2", "paid"), ("o3", "paid"), ("o4", "mismatch")]
    for sink in ("ledger", "audit"):
        assert sorted((r.key, r.value) for r in result.sink(sink)) == expected
