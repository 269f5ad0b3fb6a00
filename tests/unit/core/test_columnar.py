"""The columnar path: Arrow batches through where/aggregate give exactly what the element path and plain Python give."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import streamlet as sl
from streamlet.core.model.columns import ColumnBatch, import_pyarrow
from streamlet.core.model.segments import SegmentTable
from streamlet.core.runtime.routing import KeyedRoute
from tests.conftest import as_listed

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

ROWS = 1_000
BATCH = 100


def words(seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [f"w{rng.randrange(60)}" for _ in range(ROWS)]


def readings(seed: int = 3) -> list[tuple[str, int, float]]:
    """(sensor, celsius, ts): integer readings, so float sums are exact in any order."""
    rng = random.Random(seed)
    return [(f"s{rng.randrange(9)}", rng.randrange(-20, 40), float(i)) for i in range(ROWS)]


def reading_table() -> pa.Table:
    sensors, celsius, stamps = zip(*readings(), strict=True)
    return pa.table({"sensor": list(sensors), "celsius": list(celsius), "ts": list(stamps)})


def batches_of(table: pa.Table) -> list[pa.RecordBatch]:
    return table.to_batches(max_chunksize=BATCH)


def collect(topology: sl.Topology, sink: str = "out", **options: Any) -> list[tuple[Any, Any, Any]]:
    return [(r.key, r.value, r.ts) for r in sl.run(topology, **options).sink(sink)]


def columnar_wordcount(emit: str, parallelism: int) -> sl.Topology:
    topology = sl.Topology("columnar")
    source = sl.ColumnarSource(batches_of(pa.table({"word": words()})), key="word")
    rows = topology.add_source("words", source)
    counts = topology.aggregate("count", "count", emit=emit, parallelism=parallelism)  # type: ignore[arg-type]
    counts.set_input(rows, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    return topology


def test_count_at_end_matches_plain_python_over_two_instances() -> None:
    """emit="end" over two SAME_KEY instances gives every word's count once, as a Counter does."""
    result = collect(columnar_wordcount("end", parallelism=2))
    assert sorted((key, value) for key, value, _ in result) == sorted(Counter(words()).items())
    assert all(ts is None for _, _, ts in result)


def test_count_per_batch_matches_the_element_reduce_exactly() -> None:
    """emit="batch" emits what reduce emits on the same batches: same keys, values and order."""
    element = sl.Topology("elements")
    lines = element.add_source("words", [(word, 1) for word in words()])
    counts = element.reduce("count", lambda a, b: a + b).set_input(lines, partitioning=sl.SAME_KEY)
    element.add_sink("out", sl.CollectSink()).set_input(counts)
    expected = [(key, value) for key, value, _ in collect(element, batch_size=BATCH)]
    columnar = [(key, value) for key, value, _ in collect(columnar_wordcount("batch", 1), batch_size=BATCH)]
    assert columnar == expected
    assert len(columnar) > len(set(words()))  # one row per key per batch, not only totals


def test_where_then_sum_matches_filter_then_reduce_including_ts() -> None:
    """where + aggregate("sum") ends each key where filter + reduce does: the same sum, the ts of its last row."""
    columnar = sl.Topology("columnar")
    rows = columnar.add_source("in", sl.ColumnarSource(batches_of(reading_table()), key="sensor", ts="ts"))
    warm = columnar.where("warm", pc.field("celsius") > 10).set_input(rows)
    sums = columnar.aggregate("sum", "sum", field="celsius").set_input(warm, partitioning=sl.SAME_KEY)
    columnar.add_sink("out", sl.CollectSink()).set_input(sums)

    element = sl.Topology("elements")
    source = element.add_source("in", [sl.Record(s, c, ts) for s, c, ts in readings()])
    kept = element.filter("warm", lambda r: r.value > 10).set_input(source)
    reduced = element.reduce("sum", lambda a, b: a + b).set_input(kept, partitioning=sl.SAME_KEY)
    element.add_sink("out", sl.CollectSink()).set_input(reduced)
    # the filter's partial batches wait for more on the element path, so compare where the keys end up
    last = {key: (value, ts) for key, value, ts in collect(columnar, batch_size=BATCH)}
    assert last == {key: (value, ts) for key, value, ts in collect(element, batch_size=BATCH)}
    assert last == {
        sensor: (
            sum(c for s, c, _ in readings() if s == sensor and c > 10),
            max(t for s, c, t in readings() if s == sensor and c > 10),
        )
        for sensor, _, _ in readings()
    }


