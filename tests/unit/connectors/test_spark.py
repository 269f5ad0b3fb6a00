"""SparkSink without Spark: arguments, Arrow rows, and the errors for a missing pyspark, pyarrow or Java."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamlet as sl
from streamlet.connectors import spark_session
from streamlet.connectors.spark_rows import read_chunks, to_arrow, with_epoch, write_chunk
from streamlet.core.model.record import Element
from tests.support.elements import el

ROOT = Path(__file__).resolve().parents[3]


def test_import_streamlet_does_not_import_pyspark_or_pyarrow() -> None:
    """``import streamlet`` (SparkSink included) loads neither pyspark nor pyarrow."""
    code = "import sys, streamlet; print('pyspark' in sys.modules, 'pyarrow' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert run.stdout.split() == ["False", "False"]


def test_missing_pyspark_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pyspark, asking for a session says what to install."""
    monkeypatch.setitem(sys.modules, "pyspark", None)
    monkeypatch.setitem(sys.modules, "pyspark.sql", None)
    message = r"^SparkSink needs pyspark, which is not installed: pip install 'streamlet\[spark\]'$"
    with pytest.raises(sl.ConnectorError, match=message):
        spark_session.spark_session()


def test_missing_pyarrow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pyarrow, turning records into rows says what to install."""
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    message = r"^SparkSink needs pyarrow, which is not installed: pip install 'streamlet\[spark\]'$"
    with pytest.raises(sl.ConnectorError, match=message):
        to_arrow([el("k", 1, 0.0)], "sink 'out' instance 0")


def test_missing_java_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """No JAVA_HOME and no java on the PATH: the error says Spark needs Java 17 or 21."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(sl.ConnectorError, match=r"^Spark needs Java 17 or 21: JAVA_HOME is not set and no 'java'"):
        spark_session.check_java()


