"""SparkSink without Spark: arguments, Arrow rows, and the errors for a missing pyspark, pyarrow or Java."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import streamlet as sl
from streamlet.connectors import spark_session
from streamlet.connectors.spark_rows import read_chunks, to_arrow, with_epoch, write_chunk

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
        to_arrow([sl.Record("k", 1, 0.0)], "sink 'out' instance 0")


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
    table = with_epoch(to_arrow([sl.Record("a", 1, 0.5), sl.Record("b", 2, 1.5)], "sink"), 7)
    assert table.to_pydict() == {"key": ["a", "b"], "value": [1, 2], "ts": [0.5, 1.5], "epoch": [7, 7]}


def test_rows_of_dict_values_from_a_window() -> None:
    """Dict values become one column per field (a missing field is null); window bounds become columns."""
    records = [
        sl.WindowRecord("a", {"n": 1, "max": 3.0}, 10.0, 0.0, 10.0),
        sl.WindowRecord("b", {"n": 2}, 10.0, 0.0, 10.0),
    ]
    assert to_arrow(records, "sink").to_pydict() == {
        "key": ["a", "b"], "n": [1, 2], "max": [3.0, None], "ts": [10.0, 10.0],
        "window_start": [0.0, 0.0], "window_end": [10.0, 10.0],
    }  # fmt: skip


def test_dict_fields_named_like_row_columns_are_refused() -> None:
    """A dict value with a field called 'ts' would shadow a row column: the error names it and the sink."""
    with pytest.raises(sl.ConnectorError, match=r"^sink 'out' instance 1: dict values have fields named like row"):
        to_arrow([sl.Record("a", {"ts": 1}, 0.0)], "sink 'out' instance 1")


def test_values_arrow_cannot_hold_are_refused() -> None:
    """Mixed value types that fit no Arrow type fail with the sink named."""
    with pytest.raises(sl.ConnectorError, match=r"^sink 'out' instance 0: records do not fit an Arrow table: "):
        to_arrow([sl.Record("a", 1, 0.0), sl.Record("b", "x", 0.0)], "sink 'out' instance 0")


def test_staged_chunks_read_back_as_one_table_with_types_promoted(tmp_path: Path) -> None:
    """Chunks spilled separately come back in order as one table; int and float chunks unify to float."""
    write_chunk(tmp_path, to_arrow([sl.Record("a", 1, 0.0)], "sink"))
    write_chunk(tmp_path, to_arrow([sl.Record("b", 2.5, 1.0)], "sink"))
    assert read_chunks(tmp_path).to_pydict() == {"key": ["a", "b"], "value": [1.0, 2.5], "ts": [0.0, 1.0]}
    assert read_chunks(tmp_path / "empty") is None
