"""The columnar path: a source of Arrow batches, and built-in tasks that filter and aggregate them in Arrow.

Between these nodes batches travel as :class:`~streamlet.core.model.columns.ColumnBatch`
(an Arrow record batch and the columns that are its records' key, value and
ts) and are computed on with ``pyarrow.compute``, never a Python object per
row. Any other node they feed (a user ``Task``, a shortcut, a sink) receives
them as elements, converted once by the sending route; fed by elements, a
columnar task sees them as the fields ``key``, ``value`` and ``ts``.

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> import streamlet as sl
    >>> topology = sl.Topology("counts")
    >>> words = topology.add_source("words", sl.ColumnarSource(pa.table({"word": ["a", "b", "a"]}), key="word"))
    >>> counts = topology.aggregate("count", "count", emit="end").set_input(words, partitioning=sl.SAME_KEY)
    >>> _ = topology.add_sink("out", sl.CollectSink()).set_input(counts)
    >>> sorted((r.key, r.value) for r in sl.run(topology).sink("out"))
    [('a', 2), ('b', 1)]
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any, Literal, TypeAlias

from streamlet.core.model.columns import ColumnBatch, columns_of, field_names, import_pyarrow
from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.sources import Source, SourceContext, SourceReader
from streamlet.core.model.task import Task
from streamlet.core.model.windows import TimeWindow, WindowSpec
from streamlet.errors import FieldError, TopologyError

#: What ``Topology.aggregate`` computes per key.
AggregateHow: TypeAlias = Literal["count", "sum", "min", "max", "mean"]
#: When ``Topology.aggregate`` emits: each touched key's value after every batch, or every key's at the end.
AggregateEmit: TypeAlias = Literal["batch", "end"]
AGGREGATES: tuple[str, ...] = ("count", "sum", "min", "max", "mean")


class ColumnarSource(Source):
    """A source of Arrow data: a ``pyarrow.Table``, a ``pyarrow.RecordBatch``, or an iterable of them.

    Every record batch is emitted as it is (a table as its chunks), with the
    columns ``key``, ``value`` and ``ts`` naming the records' roles (see
    :class:`~streamlet.core.model.columns.ColumnBatch`; ``value=None``: the
    other columns as a dict). With ``parallelism`` n, instance i reads batches i, i+n,
    ... The position is the number of batches read, so a restore replays from
    there. With several instances or a restore the data must be re-iterable
    (a table, a batch or a list; not a generator, which only one reader can read).

    Example:
        >>> import pyarrow as pa
        >>> source = ColumnarSource(pa.table({"sensor": ["s1", "s2"], "celsius": [20.5, 21.0]}), key="sensor")
    """

    columnar = True  # it emits Arrow batches

    def __init__(self, data: Any, *, key: str | None = None, value: str | None = None, ts: str | None = None) -> None:
        self.data = data
        self.key, self.value, self.ts = key, value, ts

    def open(self, context: SourceContext) -> SourceReader:
        """A reader of this instance's share of the batches; a ``TopologyError`` for a one-shot iterator (a
        generator) and several instances, as :class:`~streamlet.core.model.sources.IterableSource` gives."""
        data = self.data
        if context.parallelism > 1 and isinstance(data, Iterator) and iter(data) is data:
            raise TopologyError(
                f"source '{context.node}': a one-shot iterator cannot feed "
                f"{context.parallelism} instances; pass a list or a factory-made iterable"
            )
        return ColumnarReader(self, context)

    def batches(self, where: str) -> Iterator[Any]:
        """Every record batch of the data, in order; a ``TopologyError`` naming ``where`` for anything else."""
        pa = import_pyarrow()
        items = [self.data] if isinstance(self.data, pa.Table | pa.RecordBatch) else self.data
        if not isinstance(items, Iterable):
            raise TopologyError(f"{where}: expected a pyarrow Table, RecordBatch or an iterable of them")
        for item in items:
            if isinstance(item, pa.RecordBatch):
                yield item
            elif isinstance(item, pa.Table):
                yield from item.to_batches()
            else:
                raise TopologyError(f"{where}: expected pyarrow Tables or RecordBatches, got {type(item).__name__}")

    def check_fields(self, data: Any, where: str) -> None:
        """Every named role is a column of ``data``."""
        names = data.schema.names
        for role, name in (("key", self.key), ("value", self.value), ("ts", self.ts)):
            if name is not None and name not in names:
                raise TopologyError(
                    f"{where}: {role}={name!r} is not a column of the data (fields: {field_names(data)})"
                )


class ColumnarReader(SourceReader):
    """One instance's reader of a :class:`ColumnarSource`."""

    def __init__(self, source: ColumnarSource, context: SourceContext) -> None:
        self.source = source
        self.where = f"source '{context.node}' output port 0"
        self.share = (context.index, context.parallelism)
        self.batches = enumerate(source.batches(self.where))
        self.read_count = 0  # batches of the whole data passed (this instance's and the others')
        self.top = -math.inf  # the largest event time read

    async def read(self, max_records: int) -> ColumnBatch | None:  # type: ignore[override]
        """The next batch of this instance (whole, whatever ``max_records``), ``None`` at the end."""
        index, parallelism = self.share
        for number, data in self.batches:
            self.read_count = number + 1
            if number % parallelism == index:
                return self._batch(data)
        return None

    def _batch(self, data: Any) -> ColumnBatch:
        source = self.source
        source.check_fields(data, self.where)
        if source.ts is not None and data.num_rows:
            top = import_pyarrow().compute.max(data.column(source.ts)).as_py()
            if top is not None and top > self.top:
                self.top = top
        return ColumnBatch(data, source.key, source.value, source.ts)

    def position(self) -> int:
        """Batches passed so far."""
        return self.read_count

    async def seek(self, position: Any) -> None:
        """Skip the first ``position`` batches."""
        if type(position) is not int or position < 0:
            raise TopologyError(f"{self.where}: cannot seek to {position!r}, not a number of batches")
        if position:
            for number, _ in self.batches:
                if number + 1 >= position:
                    break
        self.read_count = position

    def event_time_progress(self) -> float | None:
        """The largest ``ts`` read (``-inf`` before any, or without a ts column)."""
        return self.top


