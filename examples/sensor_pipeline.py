"""The flagship: sensor readings -> one-minute event-time windows per sensor -> Spark (Parquet) -> a summary.

``make run`` runs it on the embedded defaults: streamlet in this process,
Spark as a local session. The stream is generated (a fixed seed, no server):
temperature readings of eight sensors, 100 per second of event time, out of
order by up to two seconds, with rare spikes. Each sensor's readings are
windowed by event time (60 s, tumbling; the source's watermark trails the
newest reading by 5 s, so readings up to 5 s out of order are on time); every closed
window becomes one row ``{count, min, max, mean}`` with its bounds, and a
``SparkSink`` writes the rows to Parquet under ``out/sensor_pipeline/``,
exactly once per checkpoint epoch. Spark then reads the folder back and
prints a summary per sensor.

    python examples/sensor_pipeline.py [--events N] [--output DIR]

``streamlet run examples/sensor_pipeline.py`` runs the same stream (its
``build_topology`` defaults to 300 000 readings and Parquet under
``out/sensor_pipeline/windows``) and shows the window rows and the counts
per node instead of the Spark query; ``--param events=20000`` makes it
smaller, ``--param output=DIR`` moves the Parquet.

With ``--kafka HOST:PORT`` the readings come from the Kafka topic
``--in-topic`` instead (JSON ``{"celsius": x}`` keyed by sensor, event time =
the Kafka timestamp; ``--produce`` first writes the generated readings
there), and the window rows also go out to ``--out-topic`` as JSON through a
transactional ``KafkaSink``: a ``read_committed`` consumer sees each exactly
once.

    python examples/sensor_pipeline.py --kafka localhost:9092 --produce
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import streamlet as sl

EVENTS = 300_000
OUTPUT = Path("out/sensor_pipeline")
SENSORS = 8
EVENTS_PER_SECOND = 100
WINDOW = sl.TimeWindow(60.0, time="event")
WATERMARKS = sl.Watermarks(out_of_orderness=5.0)  # readings arrive up to 5 s out of order
ALERT_ABOVE = 35.0  # a window whose hottest reading passes this counts as an alert


def readings(count: int, seed: int = 2026) -> Iterator[sl.Record]:
    """``count`` readings: key the sensor, value degrees Celsius (0.1 steps), ts event time in seconds."""
    rng = random.Random(seed)
    base = [rng.uniform(18.0, 26.0) for _ in range(SENSORS)]
    for index in range(count):
        sensor = rng.randrange(SENSORS)
        celsius = base[sensor] + rng.gauss(0.0, 1.5) + (15.0 if rng.random() < 0.002 else 0.0)
        ts = index / EVENTS_PER_SECOND + rng.uniform(0.0, 2.0)
        yield sl.Record(f"sensor-{sensor + 1:02d}", round(celsius, 1), ts)


class WindowStats(sl.Task):
    """For one closed window: per sensor, the count, min, max and mean of its readings (a dict: one column each)."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        by_sensor: dict[str, list[float]] = {}
        for record in inputs.get():
            by_sensor.setdefault(record.key, []).append(record.value)
        outputs.emit_all((sensor, window_stats(values)) for sensor, values in by_sensor.items())


