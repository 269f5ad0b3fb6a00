"""Differential tests of the columnar ``aggregate`` (docs/columnar.md) against the model of ``models/columnar.py``.

Random rows (keys of strings, ints or a dictionary-encoded string column, with nulls; values small, int32,
int64 near its edges so sums pass 2^63 both ways, uint64 up to 2^64 - 1 so sums pass 2^64, or floats whose sums
are exact in any order; dictionary-encoded value columns; nulls) are cut into random batches and fed to a
``ColumnarSource`` as a list of record batches (each its own schema: dictionaries of their own, int64 and uint64
mixed, empty batches), a ``pyarrow.Table`` of them or one batch, or as a list of ``sl.Record`` (a columnar task
fed by records); optionally through a ``where`` first, or with the aggregate naming other columns (``key=``,
``field=``). The aggregate runs with one or three instances (``SAME_KEY``), ``emit="batch"`` or ``"end"``, or on
a tumbling event-time window (time units of 1 ms, 0.1 s, 0.25 s) with late rows; in one process, or (a smaller
share) two. Each key's results in order (with one instance, the whole output in order), their types (an int is
not a float), the window bounds, the late rows and ``statistics.late`` must be the model's.

The disagreements the differential runs found, reduced to minimal examples, are tests of their own at the end
(``xfail(strict=True)`` while streamlet contradicts the page).
"""

from __future__ import annotations

import itertools
import numbers
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import streamlet as sl
from tests.spec.budget import examples
from tests.spec.models import columnar as model

I64 = (-(2**63), 2**63 - 1)
U64_MAX = 2**64 - 1

KEYS = {
    "str": ["a", "b", "c", "d", None],
    "int": [1, 2, -3, 2**40, None],
    "dict": ["a", "b", "c", "d", None],  # a dictionary-encoded string column
}