class ColumnarTask(Task):
    """Base of the built-in columnar tasks: :meth:`execute_columns` takes a whole columnar batch."""

    columnar = True

    @abstractmethod
    def execute_columns(self, batch: ColumnBatch, outputs: Outputs) -> None:
        """Process one columnar batch."""

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Fed by elements (a non-columnar upstream): as columns ``key``, ``value``, ``ts``."""
        batch = inputs.elements()
        if batch:
            self.execute_columns(columns_of(batch), outputs)


class WhereTask(ColumnarTask):
    """Keeps the rows for which a ``pyarrow.compute`` expression is true (see ``Topology.where``)."""

    def __init__(self, expression: Any) -> None:
        self.expression = expression

    def execute_columns(self, batch: ColumnBatch, outputs: Outputs) -> None:
        """Filter the batch in Arrow."""
        pa = import_pyarrow()
        try:
            kept = batch.data.filter(self.expression)
        except pa.ArrowInvalid as exc:
            if "No match for FieldRef" not in str(exc):
                raise
            raise FieldError(
                f"the expression {self.expression} names a field the batch has not (fields: {field_names(batch.data)})"
            ) from None
        if kept.num_rows:
            outputs.emit_columns(batch.with_data(kept))


#: Rows an ``emit="end"`` aggregate holds aside before folding them into its state at once: one
#: ``group_by`` over many batches costs a fraction of one per batch (hashing, a Python merge per batch),
#: and the memory held stays bounded by this, however long the input.
FOLD_ROWS = 1 << 20


class AggregateTask(ColumnarTask):
    """Per key, ``count``/``sum``/``min``/``max``/``mean`` of a field, folded in Arrow batch by batch
    (see ``Topology.aggregate``). The running values live in the instance's keyed state
    (``self.state``: ``mean`` keeps ``(sum, count)``), so they checkpoint like any keyed state.

    With ``emit="end"`` under ``on_error="fail"`` nothing goes out before the end, so the batches are
    folded many at a time: the first batch of each schema at once (a batch the aggregate cannot take
    fails there, as with ``emit="batch"``), later ones of the same schema held aside (their key and
    field columns, no copy) until :data:`FOLD_ROWS` rows wait, the state is snapshotted or moved
    (``settle_state``), or the input ends (not for dictionary-encoded columns, see ``_folds_alike``).
    Under ``skip`` or ``restart`` every batch is folded in its own call, so a
    failed one is taken back alone."""

    #: Whether ``emit="end"`` may hold batches aside (the runtime sets it under ``on_error="fail"``).
    holds_batches = False

    def __init__(self, how: AggregateHow, key: str | None, field: str | None, emit: AggregateEmit) -> None:
        self.how, self.key, self.field, self.emit = how, key, field, emit
        self._held: list[Any] = []  # record batches of the key (and field) columns, one schema
        self._held_rows = 0
        self._held_schema: Any = None

    def check_window(self, where: str, spec: WindowSpec | None) -> None:
        """Validation: the window is one this task runs on (see :func:`check_window`)."""
        check_window(where, spec)

    def execute_columns(self, batch: ColumnBatch, outputs: Outputs) -> None:
        """Aggregate the batch per key, merge into the running values, emit the keys it touched (``emit="end"``:
        or hold it aside to fold with the next ones)."""
        if not len(batch):
            return
        key, field = self.key_and_field(batch)
        if self.emit == "end" and self.holds_batches:
            self._hold(batch, key, field)
            return
        keys, merged, stamps = self._fold(batch, key, field)
        if self.emit == "batch":
            results = [mean_of(value) for value in merged] if self.how == "mean" else merged
            _emit_results(outputs, keys, results, stamps)

    def _hold(self, batch: ColumnBatch, key: str, field: str | None) -> None:
        """Hold the batch's columns aside, or fold it at once when it is the first of its schema (or of a
        schema whose batches fold differently together, see :meth:`_folds_alike`)."""
        columns = batch.data.select([key] if self.how == "count" or field in (None, key) else [key, field])
        if columns.schema != self._held_schema:
            self.settle_state()  # the keys held first are merged first: results keep the order keys first came
            self._fold(ColumnBatch(columns, key), key, field)  # fails here if it cannot take it
            self._held_schema = columns.schema if self._folds_alike(columns.schema) else None
            return
        self._held.append(columns)
        self._held_rows += len(columns)
        if self._held_rows >= FOLD_ROWS:
            self.settle_state()

    def _folds_alike(self, schema: Any) -> bool:
        """Whether one ``group_by`` over many batches of ``schema`` gives what folding each alone gives: not
        for dictionary-encoded columns, whose batches may each carry a dictionary of their own (a
        ``group_by`` over them refuses to unify them). Integer sums are exact either way (:func:`summable`)."""
        types = import_pyarrow().types
        return not any(types.is_dictionary(column.type) for column in schema)

    def settle_state(self) -> None:
        """Fold the batches held aside into the running values (one ``group_by`` over them all)."""
        if not self._held:
            return
        pa = import_pyarrow()
        table = pa.Table.from_batches(self._held)
        key = table.schema.names[0]
        field = table.schema.names[1] if table.num_columns > 1 else key
        self._fold(ColumnBatch(table, key), key, field)
        self._held, self._held_rows = [], 0  # only once folded: a fold that failed loses nothing held

    def _fold(self, batch: ColumnBatch, key: str, field: str | None) -> tuple[Any, list[Any], Any]:
        """Aggregate ``batch`` per key and merge into the running values: its keys, their new values and
        stamps (see :func:`_per_key`)."""
        keys, parts, stamps = _per_key(batch, key, field, self.how)
        return keys, merge_partials(self.state.values, keys.to_pylist(), parts, self.how), stamps

    def key_and_field(self, batch: ColumnBatch) -> tuple[str, str | None]:
        """The columns of ``batch`` this task groups by and folds (a ``FieldError`` when one is missing)."""
        key = self.key if self.key is not None else batch.key
        field = self.field if self.field is not None else batch.value
        names = batch.data.schema.names
        if key is None or key not in names:
            raise FieldError(f"aggregate key={key!r} is not a field of the batch (fields: {field_names(batch.data)})")
        if self.how != "count" and (field is None or field not in names):
            raise FieldError(
                f"aggregate {self.how!r} of field={field!r}, which is not a field of the batch "
                f"(fields: {field_names(batch.data)})"
            )
        return key, field

    def finish(self, outputs: Outputs) -> None:
        """With ``emit="end"``: every key's value, in the order the keys first came."""
        self.settle_state()
        if self.emit != "end" or not self.state.values:
            return
        totals = self.state.values
        results = [mean_of(value) for value in totals.values()] if self.how == "mean" else list(totals.values())
        _emit_results(outputs, import_pyarrow().array(list(totals)), results, None)


