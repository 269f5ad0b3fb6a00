"""SparkSink on the columnar path: Arrow batches become the same rows as their elements, with no step per row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import streamlet as sl
from streamlet.connectors.spark_rows import columns_to_arrow, to_arrow
from streamlet.core.model.columns import ColumnBatch
from tests.unit.connectors.test_spark import Recording, open_writer


def sensor_batch(value: str | None = "celsius") -> ColumnBatch:
    data = pa.record_batch({"sensor": ["s1", "s2"], "celsius": [20.5, 31.0], "hum": [40, 55], "at": [1, 2]})
    return ColumnBatch(data, key="sensor", value=value, ts="at")


@pytest.mark.parametrize("value", ["celsius", None])
def test_columns_make_the_rows_their_elements_make(value: str | None) -> None:
    """A columnar batch's rows equal those made from its elements (value=None: one column per other field)."""
    batch = sensor_batch(value)
    assert columns_to_arrow(batch, "sink").to_pydict() == to_arrow(batch.elements(), "sink").to_pydict()


def test_columns_named_like_row_columns_are_refused() -> None:
    """Without a value column, a column called 'epoch' would shadow a row column: the sink is named."""
    batch = ColumnBatch(pa.record_batch({"k": ["a"], "epoch": [1]}), key="k")
    with pytest.raises(
        sl.ConnectorError, match=r"^sink 'out' instance 0: columns named like row columns: \['epoch'\]$"
    ):
        columns_to_arrow(batch, "sink 'out' instance 0")


async def test_columns_and_elements_of_one_epoch_go_to_spark_together(tmp_path: Path) -> None:
    """Rows written as columns and as elements, spilled past max_rows, reach Spark as one epoch."""
    sink = Recording(tmp_path, max_rows=3)
    writer = open_writer(sink)
    await writer.write_columns(sensor_batch())
    await writer.write([("s3", 7.5, 3.0)])  # three rows held: spilled as one chunk
    await writer.write_columns(sensor_batch())
    await writer.close()
    assert sink.handed == [
        (0, 0, {
            "key": ["s1", "s2", "s3", "s1", "s2"], "value": [20.5, 31.0, 7.5, 20.5, 31.0],
            "ts": [1.0, 2.0, 3.0, 1.0, 2.0], "epoch": [0] * 5,
        })
    ]  # fmt: skip


def test_an_aggregate_reaches_spark_as_arrow_without_elements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ColumnarSource -> aggregate -> SparkSink: the batches are never turned into elements on the way."""
    sink = Recording(tmp_path)

    def no_elements(self: ColumnBatch) -> Any:
        raise AssertionError("a columnar batch was turned into elements")

    monkeypatch.setattr(ColumnBatch, "elements", no_elements)
    topology = sl.Topology("to-spark")
    readings = pa.table({"sensor": ["s1", "s2", "s1"], "celsius": [20, 31, 24]})
    rows = topology.add_source("in", sl.ColumnarSource(readings, key="sensor", value="celsius"))
    sums = topology.aggregate("sum", "sum", emit="end", parallelism=2).set_input(rows, partitioning=sl.SAME_KEY)
    topology.add_sink("spark", sink).set_input(sums)
    sl.run(topology)
    handed = sorted(
        (key, value) for _, _, rows_ in sink.handed for key, value in zip(rows_["key"], rows_["value"], strict=True)
    )
    assert handed == [("s1", 44), ("s2", 31)]


def test_window_columns_make_the_rows_their_window_records_make() -> None:
    """A columnar window's results (with window bound columns) give the rows their window records give."""
    data = pa.record_batch({
        "key": ["a", "b"], "value": [2, 1], "ts": [9.999, 9.999], "window_start": [0, 0], "window_end": [10, 10],
    })  # fmt: skip
    batch = ColumnBatch(data, "key", "value", "ts", window_start="window_start", window_end="window_end")
    rows = columns_to_arrow(batch, "sink")
    assert rows.to_pydict() == to_arrow(batch.elements(), "sink").to_pydict()
    assert rows.schema.names == ["key", "value", "ts", "window_start", "window_end"]


def test_a_windowed_aggregate_reaches_spark_as_arrow_with_its_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ColumnarSource -> aggregate on a window -> SparkSink: fired windows reach Spark as Arrow, bounds and all."""
    sink = Recording(tmp_path)

    def no_elements(self: ColumnBatch) -> Any:
        raise AssertionError("a columnar batch was turned into elements")

    monkeypatch.setattr(ColumnBatch, "elements", no_elements)
    topology = sl.Topology("windows-to-spark")
    readings = pa.table({"sensor": ["s1", "s2", "s1", "s1"], "celsius": [20, 31, 24, 5], "at": [1, 2, 3, 12]})
    rows = topology.add_source("in", sl.ColumnarSource(readings, key="sensor", value="celsius", ts="at"))
    sums = topology.aggregate("sum", "sum", window=sl.TimeWindow(10, time="event")).set_input(rows)
    topology.add_sink("spark", sink).set_input(sums)
    sl.run(topology)
    [(_, _, handed)] = sink.handed
    assert handed == {
        "key": ["s1", "s2", "s1"], "value": [44, 31, 5], "ts": [9.999, 9.999, 19.999], "epoch": [0, 0, 0],
        "window_start": [0.0, 0.0, 10.0], "window_end": [10.0, 10.0, 20.0],
    }  # fmt: skip
