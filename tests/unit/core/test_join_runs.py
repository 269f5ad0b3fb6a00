"""Joins run like any node: with processes=2, across a checkpoint and restore, across a live rescale, on a
simulated 2-worker cluster, and with state bounded by the watermark. Each run is compared with a brute-force
reference (``tests/support/join_jobs.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.testing import SimulatedCluster
from tests.support import join_jobs as jj

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

CASES = [("interval", "outer"), ("asof", "left"), ("window", "outer")]
COUNTS = {"interval": 2000, "asof": 2000, "window": 600}


class Crash(Exception):
    """Stops a job the hard way."""


@pytest.mark.parametrize(("kind", "how"), [*CASES, ("interval", "inner"), ("window", "inner")])
def test_in_process_results_equal_the_reference(kind: str, how: str) -> None:
    result = sl.run(jj.BUILDERS[kind](how))
    assert jj.outcome(result.sink("out")) == jj.EXPECTED[kind](how)
    assert result.statistics.late == 0


@pytest.mark.in_memory_state_only(
    "processes=2 forks this process, which has run RocksDB: refused (tests/unit/core/test_rocksdb_state.py)"
)
@pytest.mark.parametrize(("kind", "how"), CASES)
def test_with_two_processes_results_equal_the_reference(kind: str, how: str) -> None:
    result = sl.run(jj.BUILDERS[kind](how), processes=2)
    assert jj.outcome(result.sink("out")) == jj.EXPECTED[kind](how)


def test_table_join_with_two_processes_gives_each_left_record_once() -> None:
    jj.check_table(sl.run(jj.table_topology(), processes=2).sink("out"))


async def first_half_then_crash(kind: str, how: str, checkpoints: Path, kept: list[sl.Record]) -> None:
    async with sl.start(jj.queue_topology(kind, how), checkpoint_dir=checkpoints) as job:
        await jj.feed(job, kind, COUNTS[kind], 0.0, 0.5)
        await job.settle()
        await job.checkpoint()
        kept.extend(job._result().sink("out"))
        raise Crash


@pytest.mark.parametrize(("kind", "how"), CASES)
async def test_a_restore_from_a_checkpoint_goes_on_exactly(kind: str, how: str, tmp_path: Path) -> None:
    """Half the records, a checkpoint (held records and timers in it), a crash; the restored job gets the other
    half: its CollectSink, which gets back what it had collected at the checkpoint, holds the reference, once."""
    kept: list[sl.Record] = []
    with pytest.raises(Crash):
        await first_half_then_crash(kind, how, tmp_path, kept)
    assert 0 < len(kept) < len(jj.EXPECTED[kind](how))
    async with sl.start(jj.queue_topology(kind, how), checkpoint_dir=tmp_path) as job:
        await jj.feed(job, kind, COUNTS[kind], 0.5, 1.0)
        for side in ("left", "right"):
            await job.close_source(side)
        result = await job.wait()
    assert jj.outcome(result.sink("out")) == jj.EXPECTED[kind](how)
    assert jj.outcome(result.sink("out")[: len(kept)]) == jj.outcome(kept)  # given back first, as collected


@pytest.mark.parametrize(("kind", "how"), CASES)
async def test_a_live_rescale_keeps_the_results_exact(kind: str, how: str) -> None:
    """2 -> 3 instances a third of the way in, 3 -> 1 at two thirds: held records and timers move with their keys."""
    async with sl.start(jj.queue_topology(kind, how)) as job:
        await jj.feed(job, kind, COUNTS[kind], 0.0, 1 / 3)
        await job.rescale("join", 3)
        await jj.feed(job, kind, COUNTS[kind], 1 / 3, 2 / 3)
        await job.rescale("join", 1)
        await jj.feed(job, kind, COUNTS[kind], 2 / 3, 1.0)
        for side in ("left", "right"):
            await job.close_source(side)
        result = await job.wait()
    assert job.reconfigurations == 2
    assert jj.outcome(result.sink("out")) == jj.EXPECTED[kind](how)


def as_tuples(records: list[sl.Record]) -> list[sl.Record]:
    """The simulated cluster hands collected values back as JSON would (lists): the pairs as tuples again."""
    return [sl.Record(r.key, tuple(r.value), r.ts) for r in records]


async def test_on_a_two_worker_cluster_every_join_gives_the_reference() -> None:
    async with SimulatedCluster(workers=2, checkpoint_interval=None) as cluster:
        for kind, how in CASES:
            outcome = await cluster.run(jj.BUILDERS[kind](how), job=f"join-{kind}")
            assert outcome.state == "FINISHED", outcome.reason
            assert sorted(outcome.ran_on) == ["join.0", "join.1", "left.0", "out.0", "right.0"]
            assert jj.outcome(as_tuples(outcome.collected["out"])) == jj.EXPECTED[kind](how)
        outcome = await cluster.run(jj.table_topology(), job="join-table")
        jj.check_table(as_tuples(outcome.collected["out"]))


class Split(sl.Task):
    """Even positions to LEFT, odd ones to RIGHT, each keyed by its pair's number (so records 2m and 2m+1 meet)."""

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_outputs(2)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for _key, value, ts in inputs.elements():
            outputs.emit(f"u{value // 2 % 1000}", value, port=value % 2, ts=ts)


