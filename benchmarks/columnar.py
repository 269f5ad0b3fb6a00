"""Built-in wordcount on the columnar path, against a hand-written pyarrow loop over the same batches.

The words arrive as Arrow record batches of 10 000 rows (made before timing).
streamlet runs ``ColumnarSource -> aggregate("count", emit="end") -> sink``:
the batches travel as Arrow and are counted with ``pyarrow.compute``. The
baseline is what a careful engineer writes with pyarrow and no framework:
``pc.value_counts`` per batch, merged into a dict in one comprehension.
``per_batch_*`` is the same job with ``emit="batch"`` (each touched key's
running count after every batch, as ``reduce`` emits: ~6 300 result rows per
batch of 10 000 here, each turned into a record for the ``CollectSink``: most
of its time), and ``split_*`` counts over two ``SAME_KEY`` instances (every
batch split by key in Arrow; in one process on one loop, so it is checked,
not expected to be faster).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import streamlet as sl
from benchmarks.common import alternating, median_rate, report
from benchmarks.wordcount import make_words

BATCH = 10_000


def make_batches(records: int) -> list[pa.RecordBatch]:
    """The words of the wordcount benchmark as record batches of ``BATCH`` rows."""
    words = make_words(records)
    return [pa.record_batch({"word": words[start : start + BATCH]}) for start in range(0, records, BATCH)]


def run_baseline(batches: list[pa.RecordBatch]) -> dict[str, int]:
    """value_counts per batch, merged into a dict: the hand-written pyarrow loop."""
    totals: dict[str, int] = {}
    get = totals.get
    for batch in batches:
        counted = pc.value_counts(batch.column(0))
        words, counts = counted.field(0).to_pylist(), counted.field(1).to_pylist()
        totals.update({word: get(word, 0) + count for word, count in zip(words, counts, strict=True)})
    return totals


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


def main(records: int, repeats: int) -> dict[str, Any]:
    """Each run ``repeats`` times, alternating which goes first; medians, results checked equal."""
    batches = make_batches(records)
    timings = alternating(repeats, {
        "streamlet": lambda: run_streamlet(batches), "baseline": lambda: run_baseline(batches),
        "per_batch": lambda: run_streamlet(batches, "batch"), "split": lambda: run_streamlet(batches, "end", 2),
    })  # fmt: skip
    expected = timings["baseline"][0][1]
    if any(counts != expected for run in ("streamlet", "per_batch", "split") for _, counts in timings[run]):
        raise AssertionError("streamlet and the baseline disagree on the counts")
    rate = median_rate(records, [seconds for seconds, _ in timings["streamlet"]])
    baseline = median_rate(records, [seconds for seconds, _ in timings["baseline"]])
    per_batch = median_rate(records, [seconds for seconds, _ in timings["per_batch"]])
    split = median_rate(records, [seconds for seconds, _ in timings["split"]])
    return report(
        "columnar", rate, baseline, per_batch_records_per_s=round(per_batch),
        per_batch_ratio=round(per_batch / baseline, 3), split_records_per_s=round(split),
        split_ratio=round(split / baseline, 3), batch_rows=BATCH, records=records, repeats=repeats,
    )  # fmt: skip