def test_java_home_without_java_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A JAVA_HOME that holds no bin/java is named in the error."""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(
        sl.ConnectorError, match=rf"^Spark needs Java 17 or 21, but JAVA_HOME={tmp_path} has no bin/java$"
    ):
        spark_session.check_java()


@pytest.mark.parametrize(
    ("arguments", "given"),
    [({}, "none"), ({"path": "out", "table": "t"}, "['path', 'table']")],
)
def test_exactly_one_destination(arguments: dict[str, str], given: str) -> None:
    """SparkSink needs exactly one of path, table and fn."""
    with pytest.raises(
        ValueError, match=rf"^SparkSink needs exactly one of path, table or fn; got {re.escape(given)}$"
    ):
        sl.SparkSink(**arguments)  # type: ignore[arg-type]


def test_rows_of_plain_values() -> None:
    """key, value, ts; the epoch is added after ts; no window columns for records without bounds."""
    table = with_epoch(to_arrow([el("a", 1, 0.5), el("b", 2, 1.5)], "sink"), 7)
    assert table.to_pydict() == {"key": ["a", "b"], "value": [1, 2], "ts": [0.5, 1.5], "epoch": [7, 7]}


def test_rows_of_dict_values_from_a_window() -> None:
    """Dict values become one column per field (a missing field is null); window bounds become columns."""
    records = [
        ("a", {"n": 1, "max": 3.0}, 10.0, 0, (0.0, 10.0), "on_time"),
        ("b", {"n": 2}, 10.0, 0, (0.0, 10.0), "on_time"),
    ]
    assert to_arrow(records, "sink").to_pydict() == {
        "key": ["a", "b"], "n": [1, 2], "max": [3.0, None], "ts": [10.0, 10.0],
        "window_start": [0.0, 0.0], "window_end": [10.0, 10.0],
    }  # fmt: skip


def test_dict_fields_named_like_row_columns_are_refused() -> None:
    """A dict value with a field called 'ts' would shadow a row column: the error names it and the sink."""
    with pytest.raises(sl.ConnectorError, match=r"^sink 'out' instance 1: dict values have fields named like row"):
        to_arrow([el("a", {"ts": 1}, 0.0)], "sink 'out' instance 1")


def test_values_arrow_cannot_hold_are_refused() -> None:
    """Mixed value types that fit no Arrow type fail with the sink named."""
    with pytest.raises(sl.ConnectorError, match=r"^sink 'out' instance 0: records do not fit an Arrow table: "):
        to_arrow([el("a", 1, 0.0), el("b", "x", 0.0)], "sink 'out' instance 0")


def test_staged_chunks_read_back_as_one_table_with_types_promoted(tmp_path: Path) -> None:
    """Chunks spilled separately come back in order as one table; int and float chunks unify to float."""
    write_chunk(tmp_path, to_arrow([el("a", 1, 0.0)], "sink"))
    write_chunk(tmp_path, to_arrow([el("b", 2.5, 1.0)], "sink"))
    assert read_chunks(tmp_path).to_pydict() == {"key": ["a", "b"], "value": [1.0, 2.5], "ts": [0.0, 1.0]}
    assert read_chunks(tmp_path / "empty") is None


class Recording(sl.SparkSink):
    """A SparkSink that keeps what it would hand to Spark: ``(epoch, index, rows as a dict of columns)``."""

    def __init__(self, path: Path, **options: Any) -> None:
        super().__init__(path, **options)
        self.handed: list[tuple[int, int, dict[str, list[Any]]]] = []
        self.release = threading.Event()
        self.release.set()

    def hand_over(self, rows: Any, epoch: int, index: int) -> None:
        self.release.wait(10)
        self.handed.append((epoch, index, rows.to_pydict()))


def records(*values: int) -> list[Element]:
    return [el("k", value, float(value)) for value in values]


def open_writer(sink: sl.SparkSink, attempt: str = "run-a") -> Any:
    return sink.open(sl.SinkContext("out", 0, 1, attempt=attempt))


async def test_rows_past_max_rows_spill_and_reach_spark_as_one_epoch(tmp_path: Path) -> None:
    """max_rows=3: ten rows spill in chunks of three, then go to Spark at commit as one table for the epoch."""
    sink = Recording(tmp_path, max_rows=3)
    writer = open_writer(sink)
    for value in range(10):
        await writer.write(records(value))
    assert len(list((tmp_path / "_staging" / "out" / "run-a" / "0000-open").glob("chunk-*.arrow"))) == 3
    await writer.prepare_commit(4)
    assert len(list((tmp_path / "_staging" / "out" / "run-a" / "0000-00000004").glob("chunk-*.arrow"))) == 4
    assert sink.handed == []
    await writer.commit(4)
    assert sink.handed == [
        (4, 0, {"key": ["k"] * 10, "value": list(range(10)), "ts": [float(v) for v in range(10)], "epoch": [4] * 10})
    ]
    assert list((tmp_path / "_staging" / "out" / "run-a").iterdir()) == []


async def test_a_write_waits_while_spark_is_busy_and_memory_is_full(tmp_path: Path) -> None:
    """With max_rows rows held and a commit in flight, write() returns only after the Spark write ends."""
    sink = Recording(tmp_path, max_rows=2)
    writer = open_writer(sink)
    await writer.write(records(1))
    await writer.prepare_commit(1)
    sink.release.clear()
    events: list[str] = []

    async def commit() -> None:
        await writer.commit(1)
        events.append("committed")

    async def write() -> None:
        await anyio.sleep(0.05)  # the commit is under way
        await writer.write(records(2, 3))
        events.append("written")

    async with anyio.create_task_group() as group:
        group.start_soon(commit)
        group.start_soon(write)
        await anyio.sleep(0.3)
        assert events == []  # the write is held back
        sink.release.set()
    assert events == ["committed", "written"]


async def test_restore_hands_over_sealed_epochs_up_to_the_checkpoint_and_drops_the_rest(tmp_path: Path) -> None:
    """Run A sealed epochs 1 and 2, checkpoint 1 completed: 1 goes to Spark, 2 and the open rows are discarded."""
    crashed = open_writer(Recording(tmp_path))
    for epoch in (1, 2):
        await crashed.write(records(epoch))
        await crashed.prepare_commit(epoch)
    await crashed.write(records(3))
    await crashed.write(records(4))
    crashed.abort()
    (tmp_path / "_staging" / "out" / "run-a" / "0000-open").mkdir()

    sink = Recording(tmp_path)
    await open_writer(sink, "run-b").restore(sl.RestorePoint(1, "run-a"))
    assert [(epoch, rows["value"]) for epoch, _, rows in sink.handed] == [(1, [1])]
    assert [path.name for path in (tmp_path / "_staging" / "out").iterdir()] == ["run-b"]


async def test_restore_never_hands_over_another_attempts_sealed_epochs(tmp_path: Path) -> None:
    """Runs A and X both sealed epoch 1; restoring from A's checkpoint 1 hands over A's rows only."""
    for attempt, value in (("run-a", 1), ("run-x", 100)):
        writer = open_writer(Recording(tmp_path), attempt)
        await writer.write(records(value))
        await writer.prepare_commit(1)
    sink = Recording(tmp_path)
    await open_writer(sink, "run-b").restore(sl.RestorePoint(1, "run-a"))
    assert [(epoch, rows["value"]) for epoch, _, rows in sink.handed] == [(1, [1])]
    assert (tmp_path / "_staging" / "out" / "run-x" / "0000-00000001").is_dir()


async def test_without_checkpoints_everything_goes_at_close_as_epoch_0(tmp_path: Path) -> None:
    """No barrier ever came: close() hands every row over once, as epoch 0."""
    sink = Recording(tmp_path, max_rows=2)
    writer = open_writer(sink)
    await writer.write(records(1, 2, 3))
    await writer.write(records(4))
    await writer.close()
    assert [(epoch, rows["value"]) for epoch, _, rows in sink.handed] == [(0, [1, 2, 3, 4])]


def test_a_java_that_cannot_start_spark_is_reported(tmp_path: Path) -> None:
    """A JAVA_HOME whose java fails: the error names the master and that Java (in a fresh process: no session yet)."""
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\nexit 1\n")
    java.chmod(0o755)
    code = (
        "import streamlet as sl\n"
        "from streamlet.connectors.spark_session import spark_session\n"
        "try:\n"
        "    spark_session()\n"
        "except sl.ConnectorError as exc:\n"
        "    print(str(exc).splitlines()[0], exc.__cause__ is not None)\n"
    )
    env = {**os.environ, "JAVA_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    message = rf"^could not start a SparkSession on local\[\*\] \(Java: {re.escape(str(tmp_path))}\): .* True$"
    assert re.match(message, run.stdout.strip()), run.stdout + run.stderr
