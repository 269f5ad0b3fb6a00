"""The flagship example end to end on real Spark: its printed summary equals a computation without streamlet."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from examples import sensor_pipeline

pytestmark = pytest.mark.integration

EVENTS = 20_000


def expected_summary(count: int) -> list[list[str]]:
    """The table rows, from the same generated readings grouped by hand into 60 s windows."""
    windows: dict[tuple[str, float], list[float]] = defaultdict(list)
    for record in sensor_pipeline.readings(count):
        windows[record.key, record.ts - record.ts % 60.0].append(record.value)
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