VALUES = {
    "small": st.integers(-50, 50),
    "int32": st.one_of(st.integers(-50, 50), st.sampled_from([2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1)),
    "int64": st.one_of(
        st.integers(-100, 100),
        st.sampled_from([2**63 - 1, -(2**63), 2**62 + 1, -(2**62) - 3, 2**63 - 7, -(2**63) + 11]),
        st.integers(*I64),
    ),
    "uint64": st.one_of(
        st.integers(0, 100),
        st.sampled_from([U64_MAX, 2**63, 2**63 + 5, U64_MAX - 9, 2**63 - 1]),
        st.integers(0, U64_MAX),
    ),
    "float": st.integers(-400, 400).map(lambda k: k / 4),  # quarters: every sum is exact, in any order
}
ARROW = {"small": pa.int64(), "int32": pa.int32(), "int64": pa.int64(), "uint64": pa.uint64(), "float": pa.float64()}


@dataclass
class Scenario:
    rows: list[tuple[Any, Any, Any]]  # (key, value, ts)
    cuts: list[int]  # batch boundaries: batch i is rows[cuts[i]:cuts[i + 1]]
    key_kind: str
    value_kind: str
    encodings: list[str]  # per batch: "plain", "dict" (dictionary-encoded values) or "int64" (uint64 data as int64)
    form: str  # "list" of record batches, "table" of them, one "batch", or "records" (a list of ``sl.Record``)
    how: str
    emit: str
    parallelism: int
    where: Any  # None, or keep the rows whose value > where
    columns: bool  # the aggregate names its key and field columns (key="g", field="w") instead of the roles
    ts_kind: str  # "int" or "float"
    window: tuple[int, int] | None = None  # (size, out_of_orderness) in ms
    time_unit: int = 1  # the window's time_unit, in ms
    batch_size: int = 1000  # the job's (the records' batches)

    def batches(self) -> list[list[tuple[Any, Any, Any]]]:
        return [self.rows[a:b] for a, b in itertools.pairwise(self.cuts)]

    def kept(self, row: tuple[Any, ...]) -> bool:
        """Whether the ``where`` (if any) keeps the row: a null value is not greater than anything."""
        return self.where is None or (row[1] is not None and row[1] > self.where)


# ----------------------------------------------------------------------------------------------- strategies


@st.composite
def cuts_of(draw: st.DrawFn, n: int, allow_empty: bool, min_cuts: int = 0, max_cuts: int = 12) -> list[int]:
    if n == 0 or (n == 1 and not allow_empty):
        return [0, n]
    low, high = (0, n) if allow_empty else (1, n - 1)
    inner = sorted(draw(st.lists(st.integers(low, high), min_size=min(min_cuts, n - 1), max_size=max_cuts)))
    cuts = [0, *inner, n]
    if not allow_empty:
        cuts = sorted(set(cuts))
    return cuts


@st.composite
def scenarios(
    draw: st.DrawFn,
    windowed: bool = False,
    parallelism: Sequence[int] = (1, 3),
    on_time: bool = False,
    max_rows: int = 40,
    min_cuts: int = 0,
    max_cuts: int = 12,
    records: bool = True,
) -> Scenario:
    """A scenario; ``on_time``: no row is more than the source's out-of-orderness behind the newest before it, so
    none can be late whatever the watermark (the resume tests)."""
    key_kind = draw(st.sampled_from(sorted(KEYS)))
    value_kind = draw(st.sampled_from(sorted(VALUES)))
    emit = draw(st.sampled_from(["batch", "end"]))
    keys = draw(st.lists(st.sampled_from(KEYS[key_kind]), min_size=1, max_size=5, unique=True))
    value = st.one_of(VALUES[value_kind], st.none()) if draw(st.booleans()) else VALUES[value_kind]
    ts_kind = draw(st.sampled_from(["int", "float"]))
    n = draw(st.integers(0, max_rows))
    rows: list[tuple[Any, Any, Any]] = []
    if windowed:  # a front moving forward, most rows near it, some far behind; times in units of u ms
        time_unit = draw(st.sampled_from([1, 1, 100, 250]))
        u = 1000 if ts_kind == "int" else draw(st.sampled_from([u for u in (1, 100, 250, 1000) if u % time_unit == 0]))
        size, out_of_orderness = draw(st.integers(1, 12)), draw(st.integers(0, 8))
        front = draw(st.integers(0, 5))
        for _ in range(n):
            front += draw(st.sampled_from([0, 0, 1, 1, 2, 3, 5]))
            lag = draw(st.one_of(st.just(0), st.integers(0, 6), st.integers(0, 30)))
            if on_time:
                lag = min(lag, out_of_orderness)
            t = max(0, front - lag) * u  # ticks
            ts = t // 1000 if ts_kind == "int" else t / 1000
            rows.append((draw(st.sampled_from(keys)), draw(value), ts))
        window = (size * u, out_of_orderness * u)
    else:
        time_unit = 1
        ts = st.integers(0, 10**6) if ts_kind == "int" else st.integers(0, 10**6).map(lambda t: t / 1000)
        ts = st.one_of(ts, st.none()) if draw(st.integers(0, 3)) == 0 else ts
        rows = [(draw(st.sampled_from(keys)), draw(value), draw(ts)) for _ in range(n)]
        window = None
    records = records and value_kind != "uint64"  # a record's int is a signed 64-bit one (docs/state.md)
    form = draw(st.sampled_from(["list", "list", "table"] + ([] if windowed else ["batch"]) + ["records"] * records))
    allow_empty = form == "list" and draw(st.booleans())
    batch_size = 1000
    if form == "records":  # the source reads batch_size records a batch
        batch_size = draw(st.sampled_from([1, 2, 3, 5, 1000]))
        cuts = [*range(0, n, batch_size), n]
    elif form == "batch":
        cuts = [0, n]
    else:
        cuts = draw(cuts_of(n, allow_empty, max(min_cuts, 4 if windowed else 0), max_cuts))
    mixed = form == "list" and draw(st.booleans())  # batches of other schemas in one stream
    encodings = []
    for a, b in itertools.pairwise(cuts):
        choices = ["plain"]
        if mixed or not encodings:
            choices += ["dict"]
            if value_kind == "uint64" and all(r[1] is None or r[1] <= I64[1] for r in rows[a:b]):
                choices += ["int64"]
        encodings.append(draw(st.sampled_from(choices)) if mixed or not encodings else encodings[0])
    if value_kind == "uint64" and "int64" in encodings and not mixed:
        encodings = ["plain"] * len(encodings)
    if form == "records":
        encodings = ["plain"] * len(encodings)
    columns = form != "records" and draw(st.integers(0, 4)) == 0
    p = draw(st.sampled_from(list(parallelism)))
    if form == "records" and emit == "batch":  # test_a_batch_of_records_without_ts_is_aggregated: none reaches
        zero = 0 if ts_kind == "int" else 0.0
        for a, b in itertools.pairwise(cuts):  # an instance whose records all lack a ts
            if p > 1:
                rows[a:b] = [(key, value, zero if ts is None else ts) for key, value, ts in rows[a:b]]
            elif a < b and all(r[2] is None for r in rows[a:b]):
                rows[a] = (rows[a][0], rows[a][1], zero)
    plain_values = all(e == "plain" for e in encodings) and not columns
    where = draw(st.one_of(st.none(), VALUES[value_kind])) if plain_values and draw(st.booleans()) else None
    return Scenario(
        rows=rows,
        cuts=cuts,
        key_kind=key_kind,
        value_kind=value_kind,
        encodings=encodings,
        form=form,
        how=draw(st.sampled_from(model.HOWS)),
        emit=emit,
        parallelism=1 if columns else p,  # SAME_KEY routes by the source's key role, not by "g"
        where=where,
        columns=columns,
        ts_kind=ts_kind,
        window=window,
        time_unit=time_unit,
        batch_size=batch_size,
    )


# ----------------------------------------------------------------------------------------------- running


def _column(values: list[Any], arrow_type: pa.DataType, encoding: str) -> pa.Array:
    if encoding == "int64":
        arrow_type = pa.int64()
    array = pa.array(values, type=arrow_type)
    return array.dictionary_encode() if encoding == "dict" else array


def role_columns(i: int) -> tuple[str, int]:
    """The source's key and value of row ``i`` of a batch when the aggregate names other columns."""
    return f"r{i % 3}", i


def record_batch(scenario: Scenario, rows: list[tuple[Any, Any, Any]], encoding: str) -> pa.RecordBatch:
    keys = [r[0] for r in rows]
    key = pa.array(keys, type=pa.int64() if scenario.key_kind == "int" else pa.string())
    if scenario.key_kind == "dict":
        key = key.dictionary_encode()
    value = _column([r[1] for r in rows], ARROW[scenario.value_kind], encoding)
    ts = pa.array([r[2] for r in rows], type=pa.int64() if scenario.ts_kind == "int" else pa.float64())
    if scenario.columns:  # the roles are other columns; the aggregate names "g" and "w"
        k, v = zip(*(role_columns(i) for i in range(len(rows))), strict=True) if rows else ((), ())
        roles = [pa.array(k, type=pa.string()), pa.array(v, type=pa.int64())]
        return pa.RecordBatch.from_arrays([*roles, key, value, ts], names=["k", "v", "g", "w", "ts"])
    return pa.RecordBatch.from_arrays([key, value, ts], names=["k", "v", "ts"])


def source_data(scenario: Scenario) -> Any:
    batches = [
        record_batch(scenario, rows, enc) for rows, enc in zip(scenario.batches(), scenario.encodings, strict=True)
    ]
    if scenario.form == "batch":
        return batches[0]
    if scenario.form == "table":
        return pa.Table.from_batches(batches)
    return batches


def typed(value: Any) -> Any:
    """A value with its kind: an int is not a float (1 == 1.0 in Python)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return ("int", int(value))
    if isinstance(value, numbers.Real):
        return ("float", float(value))
    if isinstance(value, tuple):
        return tuple(typed(v) for v in value)
    return value


def aggregate_options(scenario: Scenario) -> dict[str, Any]:
    """The aggregate's options: the columns it names, its window or its ``emit``."""
    options: dict[str, Any] = {"key": "g", "field": "w"} if scenario.columns else {}
    if scenario.window is not None:
        unit = {} if scenario.time_unit == 1 else {"time_unit": scenario.time_unit / 1000}
        options["window"] = sl.TimeWindow(scenario.window[0] / 1000, time="event", **unit)
    else:
        options["emit"] = scenario.emit
    return options


def run_streamlet(scenario: Scenario, processes: int = 1) -> tuple[list[Any], list[Any], Any]:
    topology = sl.Topology("spec-columnar")
    watermarks = None
    if scenario.window is not None:
        watermarks = sl.Watermarks(out_of_orderness=scenario.window[1] / 1000)
    if scenario.form == "records":  # a columnar task fed by records sees the fields key, value and ts
        source: Any = [sl.Record(key, value, ts) for key, value, ts in scenario.rows]
        value_field = "value"
    else:
        source = sl.ColumnarSource(source_data(scenario), key="k", value="v", ts="ts")
        value_field = "v"
    node = topology.add_source("src", source, watermarks=watermarks)
    if scenario.where is not None:
        threshold = pa.scalar(scenario.where, type=ARROW[scenario.value_kind])
        node = topology.where("where", pc.field(value_field) > threshold).set_input(node)
    agg = topology.aggregate("agg", scenario.how, parallelism=scenario.parallelism, **aggregate_options(scenario))
    agg.set_input(node, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(agg)
    topology.add_sink("late", sl.CollectSink()).set_input(agg, out_port=sl.LATE)
    result = sl.run(topology, processes=processes, batch_size=scenario.batch_size)
    if scenario.window is None:
        out = [typed((r.key, r.value, r.ts)) for r in result.sink("out")]
    else:
        out = [(*typed((r.key, r.value, r.ts, r.window)), r.firing) for r in result.sink("out")]
    late = [typed((r.key, r.value, r.ts)) for r in result.sink("late")]
    return out, late, result.statistics


def run_model(scenario: Scenario) -> tuple[list[Any], list[Any]]:
    batches = scenario.batches()
    if scenario.window is None:
        kept = [[row for row in batch if scenario.kept(row)] for batch in batches]
        return [typed(r) for r in model.aggregate(kept, scenario.how, scenario.emit)], []
    size, out_of_orderness = scenario.window
    if scenario.columns:  # a late row leaves as the source's record: its key and value roles
        batches = [[(*row, *role_columns(i)) for i, row in enumerate(batch)] for batch in batches]
    unit = scenario.time_unit
    results, late = model.window_aggregate(
        batches,
        scenario.how,
        size // unit,
        out_of_orderness // unit,
        ticks_per_second=1000 // unit,
        int_bounds=scenario.ts_kind == "int",
        keep=scenario.kept,
    )
    late = [(r[3], r[4], r[2]) if scenario.columns else r for r in late]
    return [(*typed((r.key, r.value, r.ts, r.window)), "on_time") for r in results], [typed(r) for r in late]


def by_key(items: Sequence[tuple[Any, ...]]) -> dict[Any, list[tuple[Any, ...]]]:
    grouped: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for item in items:
        grouped[repr(item[0])].append(item)
    return dict(grouped)


def past_64_bits(item: Any) -> bool:
    """Whether a result holds an int no 64-bit integer (signed or not) holds."""
    return isinstance(item[1], tuple) and item[1][0] == "int" and not -(2**63) <= item[1][1] <= U64_MAX


def check(scenario: Scenario, processes: int = 1) -> None:
    note(repr(scenario))
    want, want_late = run_model(scenario)
    if processes > 1 and any(past_64_bits(item) for item in want):
        event("a result past 64 bits across processes")
    got, got_late, statistics = run_streamlet(scenario, processes)
    note(f"model:     {want}\nstreamlet: {got}\nmodel late: {want_late}\nstreamlet late: {got_late}")
    event(f"values {scenario.value_kind}, keys {scenario.key_kind}, {scenario.form}")
    event(f"parallelism {scenario.parallelism}")
    if scenario.window is not None:
        event(f"late rows: {bool(want_late)}")
    else:
        event(f"emit={scenario.emit}")
    sums = [abs(item[1][1]) for item in want if isinstance(item[1], tuple) and item[1][0] == "int"]
    event(f"a result past 2^64: {max(sums, default=0) > U64_MAX}; past 2^63: {max(sums, default=0) > I64[1]}")
    if scenario.parallelism == 1:
        assert got == want
        assert got_late == want_late
    else:
        assert by_key(got) == by_key(want)
        assert by_key(got_late) == by_key(want_late)
    assert statistics.late == len(want_late)


# ----------------------------------------------------------------------------------------------- the page's examples


def test_the_model_gives_the_page_examples() -> None:
    readings = [[("s1", 33, 3.0), ("s2", 35, 2.0), ("s2", 36, 4.0)]]  # after the where
    assert sorted(model.aggregate(readings, "max", "end")) == [("s1", 33, None), ("s2", 36, None)]
    assert model.aggregate(readings, "max") == [("s1", 33, 3.0), ("s2", 36, 4.0)]
    clicks = [[("a", None, 1), ("b", None, 3), ("a", None, 4)], [("a", None, 12), ("b", None, 14)], [("a", None, 2)]]
    results, late = model.window_aggregate(clicks, "count", 10_000, 2_000, int_bounds=True)
    assert sorted((r.key, r.value, r.ts, *r.window) for r in results) == [
        ("a", 1, 19.999, 10, 20),
        ("a", 2, 9.999, 0, 10),
        ("b", 1, 9.999, 0, 10),
        ("b", 1, 19.999, 10, 20),
    ]
    assert [(k, ts) for k, _, ts in late] == [("a", 2)]


# ----------------------------------------------------------------------------------------------- differential


@pytest.mark.timeout(240)
@examples()
@given(scenarios())
def test_aggregate_matches_the_model(scenario: Scenario) -> None:
    check(scenario)


@pytest.mark.timeout(240)
@examples()
@given(scenarios(windowed=True))
def test_windowed_aggregate_matches_the_model(scenario: Scenario) -> None:
    check(scenario)


@pytest.mark.timeout(240)
@examples(0.1)
@given(st.booleans().flatmap(lambda w: scenarios(windowed=w, parallelism=(1, 2))))
def test_aggregate_in_two_processes_matches_the_model(scenario: Scenario) -> None:
    check(scenario, processes=2)


# ----------------------------------------------------------------------------------------- the disagreements, reduced


def _counts(
    keys: list[Any], key_type: pa.DataType, dictionary: bool = False, emit: str = "batch", how: str = "count"
) -> list[Any]:
    key = pa.array(keys, type=key_type)
    if dictionary:
        key = key.dictionary_encode()
    batch = pa.RecordBatch.from_arrays([key, pa.array([1] * len(keys)), pa.array([0] * len(keys))], ["k", "v", "ts"])
    topology = sl.Topology("spec-columnar-minimal")
    source = topology.add_source("src", sl.ColumnarSource([batch], key="k", value="v", ts="ts"))
    agg = topology.aggregate("agg", how, emit=emit).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(agg)
    return [(r.key, r.value) for r in sl.run(topology).sink("out")]


def test_a_null_key_keeps_its_place() -> None:
    """Keys in the order they first appear, the null key too: what streamlet gets right."""
    assert _counts(["a", None, "b"], pa.string()) == [("a", 1), (None, 1), ("b", 1)]
    assert _counts([1000, None, 2], pa.int64()) == [(1000, 1), (None, 1), (2, 1)]
    assert _counts(["a", None, "b"], pa.string(), dictionary=True, emit="end") == [("a", 1), (None, 1), ("b", 1)]
    assert _counts([2**40, None, 2], pa.int64(), emit="end") == [(2**40, 1), (None, 1), (2, 1)]


NULL_KEY_CASES = [
    (["a", None, "b"], pa.string(), True, "batch"),
    (["a", None, "b"], pa.string(), True, "end"),  # with "sum" (not "count")
    ([None, "b", "a"], pa.string(), True, "batch"),
    ([2**40, None, 2], pa.int64(), False, "batch"),
]


@pytest.mark.parametrize(
    ("keys", "key_type", "dictionary", "emit"), NULL_KEY_CASES, ids=["dict", "dict-end", "dict-null-first", "int"]
)
def test_keys_come_in_the_order_they_first_appear_with_a_null_key(
    keys: list[Any], key_type: pa.DataType, dictionary: bool, emit: str
) -> None:
    """One batch of one row per key, ``sum``: the results must come in the order the keys first appear, the null
    key too (found by the differential run: with a dictionary-encoded string key column holding a null, or an
    int64 key column holding 2^40 and a null, streamlet gave ["a", "b", None] for ["a", None, "b"] and
    [None, "a", "b"] for [None, "b", "a"])."""
    assert _counts(keys, key_type, dictionary, emit, how="sum") == [(key, 1) for key in keys]


REFUSED = {
    "sliding": {"window": sl.TimeWindow(10, 5, time="event")},
    "processing time": {"window": sl.TimeWindow(10)},
    "count": {"window": sl.CountWindow(3)},
    "session": {"window": sl.SessionWindow(5, time="event")},
    "allowed_lateness": {"window": sl.TimeWindow(10, time="event", allowed_lateness=1)},
    "early_firing": {"window": sl.TimeWindow(10, time="event", early_firing=1)},
    "offset": {"window": sl.TimeWindow(10, time="event", offset=1)},
    "idle_timeout": {"window": sl.TimeWindow(10, time="event", idle_timeout=1)},
    "on_late": {"window": sl.TimeWindow(10, time="event", on_late=print)},
    "missing_ts": {"window": sl.TimeWindow(10, time="event", missing_ts="fail")},
    "emit end": {"window": sl.TimeWindow(10, time="event"), "emit": "end"},
    "skip": {"on_error": "skip"},
    "restart": {"on_error": "restart"},
}


@pytest.mark.parametrize("options", list(REFUSED.values()), ids=list(REFUSED))
def test_other_windows_and_options_are_refused_naming_the_task(options: dict[str, Any]) -> None:
    topology = sl.Topology("spec-columnar-refused")
    table = pa.table({"k": ["a"], "v": [1], "ts": [0.0]})
    source = topology.add_source("src", sl.ColumnarSource(table, key="k", value="v", ts="ts"))

    def build_and_run() -> None:
        agg = topology.aggregate("per-sensor", "sum", **options).set_input(source)
        topology.add_sink("out", sl.CollectSink()).set_input(agg)
        sl.run(topology)

    with pytest.raises(sl.StreamletError, match="per-sensor"):
        build_and_run()


def _count_records(records: list[sl.Record], emit: str) -> list[Any]:
    topology = sl.Topology("spec-columnar-no-ts")
    source = topology.add_source("src", records)
    agg = topology.aggregate("agg", "count", emit=emit).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(agg)
    return [(r.key, r.value, r.ts) for r in sl.run(topology).sink("out")]


def test_records_without_ts_are_aggregated() -> None:
    """What streamlet gets right: emit="end", and a batch mixing records with and without a ts."""
    assert _count_records([sl.Record("a", 1, None)], "end") == [("a", 1, None)]
    assert _count_records([sl.Record("a", 1, 2.0), sl.Record("a", 1, None)], "batch") == [("a", 2, None)]


def test_a_batch_of_records_without_ts_is_aggregated() -> None:
    """A columnar aggregate fed by records sees the fields key, value and ts, and a record's ts may be None; with
    emit="batch" a key's result has the ts of its last row, here None (found by the differential run: a batch
    whose records all have ts=None stops the job with a TaskError, "ArrowNotImplementedError: Function
    'hash_first_last' has no kernel matching input types (null, uint32)")."""
    assert _count_records([sl.Record("a", 1, None)], "batch") == [("a", 1, None)]
