"""A columnar window's results leave as Arrow batches with window_start/window_end columns, window by window."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

import streamlet as sl
from streamlet.backends.processes.placement import spread
from streamlet.core.model.columnar import AggregateTask
from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.model.record import Batch, Record, records_of
from streamlet.core.windows.columnar import aggregate_window
from streamlet.core.windows.split import split_window_snapshot

pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")

# (key, ts) in two batches, watermarks without out-of-orderness: "a" at 3 after 12 has come is late
BATCHES = [
    pa.record_batch({"word": ["a", "b", "a", "c"], "ts": [1, 2, 4, 12]}),
    pa.record_batch({"word": ["a", "b", "c", "c", "a"], "ts": [3, 13, 14, 15, 27]}),
]
SCHEMA = pa.schema([
    ("key", pa.string()), ("value", pa.int64()), ("ts", pa.float64()), ("window_start", pa.int64()),
    ("window_end", pa.int64()),
])  # fmt: skip
# per window (start, end): its results as (key, count), keys in the order they first came
EXPECTED = {(0, 10): [("a", 2), ("b", 1)], (10, 20): [("c", 3), ("b", 1)], (20, 30): [("a", 1)]}


class ColumnsSink(sl.Sink):
    """Takes columnar batches only (records would fail the job) and keeps them; its result is their records."""

    takes_columns = True

    def __init__(self) -> None:
        self.batches: list[ColumnBatch] = []  # in this process (a job of one process)

    def open(self, context: sl.SinkContext) -> sl.ElementWriter:
        return _ColumnsWriter(self.batches)


class _ColumnsWriter(sl.ElementWriter):
    def __init__(self, batches: list[ColumnBatch]) -> None:
        self.batches = batches
        self.elements: Batch = []

    def write(self, batch: Batch) -> None:
        raise AssertionError("a columnar window's results reached a columnar sink as records")

    def write_columns(self, batch: ColumnBatch) -> None:
        assert (batch.window_start, batch.window_end) == ("window_start", "window_end")
        self.batches.append(batch)
        self.elements.extend(batch.elements())

    def result(self) -> list[Record]:
        return records_of(self.elements)


def counted(sink: sl.Sink, parallelism: int = 1, batches: list[pa.RecordBatch] = BATCHES) -> sl.Topology:
    """Words -> a windowed count (SAME_KEY) -> ``sink``; late words to a CollectSink."""
    topology = sl.Topology("windowed-count")
    source = sl.ColumnarSource(batches, key="word", ts="ts")
    words = topology.add_source("words", source, watermarks=sl.Watermarks(out_of_orderness=0))
    window = sl.TimeWindow(10, time="event")
    counts = topology.aggregate("count", "count", window=window, parallelism=parallelism)
    counts.set_input(words, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sink).set_input(counts)
    topology.add_sink("late", sl.CollectSink()).set_input(counts, out_port=sl.LATE)
    return topology


def per_window(records: list[Record]) -> dict[tuple[Any, Any], list[tuple[Any, Any]]]:
    """Results by window, each checked to be an on-time window record stamped with the window's last tick."""
    windows: dict[tuple[Any, Any], list[tuple[Any, Any]]] = {}
    for record in records:
        assert type(record) is sl.WindowRecord
        assert record.window is not None
        start, end = record.window
        assert (record.ts, record.firing) == (end - 0.001, "on_time")
        windows.setdefault((start, end), []).append((record.key, record.value))
    return windows


def test_a_fired_window_leaves_as_one_arrow_batch_with_its_bounds() -> None:
    """In one process, each fired window reaches a columnar sink as one Arrow batch: keys, counts, the result
    time, int bounds (int timestamps), keys in the order they came."""
    sink = ColumnsSink()
    result = sl.run(counted(sink))
    assert [batch.data.schema for batch in sink.batches] == [SCHEMA] * 3
    fired = {}
    for batch in sink.batches:
        columns = batch.data.to_pydict()
        [bounds] = set(zip(columns["window_start"], columns["window_end"], strict=True))
        assert set(columns["ts"]) == {bounds[1] - 0.001}
        fired[bounds] = list(zip(columns["key"], columns["value"], strict=True))
    assert fired == EXPECTED
    assert [(r.key, r.ts) for r in result.sink("late")] == [("a", 3)]
    assert result.statistics.late == 1


def test_a_record_consumer_gets_the_window_records_window_reduce_gives() -> None:
    """A non-columnar sink downstream gets the same window records as from window_reduce, made once at the edge."""
    records = sl.run(counted(sl.CollectSink())).sink("out")
    topology = sl.Topology("elements")
    items = [sl.Record(w, 1, t) for batch in BATCHES for w, t in zip(*batch.to_pydict().values(), strict=True)]
    words = topology.add_source("words", items, watermarks=sl.Watermarks(out_of_orderness=0))
    counts = topology.window_reduce("count", "count", window=sl.TimeWindow(10, time="event")).set_input(words)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    expected = sl.run(topology, batch_size=4).sink("out")  # the columnar source's batches are of 4 and 5 rows
    assert per_window(records) == EXPECTED

    def rows(found: list[Record]) -> list[tuple[Any, ...]]:
        return sorted((type(r).__name__, r.key, r.value, r.ts, r.window, r.firing) for r in found)

    assert rows(records) == rows(expected)


