"""The columnar path across worker processes: Arrow batches cross as ARROW frames, results as in one process."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import streamlet as sl
from tests.unit.backends.processes.test_run import Totals, outcome

pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


def columnar_chain() -> sl.Topology:
    """ColumnarSource (2 instances) -> where (2) -> aggregate sum per key (3, SAME_KEY) -> a sink and a user Task."""
    rows = 4000
    table = pa.table({
        "sensor": [f"s{(i * 7) % 13}" for i in range(rows)], "celsius": [i % 41 - 10 for i in range(rows)],
        "at": [float(i) for i in range(rows)],
    })  # fmt: skip
    topology = sl.Topology("columnar")
    readings = sl.ColumnarSource(table.to_batches(max_chunksize=500), key="sensor", value="celsius", ts="at")
    source = topology.add_source("readings", readings, parallelism=2)
    warm = topology.where("warm", pc.field("celsius") > 0, parallelism=2).set_input(source)
    sums = topology.aggregate("sum", "sum", emit="end", parallelism=3).set_input(warm, partitioning=sl.SAME_KEY)
    topology.add_sink("sums", sl.CollectSink()).set_input(sums)
    totals = topology.add_task("totals", Totals).set_input(warm)
    topology.add_sink("per-sensor", sl.CollectSink()).set_input(totals)
    return topology


def test_a_columnar_chain_gives_the_same_result_in_two_and_three_processes() -> None:
    """Every sink's rows and every node's counters match one process when Arrow batches cross processes."""
    alone = sl.run(columnar_chain())
    assert len(alone.sink("sums")) == 13
    for processes in (2, 3):
        assert outcome(sl.run(columnar_chain(), processes=processes)) == outcome(alone)