def _per_key(batch: ColumnBatch, key: str, field: str | None, how: str) -> tuple[Any, list[Any], Any]:
    """The batch's keys (in the order they first appear), the partial aggregate of each (``mean``: sum and
    count pairs), and the ``ts`` of each key's last row (``None`` without a ts column)."""
    pa = import_pyarrow()
    data, ts = batch.data, batch.ts
    if how == "count" and ts is None:
        counted = pa.compute.value_counts(data.column(key))
        return counted.field(0), counted.field(1).to_pylist(), None
    aggregations: list[Any] = []
    if how == "count":
        aggregations.append((key, "count", pa.compute.CountOptions(mode="all")))
    else:
        aggregations.append((field, "sum" if how == "mean" else how))
    if how == "mean":
        aggregations.append((field, "count"))  # only the valid values, as the sum
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    if how != "count" and field != key:
        assert field is not None
        table = table.set_column(table.schema.get_field_index(field), field, decoded(table.column(field)))
    if how in ("sum", "mean") and field != key:
        assert field is not None
        column = table.column(field)
        summed = summable(column)
        if summed is not column:
            table = table.set_column(table.schema.get_field_index(field), field, summed)
    table = _with_typed_ts(table, ts)
    if ts is not None:
        aggregations.append((ts, "last", pa.compute.ScalarAggregateOptions(skip_nulls=False)))
    grouped = grouped_in_order(table, key, aggregations)
    keys = grouped.column(key).combine_chunks()
    stamps = None if ts is None else grouped.column(f"{ts}_last").combine_chunks()
    if how == "count":
        return keys, grouped.column(f"{key}_count").to_pylist(), stamps
    if how == "mean":
        sums, counts = exact_sums(grouped.column(f"{field}_sum")), grouped.column(f"{field}_count").to_pylist()
        return keys, mean_parts(sums, counts), stamps
    if how == "sum":
        return keys, exact_sums(grouped.column(f"{field}_sum")), stamps
    return keys, grouped.column(f"{field}_{how}").to_pylist(), stamps