@pytest.mark.parametrize("how", ["count", "sum", "min", "max", "mean"])
def test_every_aggregate_matches_plain_python(how: str) -> None:
    """Each built-in aggregate's final value per key is the plain-Python one, over two instances."""
    topology = sl.Topology("how")
    rows = topology.add_source("in", sl.ColumnarSource(reading_table(), key="sensor", value="celsius"))
    folded = topology.aggregate("agg", how, emit="end", parallelism=2)  # type: ignore[arg-type]
    folded.set_input(rows, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(folded)
    by_sensor: dict[str, list[int]] = {}
    for sensor, celsius, _ in readings():
        by_sensor.setdefault(sensor, []).append(celsius)
    plain = {"count": len, "sum": sum, "min": min, "max": max, "mean": lambda v: sum(v) / len(v)}[how]
    assert dict((key, value) for key, value, _ in collect(topology)) == {s: plain(v) for s, v in by_sensor.items()}


def test_a_user_task_downstream_sees_records() -> None:
    """A user Task after an aggregate reads Record objects, made at the boundary."""
    seen: list[str] = []

    class Describe(sl.Task):
        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            for record in inputs.get():
                seen.append(type(record).__name__)
                outputs.emit(record.key, f"{record.key}={record.value}")

    topology = columnar_wordcount("end", parallelism=2)
    described = topology.add_task("describe", Describe).set_input("count")
    topology.add_sink("described", sl.CollectSink()).set_input(described)
    got = sorted(value for _, value, _ in collect(topology, "described"))
    assert got == sorted(f"{word}={count}" for word, count in Counter(words()).items())
    assert set(seen) == {"Record"}


def test_columnar_tasks_fed_by_elements_see_key_value_ts_fields() -> None:
    """Fed by an element stream, where and aggregate read the fields key, value and ts."""
    topology = sl.Topology("fed")
    source = topology.add_source("in", [sl.Record("a", 1, 1.0), sl.Record("b", 5, 2.0), sl.Record("a", 7, 3.0)])
    big = topology.where("big", pc.field("value") > 2).set_input(source)
    sums = topology.aggregate("sum", "sum").set_input(big)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    assert collect(topology) == [("b", 5, 2.0), ("a", 7, 3.0)]


def test_same_key_splits_a_columnar_batch_where_its_elements_go() -> None:
    """A keyed route splits columnar batches by the segment table: each row reaches its key's instance,
    for new keys, keys seen before (the Arrow cache), a null key, and after the table changes."""
    channels: list[Any] = [object() for _ in range(3)]
    table = SegmentTable.contiguous(128, 3)
    route = KeyedRoute(channels, table)
    route.columnar = True

    def placed(keys: list[Any]) -> list[tuple[int, Any]]:
        route.columns.clear()
        route.add_columns(ColumnBatch(pa.record_batch({"k": keys, "n": list(range(len(keys)))}), key="k"))
        found = [(index, key) for index, part in route.columns for key in part.data.column("k").to_pylist()]
        assert sorted(map(repr, (key for _, key in found))) == sorted(map(repr, keys))
        return found

    first = [f"user{i}" for i in range(200)]
    for keys in (first, first[::-1], [*first[:50], "new1", None, "new2"], first):
        assert all(index == table.owner(key) for index, key in placed(keys))
    assert {index for index, _ in placed(first)} == {0, 1, 2}
    moved = table.moved_to(dict.fromkeys(range(128), 1))
    route.retarget(channels, moved)
    route.columnar = True
    assert {index for index, _ in placed(first)} == {1}


def test_same_key_routes_dictionary_encoded_keys_like_plain_ones() -> None:
    """A dictionary-encoded key column (Parquet, pandas categoricals) goes row for row where the plain one goes,
    mixed with plain batches of the same keys, and counts over two instances as plain Python does."""
    channels: list[Any] = [object() for _ in range(3)]
    route = KeyedRoute(channels, SegmentTable.contiguous(128, 3))
    route.columnar = True
    keys = [f"w{i % 7}" if i % 11 else None for i in range(200)]

    def placed(column: pa.Array) -> list[tuple[int, Any]]:
        route.columns.clear()
        route.add_columns(ColumnBatch(pa.record_batch({"k": column}), key="k"))
        return sorted((index, repr(key)) for index, part in route.columns for key in part.data.column("k").to_pylist())

    plain = placed(pa.array(keys))
    assert placed(pa.array(keys).dictionary_encode()) == plain
    assert placed(pa.array(keys)) == plain

    table = pa.table({"w": pa.array(keys).dictionary_encode()})
    topology = sl.Topology("dict")
    rows = topology.add_source("in", sl.ColumnarSource(table.to_batches(max_chunksize=50), key="w"))
    counts = topology.aggregate("count", "count", emit="end", parallelism=2).set_input(rows, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    assert sorted((repr(key), value) for key, value, _ in collect(topology)) == sorted(
        (repr(key), value) for key, value in Counter(keys).items()
    )


Pairs = list[tuple[Any, Any]]


def resumed_after_a_crash(how: str, before: Pairs, lost: Pairs, after: Pairs, *, one_batch_each: bool = False) -> Pairs:
    """An ``emit="end"`` aggregate ``how`` over a queue: ``before`` sent (each its own batch with
    ``one_batch_each``), a checkpoint, ``lost`` sent, a crash; then a restart from the checkpoint, ``after``
    sent, the input closed: its results."""
    store = sl.InMemoryCheckpointStore()

    def topology() -> sl.Topology:
        built = sl.Topology("resumed")
        source = built.add_source("in", sl.QueueSource())
        totals = built.aggregate("total", how, emit="end").set_input(source)  # type: ignore[arg-type]
        built.add_sink("out", sl.CollectSink()).set_input(totals)
        return built

    async def first_run() -> None:
        async with sl.start(topology(), checkpoint_store=store) as job:
            for key, value in before:
                await job.send("in", key, value)
                if one_batch_each:
                    await job.settle()
            await job.checkpoint()
            for key, value in lost:
                await job.send("in", key, value)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(first_run())

    async def second_run() -> Pairs:
        async with sl.start(topology(), checkpoint_store=store) as job:
            for key, value in after:
                await job.send("in", key, value)
            await job.close_source("in")
            result = await job.wait()
        return [(r.key, r.value) for r in result.sink("out")]

    return asyncio.run(second_run())


def test_aggregate_state_checkpoints_and_restores(each_state_backend: str) -> None:
    """The running sums and means are keyed state: a restart from a checkpoint continues them exactly (what
    came after the checkpoint is lost with the crash)."""
    resumed = resumed_after_a_crash("mean", [("a", 1), ("b", 4), ("a", 2)], [("a", 100)], [("a", 6)])
    assert as_listed(resumed, each_state_backend) == [("a", 3.0), ("b", 4.0)]


def test_a_where_on_a_missing_field_names_the_task_and_port() -> None:
    """An expression over a field the batches lack stops the job with a TopologyError naming node and port."""
    topology = sl.Topology("bad")
    rows = topology.add_source("in", sl.ColumnarSource(pa.table({"word": ["a"]}), key="word"))
    kept = topology.where("keep", pc.field("count") > 1).set_input(rows)
    topology.add_sink("out", sl.CollectSink()).set_input(kept)
    with pytest.raises(
        sl.TopologyError,
        match=r"^task 'keep' input port 0: the expression \(count > 1\) names a field the batch has not "
        r"\(fields: word\)$",
    ):
        sl.run(topology)


def test_an_aggregate_of_a_missing_field_names_the_task_and_port() -> None:
    """aggregate(field=...) of a column the batches lack names the task, port and fields."""
    topology = sl.Topology("bad")
    rows = topology.add_source("in", sl.ColumnarSource(pa.table({"word": ["a"]}), key="word"))
    sums = topology.aggregate("sum", "sum", field="n").set_input(rows)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    with pytest.raises(
        sl.TopologyError,
        match=r"^task 'sum' input port 0: aggregate 'sum' of field='n', which is not a field of the batch "
        r"\(fields: word\)$",
    ):
        sl.run(topology)


def test_a_columnar_task_fed_by_elements_names_the_task_and_port_of_a_missing_field() -> None:
    """Fed by elements (fields key, value, ts), a missing field names the task and port as on Arrow batches:
    it is the topology's mistake, not a record's (and a columnar task takes no other policy than fail)."""
    topology = sl.Topology("bad")
    rows = topology.add_source("in", [("a", 1)])
    kept = topology.where("keep", pc.field("nope") > 1).set_input(rows)
    topology.add_sink("out", sl.CollectSink()).set_input(kept)
    with pytest.raises(
        sl.FieldError,
        match=r"^task 'keep' input port 0: the expression \(nope > 1\) names a field the batch has not "
        r"\(fields: key, value, ts\)$",
    ):
        sl.run(topology)


def test_a_source_key_that_is_not_a_column_names_the_source() -> None:
    """ColumnarSource(key=...) naming no column stops the job naming the source, its port and the fields."""
    topology = sl.Topology("bad")
    rows = topology.add_source("in", sl.ColumnarSource(pa.table({"word": ["a"]}), key="words"))
    topology.add_sink("out", sl.CollectSink()).set_input(rows)
    with pytest.raises(
        sl.TopologyError, match=r"^source 'in' output port 0: key='words' is not a column of the data \(fields: word\)$"
    ):
        sl.run(topology)


def test_building_checks_how_emit_and_expression() -> None:
    """Wrong arguments to aggregate and where are refused when the topology is built."""
    topology = sl.Topology("bad")
    with pytest.raises(
        sl.TopologyError, match=r"^task 'a': how must be one of \('count', 'sum', 'min', 'max', 'mean'\), got 'median'$"
    ):
        topology.aggregate("a", "median")  # type: ignore[arg-type]
    with pytest.raises(sl.TopologyError, match=r"^task 'a': emit must be 'batch' or 'end', got 'record'$"):
        topology.aggregate("a", "sum", emit="record")  # type: ignore[arg-type]
    with pytest.raises(sl.TopologyError, match=r"^task 'w': where takes a pyarrow.compute expression"):
        topology.where("w", lambda r: True)
    with pytest.raises(
        sl.TopologyError, match=r"^task 'a': aggregate takes no state_ttl \(its running values last the whole job\)$"
    ):
        topology.aggregate("a", "sum", state_ttl=10)


def test_importing_streamlet_does_not_import_pyarrow() -> None:
    """pyarrow is loaded by the first columnar batch, never by ``import streamlet``."""
    code = "import sys, streamlet; print('pyarrow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_missing_pyarrow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one import of pyarrow names who needs it and the extra that brings it (a connector passes its own)."""
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    message = r"^the columnar path needs pyarrow, which is not installed: pip install 'streamlet\[columnar\]'$"
    with pytest.raises(sl.TopologyError, match=message):
        import_pyarrow()
    with pytest.raises(sl.ConnectorError, match=r"^SparkSink needs pyarrow, .*'streamlet\[spark\]'$"):
        import_pyarrow("SparkSink", "spark", sl.ConnectorError)


def test_a_where_on_a_window_is_refused() -> None:
    """A where given a window (by a windowed source) is refused when the topology is validated."""
    topology = sl.Topology("bad")
    rows = topology.add_source("in", sl.ColumnarSource(pa.table({"n": [1]}), key="n"), window=sl.CountWindow(2))
    topology.where("keep", pc.field("n") > 0).set_input(rows)
    with pytest.raises(
        sl.TopologyError, match=r"^task 'keep': columnar tasks other than aggregate do not run on windows$"
    ):
        topology.validate()


def test_a_columnar_task_inside_a_cycle_is_refused() -> None:
    """A where feeding itself back is refused: columnar batches carry no iteration count."""
    topology = sl.Topology("bad")
    rows = topology.add_source("in", sl.ColumnarSource(pa.table({"n": [1]}), key="n"))
    again = topology.where("again", pc.field("n") > 0).set_input(rows)
    again.set_input(again, in_port=0)
    topology.set_max_iterations(3)
    with pytest.raises(sl.TopologyError, match=r"^task 'again': columnar nodes \(where, aggregate\) cannot be inside"):
        topology.validate()


def test_arrow_batches_are_not_routed_by_a_partition_function() -> None:
    """A partition function between two columnar nodes is refused, naming the node, port and upstream."""
    topology = sl.Topology("bad")
    rows = topology.add_source("in", sl.ColumnarSource(pa.table({"n": [1]}), key="n"))
    topology.aggregate("count", "count").set_input(rows, partitioning=lambda record, count: 0)
    with pytest.raises(
        sl.TopologyError,
        match=r"^task 'count' input port 0: the Arrow batches of source 'in' go by ROUND_ROBIN, SAME_KEY or "
        r"BROADCAST, not by a partition function or SESSION_TABLE$",
    ):
        topology.validate()


async def test_the_source_position_is_the_batches_read_and_seek_resumes_there() -> None:
    """A reader's position counts batches; a new reader seeking to it reads the next one (0: the first)."""
    batches = batches_of(reading_table())
    source = sl.ColumnarSource(batches, key="sensor")

    def reader() -> Any:
        return source.open(sl.SourceContext("in", 0, 1, sl.ManualClock(), None))  # type: ignore[arg-type]

    first = reader()
    await first.read(BATCH)
    await first.read(BATCH)
    assert first.position() == 2
    resumed, fresh = reader(), reader()
    await resumed.seek(2)
    await fresh.seek(0)
    assert (await resumed.read(BATCH)).data.equals(batches[2])
    assert (await fresh.read(BATCH)).data.equals(batches[0])


NULLABLE = pa.schema([("k", pa.string()), ("x", pa.float64())])
#: Two batches: "a" has a null in the first, "b" only nulls in the first, "c" only nulls in both.
NULL_BATCHES = [
    pa.record_batch({"k": ["a", "a", "b", "c"], "x": [1.0, None, None, None]}, schema=NULLABLE),
    pa.record_batch({"k": ["a", "b", "c", "b"], "x": [3.0, 4.0, None, 2.0]}, schema=NULLABLE),
]
NULL_RESULTS = {
    "count": [("a", 3), ("b", 3), ("c", 2)],
    "sum": [("a", 4.0), ("b", 6.0), ("c", None)],
    "min": [("a", 1.0), ("b", 2.0), ("c", None)],
    "max": [("a", 3.0), ("b", 4.0), ("c", None)],
    "mean": [("a", 2.0), ("b", 3.0), ("c", None)],
}


@pytest.mark.parametrize("how", sorted(NULL_RESULTS))
@pytest.mark.parametrize("emit", ["batch", "end"])
def test_aggregates_skip_null_values(how: str, emit: str) -> None:
    """Nulls are skipped (mean counts only valid values); a key seen only with nulls is None; count counts rows."""
    topology = sl.Topology("nulls")
    rows = topology.add_source("in", sl.ColumnarSource(NULL_BATCHES, key="k"))
    folded = topology.aggregate("agg", how, field="x", emit=emit)  # type: ignore[arg-type]
    topology.add_sink("out", sl.CollectSink()).set_input(folded.set_input(rows, partitioning=sl.SAME_KEY))
    latest = {key: value for key, value, _ in collect(topology)}
    assert sorted(latest.items()) == NULL_RESULTS[how]


def test_a_generator_of_batches_cannot_feed_two_source_instances() -> None:
    """A one-shot iterator of batches is refused for parallelism 2 (each instance would read part of what the
    other skipped, losing data), as IterableSource refuses it; with one instance it is read whole."""

    def topology(parallelism: int) -> sl.Topology:
        batches = batches_of(pa.table({"w": [f"w{i % 5}" for i in range(400)]}))
        topology = sl.Topology("gen")
        rows = topology.add_source("in", sl.ColumnarSource(iter(batches), key="w"), parallelism=parallelism)
        counts = topology.aggregate("count", "count", emit="end").set_input(rows, partitioning=sl.SAME_KEY)
        topology.add_sink("out", sl.CollectSink()).set_input(counts)
        return topology

    with pytest.raises(
        sl.TopologyError,
        match=r"^source 'in': a one-shot iterator cannot feed 2 instances; pass a list or a factory-made iterable$",
    ):
        sl.run(topology(2))
    assert sorted((key, value) for key, value, _ in collect(topology(1))) == [(f"w{i}", 80) for i in range(5)]


def word_batch(*words: str) -> ColumnBatch:
    return ColumnBatch(pa.record_batch({"word": list(words)}), key="word")


def test_an_end_count_holds_batches_aside_and_folds_them_in_the_order_keys_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``emit="end"`` under ``fail``: the first batch of a schema is folded at once, the next ones wait until
    ``FOLD_ROWS`` rows do (or ``settle_state``); the totals and the order keys first came are as folding
    each batch at once gives."""
    from streamlet.core.model import columnar

    monkeypatch.setattr(columnar, "FOLD_ROWS", 4)
    task = columnar.AggregateTask("count", None, None, "end")
    task.holds_batches = True
    task.state = sl.KeyedState()
    task.execute_columns(word_batch("b", "a"), outputs=None)  # type: ignore[arg-type]  # emits nothing
    task.execute_columns(word_batch("c", "a"), outputs=None)  # type: ignore[arg-type]
    assert task.state.values == {"b": 1, "a": 1}  # the second is held aside
    task.execute_columns(word_batch("d", "b"), outputs=None)  # type: ignore[arg-type]  # 4 rows wait: folded
    assert list(task.state.values.items()) == [("b", 2), ("a", 2), ("c", 1), ("d", 1)]
    task.execute_columns(word_batch("e"), outputs=None)  # type: ignore[arg-type]
    task.settle_state()
    assert list(task.state.values.items()) == [("b", 2), ("a", 2), ("c", 1), ("d", 1), ("e", 1)]


def test_a_checkpoint_holds_the_batches_an_end_count_held_aside(each_state_backend: str) -> None:
    """Batches held aside when a checkpoint is taken are in it: a restart continues with them, exactly."""
    before = [("a", 1), ("b", 1), ("a", 1), ("c", 1)]  # one batch each: all but the first held aside
    resumed = resumed_after_a_crash("count", before, [("a", 1)], [("b", 1)], one_batch_each=True)
    assert as_listed(resumed, each_state_backend) == [("a", 2), ("b", 2), ("c", 1)]


async def test_a_rescale_moves_the_batches_an_end_count_held_aside_with_its_keys() -> None:
    """2 -> 3 -> 1 instances while batches are held aside: each key's total is exact, none lost or doubled."""
    topology = sl.Topology("held-rescale")
    source = topology.add_source("in", sl.QueueSource())
    counts = topology.aggregate("count", "count", emit="end", parallelism=2)
    counts.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    sent: Counter[str] = Counter()

    async def send(rounds: int) -> None:
        for round_ in range(rounds):
            for key in (f"k{(round_ * 7 + n) % 23}" for n in range(5)):
                await job.send("in", key, 1)
                sent[key] += 1
            await job.settle()

    async with sl.start(topology) as job:
        await send(20)
        await job.rescale("count", 3)
        await send(20)
        await job.rescale("count", 1)
        await send(20)
    result = await job.wait()
    assert Counter({r.key: r.value for r in result.sink("out")}) == sent
    assert len(result.sink("out")) == len(sent)


def test_an_end_integer_sum_past_2_to_the_63_never_wraps() -> None:
    """Sixteen batches of four 2^60 each, held aside and folded at once: the mean is exact (its sum, 2^66,
    summed as a decimal: Arrow's int64 sum over the held batches would wrap to 0); the sum itself, past any
    64-bit integer column, comes out as a record with the exact int, never a wrapped total."""

    def run(how: str) -> list[tuple[Any, Any]]:
        batches = [pa.record_batch({"k": ["a"] * 4, "v": [2**60] * 4}) for _ in range(16)]
        topology = sl.Topology("big")
        source = topology.add_source("in", sl.ColumnarSource(batches, key="k", value="v"))
        totals = topology.aggregate("total", how, emit="end").set_input(source)  # type: ignore[arg-type]
        topology.add_sink("out", sl.CollectSink()).set_input(totals)
        return [(r.key, r.value) for r in sl.run(topology).sink("out")]

    assert run("mean") == [("a", float(2**60))]
    assert run("sum") == [("a", 2**66)]


def test_an_end_sum_over_batches_with_dictionaries_of_their_own_is_exact(each_state_backend: str) -> None:
    """Dictionary-encoded keys, each batch with its own dictionary: folded batch by batch, exact."""
    rows = [["a", "b", "a"], ["c", "a"], ["d", "b", "d"], ["a"]]
    batches = [
        pa.record_batch({"k": pa.array(keys).dictionary_encode(), "v": list(range(1, len(keys) + 1))}) for keys in rows
    ]
    topology = sl.Topology("dictionaries")
    source = topology.add_source("in", sl.ColumnarSource(batches, key="k", value="v"))
    totals = topology.aggregate("total", "sum", emit="end").set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(totals)
    expected: Counter[str] = Counter()
    for keys in rows:
        for value, key in enumerate(keys, start=1):
            expected[key] += value
    got = [(r.key, r.value) for r in sl.run(topology).sink("out")]
    assert as_listed(got, each_state_backend) == as_listed(list(expected.items()), each_state_backend)


@pytest.mark.parametrize("emit", ["batch", "end"])
@pytest.mark.parametrize("window", [False, True])
def test_an_integer_sum_within_one_batch_past_2_to_the_63_is_exact(emit: str, window: bool) -> None:
    """One batch whose per-key sum passes 2^63 (Arrow's int64 sum would wrap to a wrong total without a
    word): summed exactly, per key and per window; a key whose sum stays small is untouched."""
    values = [2**62, 2**62, 2**62, -(2**62), 7, 5]
    keys = ["big", "big", "big", "big", "small", "small"]
    batch = pa.record_batch({"k": keys, "v": values, "ts": [1.0] * 6})
    topology = sl.Topology("wide")
    source = topology.add_source("in", sl.ColumnarSource([batch], key="k", value="v", ts="ts"))
    if window:
        totals = topology.aggregate("total", "mean", window=sl.TimeWindow(10, time="event"))
    else:
        totals = topology.aggregate("total", "mean", emit=emit)  # type: ignore[arg-type]
    totals.set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(totals)
    assert {r.key: r.value for r in sl.run(topology).sink("out")} == {"big": float(2**61), "small": 6.0}


def aggregated(
    batches: list[pa.Table], how: str, emit: str = "batch", window: bool = False, processes: int = 1
) -> list[Any]:
    """``aggregate(how)`` of field v per key k over ``batches`` (each with ts): every result's (key, value)."""
    topology = sl.Topology("edges")
    rows = topology.add_source("in", sl.ColumnarSource(batches, key="k", ts="ts"))
    options: dict[str, Any] = {"window": sl.TimeWindow(10, time="event")} if window else {"emit": emit}
    folded = topology.aggregate("agg", how, field="v", **options).set_input(rows, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(folded)
    return [(r.key, r.value) for r in sl.run(topology, processes=processes).sink("out")]


UINT64 = pa.table({"k": ["a", "a", "b"], "v": pa.array([2**63, 2**64 - 1, 5], pa.uint64()), "ts": [1, 2, 3]})


@pytest.mark.parametrize(("emit", "window"), [("batch", False), ("end", False), ("batch", True)])
@pytest.mark.parametrize(
    ("how", "expected"),
    [("max", [("a", 2**64 - 1), ("b", 5)]), ("min", [("a", 2**63), ("b", 5)]),
     ("sum", [("a", 2**63 + 2**64 - 1), ("b", 5)])],
)  # fmt: skip
def test_uint64_values_past_int64_are_exact(how: str, expected: list[Any], emit: str, window: bool) -> None:
    """A uint64 column holding values >= 2^63: min and max exact (a uint64 result), a sum past 2^64 exact."""
    assert sorted(aggregated([UINT64], how, emit, window)) == expected


@pytest.mark.parametrize(("emit", "window"), [("batch", False), ("end", False), ("batch", True)])
@pytest.mark.parametrize(
    ("how", "expected"),
    [("sum", [("a", 3), ("b", 3)]), ("min", [("a", 1), ("b", 3)]), ("max", [("a", 2), ("b", 3)]),
     ("mean", [("a", 1.5), ("b", 3.0)]), ("count", [("a", 2), ("b", 1)])],
)  # fmt: skip
def test_a_dictionary_encoded_value_column_folds_as_its_values(
    how: str, expected: list[Any], emit: str, window: bool
) -> None:
    """docs/columnar.md: a dictionary-encoded value column is folded as the values it stands for."""
    table = pa.table({"k": ["a", "a", "b"], "v": pa.array([1, 2, 3]).dictionary_encode(), "ts": [1, 2, 3]})
    assert sorted(aggregated([table], how, emit, window)) == expected


def test_a_sum_past_int64_comes_out_exact_as_records_under_either_emit() -> None:
    """Two batches whose running sum passes 2^63: per batch, then at the end, exact ints and no failure."""
    near = pa.table({"k": ["a", "a"], "v": pa.array([2**62, 2**62 + 5], pa.int64()), "ts": [1, 2]})
    more = pa.table({"k": ["a", "a"], "v": pa.array([2**62, 2**62], pa.int64()), "ts": [3, 4]})
    assert aggregated([near, more], "sum", "batch") == [("a", 2**63 + 5), ("a", 2**64 + 5)]
    assert aggregated([near, more], "sum", "end") == [("a", 2**64 + 5)]


@pytest.mark.in_memory_state_only(
    "processes=2 forks this process, which has run RocksDB: refused (tests/unit/core/test_rocksdb_state.py)"
)
def test_a_sum_past_64_bits_crosses_between_processes() -> None:
    """processes=2: the aggregate and the sink in different processes, the exact int goes over the frame."""
    past = pa.table({"k": ["a", "a"], "v": pa.array([2**64 - 1, 2], pa.uint64()), "ts": [1, 2]})
    assert aggregated([past], "sum", "end", processes=2) == [("a", 2**64 + 1)]


class ColumnTypes(sl.Sink):
    """Takes the columnar batches as they are: the type of each one's value column (``records`` when records)."""

    takes_columns = True

    def __init__(self) -> None:
        self.types: list[str] = []

    def open(self, context: sl.SinkContext) -> Any:
        types = self.types

        class Writer(sl.ElementWriter):
            def write(self, batch: Any) -> None:
                types.append("records")

            def write_columns(self, batch: Any) -> None:
                types.append(str(batch.data.schema.field("value").type))

        return Writer()


@pytest.mark.parametrize(
    ("values", "how", "expected"),
    [
        ([2**63, 5], "max", ["uint64"]),  # past int64, none negative: a uint64 column
        ([2**62] * 3, "sum", ["uint64"]),  # a sum past int64 that uint64 holds
        ([2**62] * 5, "sum", ["records"]),  # past 2^64: exact ints, as records
        ([1, 2], "max", ["int64"]),
    ],
)
def test_results_are_the_narrowest_integer_column_that_holds_them(values: list[int], how: str, expected: Any) -> None:
    """int64 when it holds them, uint64 for a min/max past int64, records for what no 64-bit column holds."""
    kind = pa.uint64() if values[0] >= 2**63 else pa.int64()
    table = pa.table({"k": ["a"] * len(values), "v": pa.array(values, kind), "ts": list(range(len(values)))})
    topology = sl.Topology("types")
    rows = topology.add_source("in", sl.ColumnarSource([table], key="k", ts="ts"))
    sink = ColumnTypes()
    topology.add_sink("out", sink).set_input(topology.aggregate("agg", how, field="v").set_input(rows))
    sl.run(topology)
    assert sink.types == expected
