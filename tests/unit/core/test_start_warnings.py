"""Defaults that surprise get one warning each when a job starts: a processing-time window fed by event time,
and a sink that is exactly-once only with checkpoints in a job without them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import streamlet as sl

RECORDS = [sl.Record("k", 1, float(ts)) for ts in range(5)]


def warnings_of(topology: sl.Topology, **options: Any) -> list[dict[str, Any]]:
    with capture_logs() as logs:
        sl.run(topology, **options)
    return [line for line in logs if line["log_level"] == "warning"]


def windowed(time: str, watermarks: sl.Watermarks | None) -> sl.Topology:
    topology = sl.Topology("windowed")
    clicks = topology.add_source("clicks", RECORDS, watermarks=watermarks)
    tagged = topology.map("tag", lambda r: (r.key, r.value)).set_input(clicks)  # a path, not an edge
    counts = topology.window_reduce("count", "sum", window=sl.TimeWindow(60, time=time)).set_input(tagged)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    return topology


def test_a_processing_time_window_fed_by_event_time_is_warned_of_once() -> None:
    [warning] = warnings_of(windowed("processing", sl.Watermarks(out_of_orderness=1)))
    assert (warning["event"], warning["task"], warning["sources"]) == (
        "window on processing time fed by event time", "count", "clicks",
    )  # fmt: skip
    assert warning["effect"].endswith("pass time='event'")


@pytest.mark.parametrize(("time", "watermarks"), [("event", sl.Watermarks()), ("processing", None)])
def test_an_event_time_window_or_a_source_without_watermarks_is_not(time: str, watermarks: Any) -> None:
    assert warnings_of(windowed(time, watermarks)) == []


def written(sink: sl.Sink) -> sl.Topology:
    topology = sl.Topology("written")
    topology.add_sink("files", sink).set_input(topology.add_source("numbers", RECORDS))
    return topology


def test_an_exactly_once_sink_without_checkpoints_is_warned_of_and_with_them_it_is_not(tmp_path: Path) -> None:
    [warning] = warnings_of(written(sl.FileSink(tmp_path / "out")))
    assert (warning["event"], warning["sink"]) == ("exactly-once sink without checkpoints", "files")
    assert warning["effect"].startswith("its output is at-least-once")
    assert warnings_of(written(sl.FileSink(tmp_path / "again")), checkpoint_dir=tmp_path / "checkpoints") == []
    assert warnings_of(written(sl.CollectSink())) == []