#: The column :func:`grouped_in_order` numbers the rows in (1, 2, ...).
FIRST_ROW = "__streamlet_row"


def grouped_in_order(table: Any, key: str, aggregations: list[Any]) -> Any:
    """``table.group_by(key).aggregate(aggregations)`` with the keys in the order they first appear in ``table``.

    Arrow's ``group_by`` promises no order (a null key among dictionary-encoded or large int keys comes out
    elsewhere), and docs/columnar.md promises first-seen order: each group takes the smallest row number."""
    pa = import_pyarrow()
    rows = pa.compute.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), len(table)))
    numbered = table.append_column(FIRST_ROW, rows)
    grouped = numbered.group_by(key, use_threads=False).aggregate([*aggregations, (FIRST_ROW, "min")])
    return grouped.take(pa.compute.sort_indices(grouped.column(f"{FIRST_ROW}_min")))


def _with_typed_ts(table: Any, ts: str | None) -> Any:
    """``table`` with a ts column of Arrow's null type (records that all had ``ts=None``) as float64 nulls:
    Arrow's ``last`` has no kernel for the null type."""
    pa = import_pyarrow()
    if ts is None or not pa.types.is_null(table.schema.field(ts).type):
        return table
    return table.set_column(table.schema.get_field_index(ts), ts, pa.nulls(len(table), pa.float64()))


