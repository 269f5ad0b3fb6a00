"""Built-in wordcount on the columnar path, against a hand-written pyarrow loop over the same batches.

The words arrive as Arrow record batches of 10 000 rows (made before timing).
streamlet runs ``ColumnarSource -> aggregate("count", emit="end") -> sink``:
the batches travel as Arrow and are counted with ``pyarrow.compute``. The
baseline is what a careful engineer writes with pyarrow and no framework for
a final count: one ``Table.group_by("word").aggregate(count)`` over the whole
table (pyarrow's defaults, threads included). ``value_counts_loop_*`` is the
older, weaker baseline (``pc.value_counts`` per batch merged into a dict),
kept for comparison. ``per_batch_*`` is the same job with ``emit="batch"``
(each touched key's running count after every batch, as ``reduce`` emits:
~6 300 result rows per batch of 10 000 here, each turned into a record for
the ``CollectSink``: most of its time) against its own baseline, a
``group_by`` per batch producing the same rows; ``split_*`` counts over two
``SAME_KEY`` instances (every batch split by key in Arrow; in one process on
one loop, so it is checked, not expected to be faster). ``peak_rss_mb`` is
this process's peak resident memory over the whole benchmark.

``window_*`` is the windowed count: the same words stamped with an int event
time (``RATE`` words a second, in order), counted per word in tumbling
``TimeWindow(WINDOW, time="event")`` windows by
``aggregate("count", window=...)`` (each window holding its rows in Arrow,
counted by one ``group_by`` when the watermark passes its end and emitted as
one Arrow batch with its bounds, into a columnar sink; the result dict made
from those batches as the baseline makes it from its ``group_by``'s), against
one ``group_by([window_start, word])`` over the whole table; ``window_loop_*``
against the streaming pyarrow loop (window starts by ``pc.subtract``/
``pc.modulo``, ``group_by`` + ``aggregate`` per batch, merged into a dict per
window, windows emitted when the watermark, the largest time read less
``LAG``, passes them). Results are checked equal.
"""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import streamlet as sl
from benchmarks.common import alternating, median_rate, report
from benchmarks.wordcount import make_words
from streamlet.core.model.columns import ColumnBatch

BATCH = 10_000
RATE = 1_000  # words a second of event time in the windowed count
WINDOW = 10  # seconds: the windowed count's tumbling window
LAG = 1  # seconds: the watermark's bound on out-of-orderness


def make_batches(records: int) -> list[pa.RecordBatch]:
    """The words of the wordcount benchmark as record batches of ``BATCH`` rows."""
    words = make_words(records)
    return [pa.record_batch({"word": words[start : start + BATCH]}) for start in range(0, records, BATCH)]


def run_baseline(batches: list[pa.RecordBatch]) -> dict[str, int]:
    """One group_by over the whole table: a careful engineer's final count with pyarrow."""
    counted = pa.Table.from_batches(batches).group_by("word").aggregate([("word", "count")])
    return dict(zip(counted.column("word").to_pylist(), counted.column("word_count").to_pylist(), strict=True))


def run_batch_baseline(batches: list[pa.RecordBatch]) -> dict[str, int]:
    """``emit="batch"`` by hand: a group_by per batch, each touched word's running count as a row (kept, as the
    job's sink keeps its records); the totals."""
    totals: dict[str, int] = {}
    rows: list[tuple[str, int]] = []
    for batch in batches:
        counted = pa.Table.from_batches([batch]).group_by("word").aggregate([("word", "count")])
        words, counts = counted.column("word").to_pylist(), counted.column("word_count").to_pylist()
        for word, count in zip(words, counts, strict=True):
            total = totals[word] = totals.get(word, 0) + count
            rows.append((word, total))
    return totals


def run_loop_baseline(batches: list[pa.RecordBatch]) -> dict[str, int]:
    """value_counts per batch, merged into a dict: the older hand-written pyarrow loop."""
    totals: dict[str, int] = {}
    get = totals.get
    for batch in batches:
        counted = pc.value_counts(batch.column(0))
        words, counts = counted.field(0).to_pylist(), counted.field(1).to_pylist()
        totals.update({word: get(word, 0) + count for word, count in zip(words, counts, strict=True)})
    return totals


