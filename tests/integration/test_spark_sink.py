"""SparkSink against a real local Spark: what lands in Parquet (read back through Spark) is exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from tests.support import spark_job
from tests.support.spark_job import events, expected_counts, expected_sums

pytestmark = pytest.mark.integration


def read_rows(spark: Any, path: Path, *columns: str) -> list[tuple[Any, ...]]:
    """``columns`` of every row under ``path``, read back through Spark, sorted."""
    return sorted(tuple(row) for row in spark.read.parquet(str(path)).select(*columns).collect())


WINDOWED = ("key", "value", "window_start", "window_end")


def test_window_sums_and_counts_read_back_exactly(spark: Any, tmp_path: Path) -> None:
    """Without checkpoints: keyed 5 s event-time sums and counts land once, as epoch 0, equal to a hand computation."""
    records = events(1000)
    for how, expected in (("sum", expected_sums(records)), ("count", expected_counts(records))):
        output = tmp_path / how
        sl.run(spark_job.build(sl.SparkSink(output), records, how=how))
        assert read_rows(spark, output, *WINDOWED) == expected
        assert read_rows(spark, output, "epoch", "instance") == [(0, 0)] * len(expected)


def test_columns_and_their_types(spark: Any, tmp_path: Path) -> None:
    """A window_reduce sink writes key, value, ts, window_start, window_end; epoch and instance are partitions."""
    sl.run(spark_job.build(sl.SparkSink(tmp_path), events(100)))
    schema = [(field.name, field.dataType.simpleString()) for field in spark.read.parquet(str(tmp_path)).schema]
    assert schema == [
        ("key", "string"), ("value", "bigint"), ("ts", "double"), ("window_start", "double"),
        ("window_end", "double"), ("epoch", "int"), ("instance", "int"),
    ]  # fmt: skip


class Stats(sl.Task):
    """Per window and sensor: a dict of count and max."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        stats: dict[str, dict[str, int]] = {}
        for record in inputs.get():
            entry = stats.setdefault(record.key, {"count": 0, "max": record.value})
            entry["count"] += 1
            entry["max"] = max(entry["max"], record.value)
        outputs.emit_all(stats.items())


def test_dict_values_become_columns(spark: Any, tmp_path: Path) -> None:
    """A windowed task emitting dicts: one column per field, with the window's bounds."""
    records = events(500)
    topology = sl.Topology("stats")
    source = topology.add_source("events", records, watermarks=sl.Watermarks(out_of_orderness=0.1))
    stats = topology.add_task("stats", Stats, window=sl.TimeWindow(5.0, time="event"))
    topology.add_sink("to-spark", sl.SparkSink(tmp_path)).set_input(stats.set_input(source))
    sl.run(topology)

    expected: dict[tuple[str, float, float], list[int]] = {}
    for record in records:
        expected.setdefault((record.key, *spark_job.window_of(record.ts)), []).append(record.value)
    rows = read_rows(spark, tmp_path, "key", "count", "max", "window_start", "window_end")
    assert rows == sorted((key, len(v), max(v), start, end) for (key, start, end), v in expected.items())
    assert "value" not in spark.read.parquet(str(tmp_path)).columns


def test_fn_gets_one_dataframe_per_epoch(spark: Any, tmp_path: Path) -> None:
    """fn(dataframe, epoch) like foreachBatch: with checkpoints, every window result reaches fn exactly once."""
    seen: list[tuple[int, list[str], list[tuple[Any, ...]]]] = []

    def collect(frame: Any, epoch: int) -> None:
        seen.append((epoch, frame.columns, [tuple(row) for row in frame.select(*WINDOWED, "epoch").collect()]))

    records = events(1500)
    sink = sl.SparkSink(fn=collect, staging_dir=tmp_path / "staging")
    sl.run(spark_job.build(sink, records), checkpoint_dir=tmp_path / "ckpt", checkpoint_interval=0.05, batch_size=10)

    assert len(seen) >= 2
    assert [epoch for epoch, _, _ in seen] == sorted({epoch for epoch, _, _ in seen})  # ascending, none twice
    assert all(columns == ["key", "value", "ts", "epoch", "window_start", "window_end"] for _, columns, _ in seen)
    assert all(row[-1] == epoch for epoch, _, rows in seen for row in rows)
    assert sorted(row[:-1] for _, _, rows in seen for row in rows) == expected_sums(records)


def test_table_is_written_and_replaced_per_epoch(spark: Any, tmp_path: Path) -> None:
    """table=: rows land in a catalog table partitioned by epoch and instance; a rerun of epoch 0 replaces it."""
    records = events(500)
    name = "streamlet_sums"
    spark.sql(f"DROP TABLE IF EXISTS {name}")
    try:
        for _ in range(2):
            sink = sl.SparkSink(table=name, staging_dir=tmp_path / "staging")
            sl.run(spark_job.build(sink, records))
        rows = sorted(tuple(row) for row in spark.table(name).select(*WINDOWED, "epoch", "instance").collect())
        assert rows == [(*row, 0, 0) for row in expected_sums(records)]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_session_given_is_used(spark: Any, tmp_path: Path) -> None:
    """session= hands batches to that session (here the fixture's)."""
    used: list[Any] = []
    sink = sl.SparkSink(fn=lambda frame, epoch: used.append(frame.sparkSession), session=spark)
    sl.run(spark_job.build(sink, events(50)))
    assert used == [spark]


def test_parallel_sink_instances_write_their_own_partitions(spark: Any, tmp_path: Path) -> None:
    """Two sink instances with checkpoints: each writes epoch=N/instance=I; together every result exactly once."""
    records = events(1500)
    output = tmp_path / "out"
    topology = spark_job.build(sl.SparkSink(output), records, sinks=2)
    sl.run(topology, checkpoint_dir=tmp_path / "ckpt", checkpoint_interval=0.05, batch_size=10)
    assert read_rows(spark, output, *WINDOWED) == expected_sums(records)
    assert {row[0] for row in read_rows(spark, output, "instance")} == {0, 1}