def decoded(column: Any) -> Any:
    """``column``, or the values its dictionary stands for when it is dictionary-encoded: Arrow's grouped
    sum, min and max take no dictionary (a count does not look at the values)."""
    pa = import_pyarrow()
    if not pa.types.is_dictionary(column.type):
        return column
    return pa.compute.cast(column, column.type.value_type)


def summable(column: Any) -> Any:
    """``column``, or as ``decimal128(38, 0)`` when it holds integers whose sum could pass 64 bits: Arrow's
    integer sum wraps around without a word, a decimal's is exact. The check is one ``min_max``: rows times
    the largest magnitude below 2^63 cannot wrap whatever the grouping."""
    pa = import_pyarrow()
    if not pa.types.is_integer(column.type) or len(column) == 0:
        return column
    low, high = (value.as_py() for value in pa.compute.min_max(column).values())
    if low is None or len(column) * max(abs(low), abs(high)) < 2**63:
        return column
    return pa.compute.cast(column, pa.decimal128(38, 0))


def exact_sums(sums: Any) -> list[Any]:
    """A grouped sum column as Python values: a decimal one (see :func:`summable`) as ints."""
    values: list[Any] = sums.to_pylist()
    if import_pyarrow().types.is_decimal(sums.type):
        return [None if value is None else int(value) for value in values]
    return values


def mean_parts(sums: list[Any], counts: list[int]) -> list[Any]:
    """``mean``'s partials: ``(sum, count)`` of the valid values, ``None`` for a key with none."""
    return [(total, count) if count else None for total, count in zip(sums, counts, strict=True)]


def mean_of(value: Any) -> Any:
    """A ``mean``'s running ``(sum, count)`` as its result (``None`` for a key not seen with a valid value)."""
    return None if value is None else value[0] / value[1]


def merge_partials(totals: dict[Any, Any], keys: list[Any], parts: list[Any], how: str) -> list[Any]:
    """Fold each key's partial into its running value in ``totals`` (``mean``: ``(sum, count)`` pairs); the
    new values, in ``keys``' order.

    Nulls are skipped, as ``pyarrow.compute`` does: a partial is ``None`` when all the key's values in the
    batch were null, and leaves the running value as it was. A key seen only with nulls has the value
    ``None`` (``sum``, ``min``, ``max`` and ``mean``, as SQL gives; ``count`` counts rows, nulls too)."""
    get = totals.get
    merged: list[Any] = []
    append = merged.append
    for key, part in zip(keys, parts, strict=True):
        now = get(key)
        if part is None or now is None:
            append(now if part is None else part)
        elif how in ("count", "sum"):
            append(now + part)
        elif how == "min":
            append(min(now, part))
        elif how == "max":
            append(max(now, part))
        else:  # mean: (sum, count)
            append((now[0] + part[0], now[1] + part[1]))
    totals.update(zip(keys, merged, strict=True))
    return merged