def million() -> Any:
    return (sl.Record("all", i, i * 0.001) for i in range(1_000_000))


def expected_pairs(count: int = 1_000_000) -> int:
    """Left 2m meets right 2n+1 of the same key (n = m mod 1000) within 5 s: n - m in {-2000, ..., 2000}."""
    pairs = 0
    for m in range(count // 2):
        for n in (m - 2000, m - 1000, m, m + 1000, m + 2000):
            if 0 <= n < count // 2 and abs((2 * n + 1) - 2 * m) <= 5000:
                pairs += 1
    return pairs


@pytest.mark.in_memory_state_only("a long stream, its length the point; RocksDB joins: tests/spec")
@pytest.mark.timeout(120)
def test_an_interval_join_holds_what_its_interval_needs_not_the_stream() -> None:
    """1 M records 1 ms apart over 1 000 keys through a 10 s interval: never more than 25 000 held at once."""
    topology = sl.Topology("bounded")
    split = topology.add_task("split", Split).set_input(topology.add_source("in", million()))
    join = topology.interval_join("join", -5.0, 5.0, fn=lambda key, left, right: None)
    join.set_input(split, out_port=0, in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(split, out_port=1, in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    counted = topology.add_task("count", Counted).set_input(join)
    topology.add_sink("out", sl.CollectSink()).set_input(counted)
    result = sl.run(topology)
    stats = result.statistics.nodes["join"]
    assert [r.value for r in result.sink("out")] == [expected_pairs()]
    assert 0 < stats.held_peak <= 25_000
    assert stats.held == 0


class Counted(sl.Task):
    """How many records came: one number at the end."""

    def prepare(self, config: dict[str, Any]) -> None:
        self.seen = 0

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        self.seen += len(inputs.elements())

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit("pairs", self.seen)


def test_columnar_sources_feed_a_join_as_records() -> None:
    """Arrow batches on both inputs are turned into records at the join's edge: trades meet their prices."""
    import pyarrow as pa

    trades = pa.table({"sym": ["A", "A", "B"], "qty": [1, 2, 3], "ts": [1.0, 5.0, 2.0]})
    prices = pa.table({"sym": ["A", "A", "B"], "px": [10.0, 11.0, 7.5], "ts": [0.0, 4.0, 2.5]})
    topology = sl.Topology("columnar-asof")
    join = topology.asof_join("j", how="left")
    for name, table, port, value in (("trades", trades, sl.LEFT, "qty"), ("prices", prices, sl.RIGHT, "px")):
        source = topology.add_source(name, sl.ColumnarSource(table, key="sym", value=value, ts="ts"))
        join.set_input(source, in_port=port, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    result = sl.run(topology)
    assert sorted(jj.outcome(result.sink("out"))) == [
        ("A", (1, 10.0), 1.0),
        ("A", (2, 11.0), 5.0),
        ("B", (3, None), 2.0),
    ]