def test_window_batches_cross_processes_as_arrow_with_their_bounds() -> None:
    """With processes=2 (the count's two instances apart, the sink with one of them), the fired windows reach
    the columnar sink as Arrow batches with their bounds, across the ARROW transport: every window's counts."""
    words = [f"k{(i * 7) % 20}" for i in range(600)]
    stamps = [i // 10 for i in range(600)]  # in order: 10 words a second, none late
    table = pa.table({"word": words, "ts": stamps})
    expected = Counter(((ts - ts % 10, ts - ts % 10 + 10), word) for word, ts in zip(words, stamps, strict=True))
    topology = counted(ColumnsSink(), parallelism=2, batches=table.to_batches(max_chunksize=64))
    assert {place for (name, _), place in spread(topology, 2).items() if name == "count"} == {0, 1}
    result = sl.run(topology, processes=2)
    found = per_window(result.sink("out"))
    assert {(window, key): count for window, rows in found.items() for key, count in rows} == expected
    assert len(found) == 6
    assert all(len(rows) == 20 for rows in found.values())


def test_rows_held_across_a_checkpoint_and_after_it_fire_as_one_arrow_batch() -> None:
    """Rows of a window before a checkpoint (settled into it) and after the restore fire together as one batch."""

    def topology(sink: sl.Sink) -> sl.Topology:
        built = sl.Topology("restore")
        source = built.add_source("in", sl.QueueSource(), watermarks=sl.Watermarks(out_of_orderness=0))
        folded = built.aggregate("fold", "sum", window=sl.TimeWindow(10, time="event")).set_input(source)
        built.add_sink("out", sink).set_input(folded)
        return built

    store = sl.InMemoryCheckpointStore()

    async def crash_after_checkpoint() -> None:
        async with sl.start(topology(ColumnsSink()), checkpoint_store=store) as job:
            for key, value, ts in [("a", 1, 11), ("b", 2, 12), ("a", 3, 13)]:
                await job.send("in", key, value, ts)
            await job.checkpoint()
            await job.send("in", "a", 100, 14)  # after the checkpoint: lost with the crash
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(crash_after_checkpoint())
    sink = ColumnsSink()

    async def resume() -> None:
        async with sl.start(topology(sink), checkpoint_store=store) as job:
            for key, value, ts in [("c", 5, 15), ("a", 10, 16), ("b", 7, 25)]:
                await job.send("in", key, value, ts)
            await job.close_source("in")
            await job.wait()

    asyncio.run(resume())
    assert [batch.data.to_pydict() for batch in sink.batches] == [
        {"key": ["a", "b", "c"], "value": [14, 2, 5], "ts": [19.999] * 3, "window_start": [10] * 3,
         "window_end": [20] * 3},
        {"key": ["b"], "value": [7], "ts": [29.999], "window_start": [20], "window_end": [30]},
    ]  # fmt: skip


def test_held_rows_split_by_key_fire_in_their_parts_as_unsplit() -> None:
    """A snapshot of held rows split by key (a rescale) restores into parts whose windows fire the same results."""
    task = AggregateTask("count", None, None, "batch")
    window = sl.TimeWindow(10, time="event")
    whole = aggregate_window(window, task)
    for data in BATCHES:
        whole.add_columns(ColumnBatch(data, "word", None, "ts"), now=0.0)
    snapshot = unpackb(packb(whole.snapshot()))
    parts = []
    for piece in split_window_snapshot(window, snapshot, lambda key: int(key == "a"), 2, 0):
        part = aggregate_window(window, task)
        part.restore(piece)
        parts.append(part)
    fired = [[e for w in part.close_all() for e in w.columns.elements()] for part in parts]
    assert ({e[0] for e in fired[0]}, {e[0] for e in fired[1]}) == ({"b", "c"}, {"a"})
    assert sorted(fired[0] + fired[1]) == sorted(e for w in whole.close_all() for e in w.columns.elements())
    assert sorted((e[4], e[0], e[1]) for e in fired[0] + fired[1]) == [
        ((0, 10), "a", 3),
        ((0, 10), "b", 1),
        ((10, 20), "b", 1),
        ((10, 20), "c", 3),
        ((20, 30), "a", 1),
    ]  # no watermark here: "a" at 3 is in its window


def test_batches_of_other_schemas_in_one_window_are_merged_per_key() -> None:
    """A window taking an int field, then a float one, then dictionary-encoded keys: one result per key."""
    batches = [
        pa.record_batch({"k": ["a", "b"], "n": [1, 2], "ts": [1, 2]}),
        pa.record_batch({"k": ["a", "c"], "n": [0.5, 4.0], "ts": [3, 4]}),
        pa.record_batch({"k": pa.array(["c", "b"]).dictionary_encode(), "n": [1.0, 1.0], "ts": [5, 6]}),
        pa.record_batch({"k": pa.array(["a"]).dictionary_encode(), "n": [2.0], "ts": [7]}),
    ]
    topology = sl.Topology("schemas")
    rows = topology.add_source("in", sl.ColumnarSource(batches, key="k", value="n", ts="ts"))
    sums = topology.aggregate("sum", "sum", window=sl.TimeWindow(10, time="event")).set_input(rows)
    sink = ColumnsSink()
    topology.add_sink("out", sink).set_input(sums)
    sl.run(topology)
    [batch] = sink.batches
    assert batch.data.to_pydict() == {
        "key": ["a", "b", "c"], "value": [3.5, 3.0, 5.0], "ts": [9.999] * 3, "window_start": [0] * 3,
        "window_end": [10] * 3,
    }  # fmt: skip


def test_a_batch_a_window_cannot_aggregate_fails_as_it_arrives() -> None:
    """Rows are aggregated only when their window fires, yet a sum of strings fails on its batch, named."""
    topology = sl.Topology("bad")
    table = pa.table({"k": ["a"], "n": ["x"], "ts": [1]})
    rows = topology.add_source("in", sl.ColumnarSource(table, key="k", value="n", ts="ts"))
    sums = topology.aggregate("sum", "sum", window=sl.TimeWindow(10, time="event")).set_input(rows)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    with pytest.raises(
        sl.TaskError,
        match=r"^task 'sum' instance 0 failed on a columnar batch of 1 rows starting with key 'a': "
        r"ArrowNotImplementedError: Function 'hash_sum' has no kernel matching input types \(string, uint32\)$",
    ):
        sl.run(topology)


async def rescaled_counts(rescales: dict[int, int], columnar: bool) -> list[tuple[Any, Any, Any]]:
    """13 keys counted in 10 s windows (aggregate or window_reduce), the count rescaled live at ``rescales``."""
    topology = sl.Topology("rescaled")
    source = topology.add_source("in", sl.QueueSource(), watermarks=sl.Watermarks(out_of_orderness=0))
    task = topology.aggregate if columnar else topology.window_reduce
    counts = task("count", "count", window=sl.TimeWindow(10, time="event"), parallelism=2)
    counts.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", ColumnsSink() if columnar else sl.CollectSink()).set_input(counts)
    async with sl.start(topology) as job:
        for i in range(3000):
            if i in rescales:
                await job.rescale("count", rescales[i])
            await job.send("in", f"k{i % 13}", 1, ts=i / 50)
    return sorted((r.key, r.window, r.value) for r in (await job.wait()).sink("out"))


async def test_live_rescales_move_held_rows_with_their_keys() -> None:
    """Rescaled 2 -> 4 -> 1 -> 3 mid-window, every window's Arrow results equal window_reduce's without change."""
    expected = await rescaled_counts({}, columnar=False)
    assert len(expected) == 13 * 6
    assert await rescaled_counts({700: 4, 1500: 1, 2200: 3}, columnar=True) == expected


@pytest.mark.parametrize(
    ("how", "values", "value_type"),
    [("count", [2, 1], pa.int64()), ("sum", [12, 6], pa.int64()), ("min", [5, 6], pa.int32()),
     ("max", [7, 6], pa.int32())],
)  # fmt: skip
def test_a_fired_window_keeps_the_arrow_types_of_its_keys_and_values(
    how: str, values: list[int], value_type: pa.DataType
) -> None:
    """Aggregated in Arrow from end to end: int32 keys stay int32, a min or max keeps the field's int32 (a
    count and a sum are int64, as Arrow gives them)."""
    table = pa.table({"k": pa.array([1, 2, 1], pa.int32()), "n": pa.array([5, 6, 7], pa.int32()), "ts": [1, 2, 3]})
    topology = sl.Topology("types")
    rows = topology.add_source("in", sl.ColumnarSource(table, key="k", value="n", ts="ts"))
    folded = topology.aggregate("fold", how, window=sl.TimeWindow(10, time="event")).set_input(rows)  # type: ignore[arg-type]
    sink = ColumnsSink()
    topology.add_sink("out", sink).set_input(folded)
    sl.run(topology)
    [batch] = sink.batches
    assert batch.data.schema.field("key").type == pa.int32()
    assert batch.data.schema.field("value").type == value_type
    assert batch.data.to_pydict() == {
        "key": [1, 2], "value": values, "ts": [9.999] * 2, "window_start": [0] * 2, "window_end": [10] * 2
    }  # fmt: skip