def _emit_results(outputs: Outputs, keys: Any, values: list[Any], stamps: Any) -> None:
    """Results as a columnar batch, or as records when a value fits no Arrow integer column (a sum past 64
    bits): exact Python ints, as ``reduce`` gives them, never an overflow."""
    try:
        batch = _result_batch(keys, values, stamps)
    except OverflowError:
        stamped = [None] * len(values) if stamps is None else stamps.to_pylist()
        outputs.emit_elements(list(zip(keys.to_pylist(), values, stamped, strict=True)))
        return
    outputs.emit_columns(batch)


def result_values(values: list[Any]) -> Any:
    """``values`` as an Arrow array: ints as int64, or uint64 when one is past int64 and none is negative (a
    ``min`` or ``max`` of a uint64 column); an ``OverflowError`` when no integer column holds them."""
    pa = import_pyarrow()
    try:
        return pa.array(values)
    except (OverflowError, pa.ArrowInvalid):
        try:
            return pa.array(values, pa.uint64())
        except (OverflowError, pa.ArrowInvalid) as exc:  # a negative value beside one past int64, or past 2^64
            raise OverflowError from exc


def _result_batch(keys: Any, values: list[Any], stamps: Any) -> ColumnBatch:
    """Results as a columnar batch: fields ``key``, ``value`` (and ``ts``)."""
    pa = import_pyarrow()
    columns = {"key": keys, "value": result_values(values)}
    if stamps is not None:
        columns["ts"] = stamps
    return ColumnBatch(pa.record_batch(columns), "key", "value", None if stamps is None else "ts")


def check_aggregate(
    name: str, how: Any, emit: Any, state_ttl: Any = None, window: Any = None, on_error: Any = "fail"
) -> None:
    """``aggregate``'s arguments, checked when the topology is built."""
    check_no_user_code(name, "aggregate", on_error)
    if window is not None:
        check_window(f"task '{name}'", window)
        if emit != "batch":
            raise TopologyError(f"task '{name}': aggregate on a window emits when each window fires: no emit={emit!r}")
    if state_ttl is not None:
        raise TopologyError(f"task '{name}': aggregate takes no state_ttl (its running values last the whole job)")
    if how not in AGGREGATES:
        raise TopologyError(f"task '{name}': how must be one of {AGGREGATES}, got {how!r}")
    if emit not in ("batch", "end"):
        raise TopologyError(f"task '{name}': emit must be 'batch' or 'end', got {emit!r}")


def check_window(where: str, spec: WindowSpec | None) -> None:
    """A columnar ``aggregate`` runs on a tumbling event-time ``TimeWindow`` with no other option, or none."""
    if spec is None:
        return
    plain = TimeWindow(spec.size, time="event", time_unit=spec.time_unit) if isinstance(spec, TimeWindow) else None
    if spec != plain or (isinstance(spec, TimeWindow) and spec.on_late is not None):
        raise TopologyError(
            f"{where}: a columnar aggregate runs only on a tumbling event-time window, TimeWindow(size, "
            f"time='event') (no slide, early_firing, allowed_lateness, idle_timeout, offset, on_late or "
            f"missing_ts='fail'), not {spec!r}"
        )


def check_no_user_code(name: str, kind: str, on_error: Any) -> None:
    """A columnar node calls no code of the user's: an ``on_error`` other than ``"fail"`` would promise a
    policy with nothing to apply to (a batch it cannot fold fails the job, naming the field)."""
    if on_error != "fail":
        raise TopologyError(
            f"task '{name}': {kind} calls no code of yours, so on_error={on_error!r} has nothing to apply to "
            f"(a batch it cannot compute fails the job): leave on_error='fail'"
        )


def check_expression(name: str, expression: Any, on_error: Any = "fail") -> None:
    """``where``'s expression is a ``pyarrow.compute.Expression``."""
    check_no_user_code(name, "where", on_error)
    if not isinstance(expression, import_pyarrow().compute.Expression):
        raise TopologyError(
            f"task '{name}': where takes a pyarrow.compute expression (pc.field('n') > 1), got {expression!r:.80}"
        )
