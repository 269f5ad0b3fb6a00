"""``streamlet run examples/sensor_pipeline.py``: the flagship's factory runs from the command line on real Spark.

One run (Spark takes 15-40 s to start): every window row it shows equals the
readings grouped by hand, the counts per node follow, and the Parquet the
``SparkSink`` wrote holds the same rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from examples import sensor_pipeline
from tests.support import run_output

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JAVA_17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")
EVENTS = 20_000


def expected_windows(count: int) -> dict[tuple[float, str], list[float]]:
    """The generated readings grouped by hand: (window start, sensor) -> celsius values."""
    windows: dict[tuple[float, str], list[float]] = defaultdict(list)
    for record in sensor_pipeline.readings(count):
        windows[record.ts - record.ts % 60.0, record.key].append(record.value)
    return windows


def expected_rows(windows: dict[tuple[float, str], list[float]]) -> list[list[str]]:
    """The window rows sink's table sorted by ts (the window's last millisecond), then sensor."""
    last_ms = {start: (round(start * 1000) + 60_000 - 1) / 1000 for start, _ in windows}
    return [
        [sensor, repr(sensor_pipeline.window_stats(values)), repr(last_ms[start]), f"[{start!r}, {start + 60.0!r})"]
        for (start, sensor), values in sorted(windows.items())
    ]


@pytest.mark.timeout(180)
def test_streamlet_run_of_the_flagship_shows_every_window_row(tmp_path: Path) -> None:
    """``--param events=20000 --param output=DIR --sort ts --rows 100``: 4 minutes x 8 sensors = 32 rows, exact."""
    env = dict(os.environ)
    if not env.get("JAVA_HOME") and JAVA_17.exists():
        env["JAVA_HOME"] = str(JAVA_17)
    output = tmp_path / "windows"
    run = subprocess.run(
        [sys.executable, "-m", "streamlet", "run", "examples/sensor_pipeline.py", "--param", f"events={EVENTS}",
         "--param", f"output={output}", "--sort", "ts", "--rows", "100"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    windows = expected_windows(EVENTS)
    assert len(windows) == 32
    assert run_output.rows(run.stdout, "sink 'window-rows'") == expected_rows(windows)
    assert run_output.caption(run.stdout, "window-rows") == "showing 32 of 32 records"
    assert run_output.node_rows(run.stdout, "sensor-pipeline") == [
        ["readings", "source", "1", str(EVENTS), str(EVENTS), "0"],
        ["window-stats", "task", "2", str(EVENTS), "32", "0"],
        ["to-spark", "sink", "1", "32", "-", "0"],
        ["window-rows", "sink", "1", "32", "-", "0"],
    ]
    assert run.stdout.splitlines()[-2] == run_output.COUNTERS_ZERO

    import pyarrow.parquet

    written = pyarrow.parquet.read_table(output).to_pylist()
    assert sorted((row["window_start"], row["key"], row["count"]) for row in written) == [
        (start, sensor, len(values)) for (start, sensor), values in sorted(windows.items())
    ]
