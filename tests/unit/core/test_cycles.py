"""Cycles: found by DFS, allowed with an iteration limit, ended when quiet, excess dropped and counted."""

from __future__ import annotations

from collections.abc import Sequence

import streamlet as sl
from streamlet.core.model.record import CYCLE_END
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.cycles import CycleTracker, LoopCounters
from tests.conftest import pairs


class Halve(sl.Task):
    """Port 0: numbers still to halve go round the loop; port 1: finished numbers leave it."""

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_outputs(2)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            if record.value <= 1:
                outputs.emit(record.key, record.iteration, port=1)
            else:
                outputs.emit(record.key, record.value // 2, port=0)


def halving_loop(numbers: list[int], limit: int, parallelism: int = 1) -> sl.Topology:
    """numbers -> halve <-> (back edge) ; halve port 1 -> done."""
    topology = sl.Topology("halving")
    source = topology.add_source("numbers", [(str(n), n) for n in numbers])
    halve = topology.add_task("halve", Halve, parallelism=parallelism)
    halve.set_input(source).set_input(halve, out_port=0, partitioning=sl.SAME_KEY)
    topology.add_sink("done", sl.CollectSink()).set_input(halve, out_port=1)
    topology.set_max_iterations(limit)
    return topology


def test_loop_runs_until_quiet_and_counts_iterations() -> None:
    """Each number goes round log2(n) times; the job ends by itself."""
    result = sl.run(halving_loop([1, 2, 8, 1024], limit=20))
    assert sorted(pairs(result.sink("done"))) == [("1", 0), ("1024", 10), ("2", 1), ("8", 3)]
    assert result.statistics.dropped == 0


def test_records_past_the_limit_are_dropped_and_counted() -> None:
    """With limit 3 only numbers needing at most 3 rounds finish; the rest are counted as dropped."""
    result = sl.run(halving_loop([1, 2, 8, 16, 1024], limit=3))
    assert sorted(pairs(result.sink("done"))) == [("1", 0), ("2", 1), ("8", 3)]
    assert result.statistics.dropped == 2


def test_parallel_loop_with_small_batches_ends() -> None:
    """Many records in a parallel loop, tiny batches and channels: no deadlock, exact result."""
    numbers = list(range(1, 3001))
    result = sl.run(halving_loop(numbers, limit=12, parallelism=3), batch_size=8, channel_capacity=1)
    expected = sorted((str(n), n.bit_length() - 1) for n in numbers)
    assert sorted(pairs(result.sink("done"))) == expected


class Relay(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit(record.key, record.value + 1)


def test_two_node_loop_with_per_loop_limit() -> None:
    """A -> B -> A with set_max_iterations(at=A): every record goes round exactly that many times."""
    topology = sl.Topology("ring")
    source = topology.add_source("in", [("x", 0), ("y", 100)])
    first = topology.add_task("a", Relay)
    second = topology.add_task("b", Relay).set_input(first)
    first.set_input(source).set_input(second)
    tap = topology.add_sink("tap", sl.CollectSink()).set_input(second)
    topology.set_max_iterations(4, at=first)
    assert topology.back_edges() == {("b", "a")}
    result = sl.run(topology)
    assert sorted(pairs(result.sink("tap"))) == [
        ("x", 2), ("x", 4), ("x", 6), ("x", 8), ("x", 10),
        ("y", 102), ("y", 104), ("y", 106), ("y", 108), ("y", 110),
    ]  # fmt: skip
    assert result.statistics.dropped == 2
    assert tap.name == "tap"


def test_records_leaving_a_loop_are_plain_records() -> None:
    """Outside the loop records no longer carry a loop count."""
    result = sl.run(halving_loop([8], limit=5))
    [record] = result.sink("done")
    assert type(record) is sl.Record
    assert record.iteration == 0


class NeverQuiet:
    """A quiescence that decides nothing (the tests close trackers themselves)."""

    async def run(self, trackers: Sequence[CycleTracker]) -> None:
        """Never closes anything."""


def test_a_tracker_given_a_quiescence_leaves_the_decision_to_it() -> None:
    """Nothing in flight and no outside sender: alone a tracker would close; with a quiescence only close() does."""
    tracker = CycleTracker({"halve"}, NeverQuiet())
    inbox = Inbox(2)
    channel = inbox.add_channel(0)
    tracker.add_in_loop_channel(inbox, channel)
    tracker.check()
    assert (tracker.closed, inbox.depth()) == (False, 0)
    tracker.close()
    assert (tracker.closed, inbox.head(channel)) == (True, CYCLE_END)


def test_tracker_counters_are_this_process_share_of_the_loop() -> None:
    """Batches sent into the loop, batches its members here finished, outside senders still open, input waiting."""
    tracker = CycleTracker({"halve", "relay"}, NeverQuiet())
    inbox = Inbox(2)
    channel = inbox.add_channel(0)
    tracker.add_in_loop_channel(inbox, channel)
    tracker.external_open = 1
    tracker.flow.pending += 3  # what routes into the loop count as they send
    tracker.batches_done(2)
    inbox.put_nowait(channel, [sl.Record("k", 1)])
    assert (tracker.name, tracker.counters()) == ("halve", LoopCounters(sent=3, received=2, external_open=1, busy=True))