def make_stamped(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """The same batches with an int ``ts`` column: ``RATE`` words a second, in order."""
    stamped, first = [], 0
    for batch in batches:
        ts = pa.array(range(first, first + batch.num_rows), pa.int64())
        stamped.append(pa.record_batch({"word": batch.column(0), "ts": pc.divide(ts, RATE)}))
        first += batch.num_rows
    return stamped


WindowCounts = dict[tuple[int, str], int]  # (window start, word) -> count


def run_window_baseline(batches: list[pa.RecordBatch]) -> WindowCounts:
    """One group_by (window start, word) over the whole table."""
    table = pa.Table.from_batches(batches)
    ts = table.column("ts")
    starts = pc.subtract(ts, pc.modulo(ts, WINDOW))
    grouped = pa.table({"start": starts, "word": table.column("word")}).group_by(["start", "word"])
    counted = grouped.aggregate([("word", "count")])
    columns = (counted.column(name).to_pylist() for name in ("start", "word", "word_count"))
    return {(start, word): count for start, word, count in zip(*columns, strict=True)}


def run_window_loop_baseline(batches: list[pa.RecordBatch]) -> WindowCounts:
    """Per batch: window starts in pc, group_by (start, word) + count, merged into each window's dict; a window
    goes out when the watermark passes its end, the rest at the end."""
    open_windows: dict[int, dict[str, int]] = {}
    emitted: WindowCounts = {}
    watermark = None
    for batch in batches:
        ts = batch.column(1)
        starts = pc.subtract(ts, pc.modulo(ts, WINDOW))
        grouped = (
            pa.table({"start": starts, "word": batch.column(0)})
            .group_by(["start", "word"], use_threads=False)
            .aggregate([("word", "count")])
        )
        columns = (grouped.column(name).to_pylist() for name in ("start", "word", "word_count"))
        for start, word, count in zip(*columns, strict=True):
            counts = open_windows.get(start)
            if counts is None:
                counts = open_windows[start] = {}
            counts[word] = counts.get(word, 0) + count
        top = pc.max(ts).as_py() - LAG
        watermark = top if watermark is None else max(watermark, top)
        for start in sorted(start for start in open_windows if start + WINDOW <= watermark):
            emitted.update(((start, word), count) for word, count in open_windows.pop(start).items())
    for start in sorted(open_windows):
        emitted.update(((start, word), count) for word, count in open_windows.pop(start).items())
    return emitted


class ArrowCollectSink(sl.Sink):
    """A columnar sink keeping the Arrow batches it is given (in this process: the benchmark runs in one)."""

    takes_columns = True

    def __init__(self) -> None:
        self.batches: list[ColumnBatch] = []

    def open(self, context: sl.SinkContext) -> sl.ElementWriter:
        """A writer appending to this sink's list."""
        return _ArrowCollectWriter(self.batches)


class _ArrowCollectWriter(sl.ElementWriter):
    def __init__(self, batches: list[ColumnBatch]) -> None:
        self.batches = batches

    def write(self, batch: list[Any]) -> None:
        raise AssertionError("the windowed count reached its sink as records, not as Arrow batches")

    def write_columns(self, batch: ColumnBatch) -> None:
        self.batches.append(batch)


def run_window_streamlet(batches: list[pa.RecordBatch]) -> WindowCounts:
    """The windowed columnar count into a columnar sink: ``(window_start, word) -> count`` of every result, made
    from the fired windows' Arrow batches as the baseline makes it from its ``group_by``'s."""
    topology = sl.Topology("columnar-window-bench")
    source = sl.ColumnarSource(batches, key="word", ts="ts")
    words = topology.add_source("words", source, watermarks=sl.Watermarks(out_of_orderness=LAG))
    counts = topology.aggregate("count", "count", window=sl.TimeWindow(WINDOW, time="event")).set_input(words)
    sink = ArrowCollectSink()
    topology.add_sink("totals", sink).set_input(counts)
    sl.run(topology)
    fired = pa.Table.from_batches([batch.data for batch in sink.batches])
    columns = (fired.column(name).to_pylist() for name in ("window_start", "key", "value"))
    return {(start, word): count for start, word, count in zip(*columns, strict=True)}


def build(batches: list[pa.RecordBatch], emit: str = "end", parallelism: int = 1) -> sl.Topology:
    """The columnar wordcount."""
    topology = sl.Topology("columnar-bench")
    words = topology.add_source("words", sl.ColumnarSource(batches, key="word"))
    counts = topology.aggregate("count", "count", emit=emit, parallelism=parallelism)  # type: ignore[arg-type]
    counts.set_input(words, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(counts)
    return topology


def run_streamlet(batches: list[pa.RecordBatch], emit: str = "end", parallelism: int = 1) -> dict[str, int]:
    """The columnar job; each word's last emitted count (its total)."""
    result = sl.run(build(batches, emit, parallelism))
    return {record.key: record.value for record in result.sink("totals")}


def digest(counts: dict[Any, int]) -> int:
    """What is kept of a run's result for the checks: equal results, equal digests (the windowed results of
    every run kept whole held over a GB)."""
    return hash(frozenset(counts.items()))


def held_beyond_input_mb(records: int) -> float:
    """The most resident memory the ``emit="end"`` job over ``records`` words added at once beyond its input
    (MB), in a fresh process (in this one, memory freed by earlier runs hides it): Linux's peak (VmHWM),
    reset once the input is made, less the resident memory then."""
    code = f"from benchmarks.columnar import print_held; print_held({records})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def print_held(records: int) -> None:
    """Print :func:`held_beyond_input_mb`'s figure for this process."""
    batches = make_batches(records)
    gc.collect()
    status = Path("/proc/self/status")
    resident = _status_mb(status.read_text(), "VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    counts = run_streamlet(batches)
    assert len(counts) > 0
    print(round(_status_mb(status.read_text(), "VmHWM") - resident, 1))


def _status_mb(status: str, field: str) -> float:
    return int(status.split(f"{field}:")[1].split()[0]) / 1024


def main(records: int, repeats: int) -> dict[str, Any]:
    """Each run ``repeats`` times, alternating which goes first; medians, results checked equal. ``end_10x_*``:
    ``emit="end"`` against the ``group_by`` over ten times the rows; ``end_held_mb`` and ``end_10x_held_mb``:
    the most memory the ``emit="end"`` job added beyond its input at once (a separate untimed run each)."""
    batches = make_batches(records)
    stamped = make_stamped(batches)
    timings = alternating(repeats, {
        "streamlet": lambda: run_streamlet(batches), "baseline": lambda: run_baseline(batches),
        "loop": lambda: run_loop_baseline(batches),
        "per_batch": lambda: run_streamlet(batches, "batch"), "batch_baseline": lambda: run_batch_baseline(batches),
        "split": lambda: run_streamlet(batches, "end", 2),
        "window": lambda: run_window_streamlet(stamped), "window_baseline": lambda: run_window_baseline(stamped),
        "window_loop": lambda: run_window_loop_baseline(stamped),
    }, keep=digest)  # fmt: skip
    large = batches * 10
    large_timings = alternating(repeats, {
        "end": lambda: run_streamlet(large), "group_by": lambda: run_baseline(large),
    }, keep=digest)  # fmt: skip
    if any(counts != large_timings["group_by"][0][1] for _, counts in large_timings["end"]):
        raise AssertionError("streamlet and the baseline disagree on the counts over ten times the rows")
    large_rates = {
        name: median_rate(10 * records, [seconds for seconds, _ in runs]) for name, runs in large_timings.items()
    }
    expected = timings["baseline"][0][1]
    counted = ("streamlet", "per_batch", "split", "loop", "batch_baseline")
    if any(counts != expected for run in counted for _, counts in timings[run]):
        raise AssertionError("streamlet and the baselines disagree on the counts")
    expected_windows = timings["window_baseline"][0][1]
    windowed = [*timings["window"], *timings["window_loop"]]
    if any(counts != expected_windows for _, counts in windowed) or not expected_windows:
        raise AssertionError("streamlet and the baselines disagree on the windowed counts")
    rates = {name: median_rate(records, [seconds for seconds, _ in runs]) for name, runs in timings.items()}
    return report(
        "columnar", rates["streamlet"], rates["baseline"],
        value_counts_loop_records_per_s=round(rates["loop"]),
        value_counts_loop_ratio=round(rates["streamlet"] / rates["loop"], 3),
        per_batch_records_per_s=round(rates["per_batch"]),
        per_batch_baseline_records_per_s=round(rates["batch_baseline"]),
        per_batch_ratio=round(rates["per_batch"] / rates["batch_baseline"], 3),
        split_records_per_s=round(rates["split"]), split_ratio=round(rates["split"] / rates["baseline"], 3),
        window_records_per_s=round(rates["window"]), window_baseline_records_per_s=round(rates["window_baseline"]),
        window_ratio=round(rates["window"] / rates["window_baseline"], 3),
        window_loop_records_per_s=round(rates["window_loop"]),
        window_loop_ratio=round(rates["window"] / rates["window_loop"], 3),
        end_10x_records_per_s=round(large_rates["end"]), end_10x_baseline_records_per_s=round(large_rates["group_by"]),
        end_10x_ratio=round(large_rates["end"] / large_rates["group_by"], 3),
        end_held_mb=held_beyond_input_mb(records), end_10x_held_mb=held_beyond_input_mb(10 * records),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        batch_rows=BATCH, records=records, repeats=repeats,
    )  # fmt: skip
