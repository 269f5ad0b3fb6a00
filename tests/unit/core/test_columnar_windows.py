"""aggregate on a tumbling event-time window: what window_reduce gives on the same data, record for record."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pyarrow as pa
import pytest

import streamlet as sl
from streamlet.core.model.columnar import AggregateTask
from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.windows.columnar import aggregate_window

ROWS = 2_000
BATCH = 128


def stream(seed: int, whole_seconds: bool) -> pa.Table:
    """Keys, int values and timestamps mostly in order, with a few far behind (late under a small bound)."""
    rng = random.Random(seed)
    keys, values, stamps = [], [], []
    for i in range(ROWS):
        ts = i // 3 if whole_seconds else round(i * 0.037, 3)
        if rng.random() < 0.05:
            ts -= rng.choice([1, 7, 40]) if whole_seconds else rng.choice([0.3, 2.5, 9.1])
        keys.append(f"k{rng.randrange(12)}")
        values.append(rng.randrange(-50, 100))
        stamps.append(ts)
    return pa.table({"key": keys, "n": values, "ts": stamps})


def windowed(how: str, window: sl.TimeWindow, table: pa.Table, *, columnar: bool, parallelism: int) -> sl.JobResult:
    """The stream through ``aggregate`` (columnar) or ``window_reduce`` on ``window``, results and late rows."""
    topology = sl.Topology("windowed")
    source = sl.ColumnarSource(table.to_batches(max_chunksize=BATCH), key="key", value="n", ts="ts")
    rows = topology.add_source("in", source, watermarks=sl.Watermarks(out_of_orderness=2))
    if columnar:
        folded = topology.aggregate("fold", how, window=window, parallelism=parallelism)  # type: ignore[arg-type]
    else:
        folded = topology.window_reduce("fold", how, window=window, parallelism=parallelism)  # type: ignore[arg-type]
    folded.set_input(rows, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(folded)
    topology.add_sink("late", sl.CollectSink()).set_input(folded, out_port=sl.LATE)
    return sl.run(topology)


def results(result: sl.JobResult) -> list[tuple[Any, ...]]:
    """Every result with its bounds (and their types: int bounds for int timestamps), sorted."""
    return sorted(
        (r.key, r.value, r.ts, r.window_start, r.window_end, type(r.window_start).__name__) for r in result.sink("out")
    )


@pytest.mark.parametrize("how", ["count", "sum", "min", "max"])
@pytest.mark.parametrize("whole_seconds", [True, False], ids=["int-ts", "float-ts"])
def test_a_windowed_aggregate_gives_what_window_reduce_gives(how: str, whole_seconds: bool) -> None:
    """Over two instances, every window's results, bounds, stamps, late rows and late count are window_reduce's."""
    table = stream(5, whole_seconds)
    window = sl.TimeWindow(5 if whole_seconds else 0.5, time="event")
    columnar = windowed(how, window, table, columnar=True, parallelism=2)
    elements = windowed(how, window, table, columnar=False, parallelism=2)
    assert results(columnar) == results(elements)
    assert len(results(columnar)) > 100
    assert sorted((r.key, r.value, r.ts) for r in columnar.sink("late")) == sorted(
        (r.key, r.value, r.ts) for r in elements.sink("late")
    )
    assert columnar.statistics.late == elements.statistics.late > 0


def test_a_windowed_mean_is_the_windowed_sum_over_the_count() -> None:
    """mean per window and key is window_reduce's sum divided by its count, with the same bounds and stamps."""
    table = stream(11, whole_seconds=False)
    window = sl.TimeWindow(0.5, time="event")
    sums = {
        (r.key, r.window_start): r.value
        for r in windowed("sum", window, table, columnar=False, parallelism=1).sink("out")
    }
    counts = windowed("count", window, table, columnar=False, parallelism=1).sink("out")
    expected = sorted((r.key, sums[r.key, r.window_start] / r.value, r.ts, r.window_start) for r in counts)
    means = windowed("mean", window, table, columnar=True, parallelism=1).sink("out")
    assert sorted((r.key, r.value, r.ts, r.window_start) for r in means) == expected


def test_a_windowed_aggregate_fed_by_records_matches_window_reduce() -> None:
    """Fed by a record source (fields key, value, ts), the windowed count is window_reduce's, late records too."""
    stamps = [1.0, 2.0, 9.0, 12.0, 25.0, 3.0, 26.0, 14.0]
    items = [sl.Record(key, 1, ts) for key, ts in zip("xyxxyxyx", stamps, strict=True)]

    def run(columnar: bool) -> tuple[list[Any], list[Any], int]:
        topology = sl.Topology("records")
        source = topology.add_source("in", items, watermarks=sl.Watermarks(out_of_orderness=0))
        window = sl.TimeWindow(10, time="event")
        task = topology.aggregate if columnar else topology.window_reduce
        folded = task("fold", "count", window=window).set_input(source)
        topology.add_sink("out", sl.CollectSink()).set_input(folded)
        topology.add_sink("late", sl.CollectSink()).set_input(folded, out_port=sl.LATE)
        result = sl.run(topology, batch_size=2)
        late = [(r.key, r.value, r.ts) for r in result.sink("late")]
        return results(result), late, result.statistics.late

    assert run(columnar=True) == run(columnar=False)
    assert run(columnar=True)[1:] == ([("x", 1, 3.0), ("x", 1, 14.0)], 2)


