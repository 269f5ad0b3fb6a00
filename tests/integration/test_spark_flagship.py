"""The flagship example end to end on real Spark: its printed summary equals a computation without streamlet."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from examples import sensor_pipeline
from tests.support.kafka_io import consume
from tests.support.kafka_mock import MockBroker

pytestmark = pytest.mark.integration

EVENTS = 20_000


def expected_windows(count: int, millis: bool = False) -> dict[tuple[str, float], list[float]]:
    """The generated readings grouped by hand into 60 s windows (by their ts in whole ms, as Kafka keeps it)."""
    windows: dict[tuple[str, float], list[float]] = defaultdict(list)
    for record in sensor_pipeline.readings(count):
        ts = int(record.ts * 1000) / 1000 if millis else record.ts
        windows[record.key, ts - ts % 60.0].append(record.value)
    return windows


def expected_summary(count: int, millis: bool = False) -> list[list[str]]:
    """The table rows, from the same generated readings grouped by hand into 60 s windows."""
    windows = expected_windows(count, millis)
    per_sensor: dict[str, list[list[float]]] = defaultdict(list)
    for (sensor, _), values in windows.items():
        per_sensor[sensor].append(values)
    rows = []
    for sensor, groups in sorted(per_sensor.items()):
        means = [round(sum(values) / len(values), 2) for values in groups]
        rows.append([
            sensor, str(len(groups)), str(sum(len(values) for values in groups)),
            f"{min(min(values) for values in groups):.1f}", f"{max(max(values) for values in groups):.1f}",
            f"{max(means):.2f}", str(sum(1 for values in groups if max(values) > 35.0)),
        ])  # fmt: skip
    return rows


def test_flagship_prints_the_exact_summary(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sensor_pipeline.py --events 20000``: the summary table read back from Parquet matches the hand computation."""
    sensor_pipeline.main(["--events", str(EVENTS), "--output", str(tmp_path)])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    expected = expected_summary(EVENTS)
    windows = sum(int(row[1]) for row in expected)
    assert re.fullmatch(rf"{EVENTS} readings -> {windows} window rows in \d+ epochs", lines[0])
    table = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines if line.startswith("│ sensor-")]
    assert table == expected


def test_flagship_kafka_variant_reads_and_writes_kafka_exactly(
    spark: Any, kafka_broker: MockBroker, new_topic: Callable[[int], str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--kafka --produce``: readings go through the broker, the summary is exact, and the output topic holds
    every window row once (read_committed), with its bounds as headers."""
    readings, windows = new_topic(1), new_topic(1)
    argv = ["--events", str(EVENTS), "--output", str(tmp_path), "--kafka", kafka_broker.bootstrap, "--produce"]
    sensor_pipeline.main([*argv, "--in-topic", readings, "--out-topic", windows])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    table = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines if line.startswith("│ sensor-")]
    assert table == expected_summary(EVENTS, millis=True)
    expected = {
        (sensor, start, start + 60.0): sensor_pipeline.window_stats(values)
        for (sensor, start), values in expected_windows(EVENTS, millis=True).items()
    }
    written = anyio.run(consume, kafka_broker.bootstrap, windows)
    rows = {}
    for message in written:
        assert message.key is not None
        assert message.value is not None
        bounds = {name: float(value) for name, value in message.headers}
        row_key = (message.key.decode(), bounds["window_start"], bounds["window_end"])
        assert row_key not in rows, f"window row {row_key} written twice"
        rows[row_key] = json.loads(message.value)
    assert rows == expected
