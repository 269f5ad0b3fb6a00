"""Aggregate records handed to Spark: through Arrow (what SparkSink does) against Python tuples.

200 k window aggregates (``WindowRecord``: 10 k keys, float values, window
bounds) become a DataFrame that Spark then materializes in full (the
``noop`` data source: every row is produced, nothing is written), timed
from the list of records to the end of that Spark job:

- **arrow**: ``SparkSink``'s own conversion (one ``pyarrow.Table``, columns
  built in one pass each), then ``spark.createDataFrame(table)``;
- **tuples** (the baseline): a list of tuples and an explicit ``StructType``
  schema, ``spark.createDataFrame(rows, schema)``, the careful way without Arrow;
- **pandas** (reported too): the same Arrow table as a pandas DataFrame with
  ``spark.sql.execution.arrow.pyspark.enabled``, the pre-4.0 Arrow route.

One local Spark session (started before timing); runs alternate their order.
On this machine Arrow and pandas come out level (0.86-1.09 over three runs)
and both about twice the tuples; SparkSink keeps the direct Arrow table,
which keeps nulls and integer columns as they are.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import streamlet as sl
from benchmarks.common import alternating, median_rate, report
from streamlet.connectors.spark_rows import to_arrow, with_epoch
from streamlet.connectors.spark_session import spark_session

EPOCH = 1


def make_records(count: int, keys: int = 10_000, seed: int = 5) -> list[sl.Record]:
    """Window sums as a windowed task emits them: key, float value, ts = window end, the window's bounds."""
    rng = random.Random(seed)
    records: list[sl.Record] = []
    for index in range(count):
        start = float(index // keys * 60)
        records.append(sl.WindowRecord(f"key{index % keys}", rng.random() * 100, start + 60, (start, start + 60)))
    return records


def materialize(frame: Any) -> None:
    """Run a Spark job that produces every row of ``frame`` and writes nothing."""
    frame.write.format("noop").mode("overwrite").save()


def through_arrow(spark: Any, records: list[sl.Record]) -> Callable[[], None]:
    return lambda: materialize(spark.createDataFrame(with_epoch(to_arrow(records, "bench"), EPOCH)))


def through_pandas(spark: Any, records: list[sl.Record]) -> Callable[[], None]:
    return lambda: materialize(spark.createDataFrame(with_epoch(to_arrow(records, "bench"), EPOCH).to_pandas()))


def through_tuples(spark: Any, records: list[sl.Record]) -> Callable[[], None]:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    schema = StructType([
        StructField("key", StringType()), StructField("value", DoubleType()), StructField("ts", DoubleType()),
        StructField("epoch", LongType()), StructField("window_start", DoubleType()),
        StructField("window_end", DoubleType()),
    ])  # fmt: skip

    def run() -> None:
        rows = [(r.key, r.value, r.ts, EPOCH, r.window_start, r.window_end) for r in records]
        materialize(spark.createDataFrame(rows, schema))

    return run


def main(records: int, repeats: int) -> dict[str, Any]:
    """Records/s through Arrow and through tuples (median of ``repeats`` alternating runs)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    data = make_records(records)
    runs = {
        "arrow": through_arrow(spark, data),
        "tuples": through_tuples(spark, data),
        "pandas": through_pandas(spark, data),
    }
    for run in runs.values():  # warm-up: JIT, class loading, the first job of each kind
        run()
    timings = alternating(repeats, runs)
    rate = {name: median_rate(records, [seconds for seconds, _ in timings[name]]) for name in runs}
    return report(
        "spark", rate["arrow"], rate["tuples"], records=records, repeats=repeats,
        pandas_records_per_s=round(rate["pandas"]), arrow_vs_pandas=round(rate["arrow"] / rate["pandas"], 3),
    )  # fmt: skip