def test_window_state_snapshots_as_msgpack_and_restores() -> None:
    """Open windows (mean's sum and count pairs) pack as msgpack; a restored logic fires what the first would."""
    task = AggregateTask("mean", None, None, "batch")
    window = sl.TimeWindow(10, time="event")
    first, second = aggregate_window(window, task), aggregate_window(window, task)
    batch = ColumnBatch(pa.record_batch({"k": ["a", "b", "a"], "n": [1, 4, 2], "ts": [1, 12, 3]}), "k", "n", "ts")
    first.add_columns(batch, now=0.0)
    second.restore(unpackb(packb(first.snapshot())))
    fired = [[(w.start, w.end, w.columns.elements()) for w in logic.advance(30.0)] for logic in (first, second)]
    assert fired[0] == fired[1] == [
        (0, 10, [("a", 1.5, 9.999, 0, (0, 10), "on_time")]), (10, 20, [("b", 4.0, 19.999, 0, (10, 20), "on_time")])
    ]  # fmt: skip


def test_open_windows_survive_a_checkpoint_and_restore() -> None:
    """Windows folded before a checkpoint are part of it: the restored job fires them exactly as window_reduce
    (the windows [0, 10) fired before the checkpoint are in the CollectSink's part of it, and come back)."""

    def topology(columnar: bool) -> sl.Topology:
        built = sl.Topology("restore")
        source = built.add_source("in", sl.QueueSource(), watermarks=sl.Watermarks(out_of_orderness=0))
        task = built.aggregate if columnar else built.window_reduce
        folded = task("fold", "sum", window=sl.TimeWindow(10, time="event")).set_input(source)
        built.add_sink("out", sl.CollectSink()).set_input(folded)
        return built

    def run(columnar: bool) -> list[tuple[Any, ...]]:
        store = sl.InMemoryCheckpointStore()

        async def crash_after_checkpoint() -> None:
            async with sl.start(topology(columnar), checkpoint_store=store) as job:
                for key, value, ts in [("a", 1, 1), ("b", 2, 4), ("a", 3, 11)]:
                    await job.send("in", key, value, ts)
                await job.checkpoint()
                await job.send("in", "a", 100, 12)  # after the checkpoint: lost with the crash
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            asyncio.run(crash_after_checkpoint())

        async def resume() -> list[tuple[Any, ...]]:
            async with sl.start(topology(columnar), checkpoint_store=store) as job:
                await job.send("in", "a", 10, 15)
                await job.send("in", "b", 5, 3)  # behind the restored watermark: late
                await job.close_source("in")
                result = await job.wait()
            return [*results(result), ("late", result.statistics.late)]

        return asyncio.run(resume())

    fired = [("a", 1, 9.999, 0, 10, "int"), ("a", 13, 19.999, 10, 20, "int"), ("b", 2, 9.999, 0, 10, "int")]
    assert run(columnar=True) == run(columnar=False) == [*fired, ("late", 1)]


@pytest.mark.parametrize(
    "window",
    [
        sl.TimeWindow(10, time="event", slide=5),
        sl.TimeWindow(10, time="event", allowed_lateness=5),
        sl.TimeWindow(10, time="event", early_firing=1),
        sl.TimeWindow(10, time="event", idle_timeout=1),
        sl.TimeWindow(10, time="event", offset=5),
        sl.TimeWindow(10, time="event", missing_ts="fail"),
        sl.TimeWindow(10, time="event", on_late=print),
        sl.TimeWindow(10),
        sl.CountWindow(2),
        sl.SessionWindow(5, time="event"),
    ],
    ids=["slide", "lateness", "early", "idle", "offset", "missing_ts", "on_late", "processing", "count", "session"],
)
def test_other_windows_are_refused_naming_the_task(window: sl.WindowSpec) -> None:
    """aggregate takes only a tumbling event-time TimeWindow without options, refused when built."""
    topology = sl.Topology("bad")
    with pytest.raises(
        sl.TopologyError, match=r"^task 'fold': a columnar aggregate runs only on a tumbling event-time window, "
    ):
        topology.aggregate("fold", "count", window=window)