def spark_on_loopback() -> None:
    """This example's choice: Spark binds to 127.0.0.1 (no resolvable host name needed), unless told otherwise."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def window_stats(values: list[float]) -> dict[str, Any]:
    """The row of one sensor's window."""
    return {"count": len(values), "min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 2)}


def build_topology(
    events: int | Iterator[sl.Record] | sl.Source = EVENTS,
    output: Path = OUTPUT / "windows",
    kafka_out: sl.Sink | None = None,
) -> sl.Topology:
    """readings -> stats per sensor and window (2 instances, by sensor) -> SparkSink(output) [and Kafka].

    ``events`` is a number of generated readings, or the readings themselves.
    The window rows also go to a ``CollectSink`` (a few hundred rows: one per
    sensor and minute), which ``streamlet run`` shows.
    """
    spark_on_loopback()
    readings_in = readings(events) if isinstance(events, int) else events
    topology = sl.Topology("sensor-pipeline")
    source = topology.add_source("readings", readings_in, watermarks=WATERMARKS)
    stats = topology.add_task("window-stats", WindowStats, parallelism=2, window=WINDOW)
    stats.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("to-spark", sl.SparkSink(output)).set_input(stats)
    topology.add_sink("window-rows", sl.CollectSink()).set_input(stats)
    if kafka_out is not None:
        topology.add_sink("to-kafka", kafka_out).set_input(stats)
    return topology


@dataclass(frozen=True)
class KafkaSettings:
    """Where the Kafka variant reads readings and writes window rows."""

    bootstrap: str
    in_topic: str
    out_topic: str

    def source(self) -> sl.KafkaSource:
        """The readings topic, read to its end (a bounded run); the celsius value out of each JSON record."""
        return sl.KafkaSource(
            self.in_topic, self.bootstrap, "sensor-pipeline",
            value_deserializer=lambda raw: json.loads(raw)["celsius"], stop_at_end=True,
        )  # fmt: skip

    def sink(self, staging: Path) -> sl.KafkaSink:
        """Window rows as JSON, with their bounds, in transactions bound to the checkpoints."""
        return sl.KafkaSink(
            self.out_topic, self.bootstrap, transactional=True, staging_dir=staging,
            value_serializer=lambda row: json.dumps(row).encode(), headers=window_headers,
        )  # fmt: skip


def window_headers(record: sl.Record) -> list[tuple[str, bytes]]:
    """The window's bounds travel as headers next to the JSON row."""
    start, end = record.window_start, record.window_end
    return [("window_start", str(start).encode()), ("window_end", str(end).encode())]


def produce_readings(kafka: KafkaSettings, count: int) -> None:
    """Write the generated readings to the input topic (key: sensor; timestamp: event time in ms)."""
    from aiokafka import AIOKafkaProducer

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for reading in readings(count):
                value = json.dumps({"celsius": reading.value}).encode()
                await producer.send(
                    kafka.in_topic, value, key=reading.key.encode(), timestamp_ms=int(reading.ts * 1000)
                )
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(write())


def summary(spark: Any, output: Path) -> list[tuple[Any, ...]]:
    """Per sensor, from the Parquet rows: windows, readings, min, max, peak window mean, alert windows."""
    spark.read.parquet(str(output)).createOrReplaceTempView("sensor_windows")
    query = f"""
        SELECT key, COUNT(*), SUM(count), MIN(min), MAX(max), MAX(mean), COUNT_IF(max > {ALERT_ABOVE})
        FROM sensor_windows GROUP BY key ORDER BY key
    """
    return [tuple(row) for row in spark.sql(query).collect()]


def summary_table(rows: list[tuple[Any, ...]]) -> Table:
    """The summary as a rich table."""
    table = Table(title="Per sensor, over one-minute windows")
    for name in ("sensor", "windows", "readings", "min °C", "max °C", "peak mean", "alerts"):
        table.add_column(name, justify="left" if name == "sensor" else "right")
    for sensor, windows, count, low, high, peak, alerts in rows:
        table.add_row(sensor, str(windows), str(count), f"{low:.1f}", f"{high:.1f}", f"{peak:.2f}", str(alerts))
    return table


def tracked(events: Iterator[sl.Record], progress: Progress, task: Any, every: int = 5000) -> Iterator[sl.Record]:
    """``events``, advancing the progress bar every ``every`` of them."""
    for index, event in enumerate(events, 1):
        yield event
        if index % every == 0:
            progress.advance(task, every)


def run_pipeline(count: int, output: Path, console: Console, kafka: KafkaSettings | None = None) -> sl.JobResult:
    """Run the streaming job (a checkpoint every 0.25 s) with a progress bar; Parquet lands under ``output``."""
    shutil.rmtree(output, ignore_errors=True)  # a fresh run: its checkpoints and Parquet only
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        if kafka is None:
            task = progress.add_task("streaming readings", total=count)
            topology = build_topology(tracked(readings(count), progress, task), output / "windows")
        else:
            progress.add_task(f"streaming readings from Kafka topic {kafka.in_topic}", total=None)
            topology = build_topology(kafka.source(), output / "windows", kafka.sink(output / "kafka-staging"))
        result = sl.run(topology, checkpoint_dir=output / "checkpoints", checkpoint_interval=0.25)
        if kafka is None:
            progress.update(task, completed=count)
    return result


def main(argv: list[str] | None = None) -> None:
    """Generate, window, hand to Spark, then query the Parquet and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--kafka", metavar="HOST:PORT", help="read readings from Kafka and write window rows back")
    parser.add_argument("--in-topic", default="sensor-readings")
    parser.add_argument("--out-topic", default="sensor-windows")
    parser.add_argument("--produce", action="store_true", help="first write the generated readings to --in-topic")
    args = parser.parse_args(argv)
    kafka = None if args.kafka is None else KafkaSettings(args.kafka, args.in_topic, args.out_topic)
    if kafka is not None and args.produce:
        produce_readings(kafka, args.events)
    spark_on_loopback()
    console = Console()
    began = time.perf_counter()
    with console.status("starting Spark (local[*])"):
        spark = sl.SparkSink(args.output).spark()  # the session the sink will use: one per process
        spark.sparkContext.setLogLevel("ERROR")
    result = run_pipeline(args.events, args.output, console, kafka)
    rows = summary(spark, args.output / "windows")
    epochs = spark.read.parquet(str(args.output / "windows")).select("epoch").distinct().count()
    readings_in = result.statistics.nodes["readings"].records_out
    console.print(f"{readings_in} readings -> {sum(row[1] for row in rows)} window rows in {epochs} epochs")
    if kafka is not None:
        console.print(f"window rows also in Kafka topic {kafka.out_topic} (transactional)")
    console.print(f"Parquet: {args.output / 'windows'}  ({time.perf_counter() - began:.1f} s)")
    console.print(summary_table(rows))


if __name__ == "__main__":
    main()