def test_another_window_from_a_windowed_source_is_refused_by_validation() -> None:
    """A windowed source gives aggregate its window: validation refuses one it does not run on, naming the task."""
    topology = sl.Topology("bad")
    rows = topology.add_source("in", sl.ColumnarSource(pa.table({"k": ["a"]}), key="k"), window=sl.CountWindow(2))
    topology.aggregate("fold", "count").set_input(rows)
    with pytest.raises(
        sl.TopologyError,
        match=r"^task 'fold': a columnar aggregate runs only on a tumbling event-time window, TimeWindow\(size, "
        r"time='event'\) \(no slide, early_firing, allowed_lateness, idle_timeout, offset, on_late or "
        r"missing_ts='fail'\), not CountWindow\(size=2",
    ):
        topology.validate()


def test_a_windowed_aggregate_takes_no_emit_end() -> None:
    """emit="end" means nothing on a window (each window emits when it fires): refused when built."""
    with pytest.raises(
        sl.TopologyError, match=r"^task 'fold': aggregate on a window emits when each window fires: no emit='end'$"
    ):
        sl.Topology("bad").aggregate("fold", "sum", emit="end", window=sl.TimeWindow(10, time="event"))


@pytest.mark.parametrize(
    ("how", "expected"),
    [("sum", [("a", 4), ("b", None)]), ("max", [("a", 3), ("b", None)]), ("mean", [("a", 2.0), ("b", None)])],
)
def test_a_windowed_aggregate_skips_null_values(how: str, expected: list[tuple[str, Any]]) -> None:
    """In a window as without one: nulls skipped, mean over valid values, a key with only nulls gives None."""
    schema = pa.schema([("key", pa.string()), ("n", pa.int64()), ("ts", pa.float64())])
    table = pa.table({"key": ["a", "a", "b", "a", "b"], "n": [1, None, None, 3, None], "ts": [0.0] * 5}, schema=schema)
    result = windowed(how, sl.TimeWindow(10, time="event"), table, columnar=True, parallelism=1)
    assert sorted((r.key, r.value) for r in result.sink("out")) == expected


def test_a_window_in_whole_seconds_rounds_to_them_and_stamps_its_last_second() -> None:
    """time_unit=1: a timestamp is its nearest second (9.6 is in [10, 20)), results carry the window's last
    second, as window_reduce gives them."""
    table = pa.table({"key": ["a", "a", "b"], "n": [1, 2, 4], "ts": [4.4, 9.6, 12.0]})
    window = sl.TimeWindow(10, time="event", time_unit=1)
    columnar = windowed("sum", window, table, columnar=True, parallelism=1)
    assert results(columnar) == results(windowed("sum", window, table, columnar=False, parallelism=1))
    assert results(columnar) == [
        ("a", 1, 9.0, 0.0, 10.0, "float"), ("a", 2, 19.0, 10.0, 20.0, "float"), ("b", 4, 19.0, 10.0, 20.0, "float")
    ]  # fmt: skip


@pytest.mark.parametrize(("how", "expected"), [("mean", [1.0, 2.0, 4.0]), ("sum", [1, 2, 8])])
def test_a_window_of_int_and_string_keys_emits_its_results_as_records(how: str, expected: list[Any]) -> None:
    """Keys of two types in one window fit no Arrow column: its results leave as window_reduce's records
    (a mean as a mean, not its sum and count), keys in the order they first came."""
    batches = [
        pa.record_batch({"k": [1, 2], "n": [1, 2], "ts": [1, 2]}),
        pa.record_batch({"k": ["a", "a"], "n": [3, 5], "ts": [3, 4]}),
    ]
    topology = sl.Topology("mixed")
    rows = topology.add_source("in", sl.ColumnarSource(batches, key="k", value="n", ts="ts"))
    folded = topology.aggregate("fold", how, window=sl.TimeWindow(10, time="event")).set_input(rows)  # type: ignore[arg-type]
    topology.add_sink("out", sl.CollectSink()).set_input(folded)
    found = [(r.key, r.value, r.ts, r.window) for r in sl.run(topology).sink("out")]
    assert found == [(key, value, 9.999, (0, 10)) for key, value in zip([1, 2, "a"], expected, strict=True)]


def test_a_windowed_sum_past_64_bits_is_an_exact_python_int() -> None:
    """A window's sum past 2^64 comes out as a Python int (no Decimal), exact, beside a small one."""
    table = pa.table({"key": ["a", "a", "b"], "n": pa.array([2**63, 2**64 - 1, 5], pa.uint64()), "ts": [1, 2, 3]})
    result = windowed("sum", sl.TimeWindow(10, time="event"), table, columnar=True, parallelism=1)
    found = [(r.key, r.value, type(r.value)) for r in result.sink("out")]
    assert found == [("a", 2**63 + 2**64 - 1, int), ("b", 5, int)]
