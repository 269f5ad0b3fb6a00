"""Tumbling event-time windows of a columnar ``aggregate``: rows held in Arrow, aggregated once when a window fires.

The window of each row is computed in Arrow with the element path's tick arithmetic
(:class:`~streamlet.core.windows.logic.EventTimeLogic`: the nearest tick of ``ts``, less
its remainder by the size). Each open window holds the (key, field) columns of its rows
as they came (slices of the input batches, no copy); when the watermark reaches its end
the window is aggregated with one ``group_by`` over them and leaves as one Arrow batch
(:class:`~streamlet.core.model.columns.ColumnBatch` with ``window_start``/``window_end``
columns): no Python object per row or per result on the way. A non-columnar receiver gets
its records from the sending route, made once, as ``window_reduce``'s.

Windows open, fire, stamp their results, count late rows and checkpoint exactly as
``window_reduce`` does on the same window. A snapshot settles the rows held into each
window's value per key (``folded``, the element path's form), so checkpoints, restores and
the split of state by key (``core/windows/split.py``) are the element path's; rows that come
after it are held again, and the two are merged when the window fires.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from streamlet.core.model.columnar import (
    FOLD_ROWS,
    AggregateTask,
    decoded,
    exact_sums,
    grouped_in_order,
    mean_of,
    merge_partials,
    summable,
)
from streamlet.core.model.columns import ColumnBatch, columns_of, import_pyarrow
from streamlet.core.model.record import Batch
from streamlet.core.model.windows import Ticks, TimeWindow, WindowSpec
from streamlet.core.windows.fold import ClosedWindow
from streamlet.core.windows.logic import EventTimeLogic

#: Resolves a batch's (key, field) column names for the aggregate (``AggregateTask.key_and_field``).
Fields = Callable[[ColumnBatch], tuple[str, str | None]]

#: The columns of a fired window's results.
RESULT_COLUMNS = ("key", "value", "ts", "window_start", "window_end")


def aggregate_window(spec: WindowSpec, task: AggregateTask) -> ColumnarWindowLogic:
    """The window logic of a columnar ``aggregate`` on ``spec`` (validated: see ``check_window``)."""
    assert isinstance(spec, TimeWindow)
    return ColumnarWindowLogic(spec, task.how, task.key_and_field)


class _Held:
    """The rows one open window holds: record batches of one schema (``key``, and ``field`` but for count)."""

    __slots__ = ("batches", "rows")

    def __init__(self) -> None:
        self.batches: list[Any] = []
        self.rows = 0


class ColumnarWindowLogic(EventTimeLogic):
    """A tumbling event-time ``TimeWindow`` aggregated in Arrow (``count``/``sum``/``min``/``max``/``mean``).

    Fired windows carry their results in ``ClosedWindow.columns``; a window whose results do not fit an
    Arrow batch as the element path gives them (a sum past 64 bits, tuple keys restored from a snapshot)
    carries them in ``folded`` instead, emitted as records.
    """

    def __init__(self, spec: TimeWindow, how: str, fields: Fields) -> None:
        super().__init__(spec.size, spec.size, 0.0, None, Ticks(spec.time_unit))
        self.how, self.fields = how, fields
        self.held: dict[int, _Held] = {}  # by window start tick: rows not aggregated yet
        self._checked: Any = None  # the last schema checked to aggregate (a batch it cannot take fails on arrival)

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        """Elements (the input is not columnar): as columns ``key``, ``value``, ``ts``; late ones as they came."""
        closed, late = self.add_columns(columns_of(batch), now)
        return closed, [] if late is None else list(itertools.compress(batch, late.to_pylist()))

    def add_columns(self, batch: ColumnBatch, now: float) -> tuple[list[ClosedWindow], Any]:
        """Hold ``batch``'s rows in their windows; the windows overdue after a restore, and the mask of its late
        rows (``None`` when none is late)."""
        caught = self._catch_up()  # the overdue windows, if any (none unless restored: see _catch_up)
        self.last_arrival = now
        if not len(batch):
            return caught, None
        key, field = self.fields(batch)
        starts, whole_seconds = self._start_ticks(batch, now)
        late = None
        if self.watermark > -float("inf"):
            mask = import_pyarrow().compute.less_equal(starts, self.watermark - self.size_ticks)
            if mask.true_count:
                self.late += mask.true_count
                late = mask
        self._hold_rows(batch, key, field, starts, late, whole_seconds)
        return caught, late

    def _start_ticks(self, batch: ColumnBatch, now: float) -> tuple[Any, bool]:
        """Each row's window start tick (``floor(ts * per_second + 0.5)`` less its remainder by the size, as
        ``EventTimeLogic.add``; a missing ts is the clock's ``now``) and whether the timestamps are ints."""
        pa = import_pyarrow()
        pc = pa.compute
        if batch.ts is None:
            stamps, whole_seconds = pa.array([now] * len(batch), pa.float64()), False
        else:
            column = batch.data.column(batch.ts)
            whole_seconds = pa.types.is_integer(column.type)
            stamps = pc.fill_null(pc.cast(column, pa.float64()), now)
        ticks = pc.cast(pc.floor(pc.add(pc.multiply(stamps, self.ticks.per_second), 0.5)), pa.int64())
        return pc.subtract(ticks, pc.modulo(ticks, self.size_ticks)), whole_seconds

    def _hold_rows(self, batch: ColumnBatch, key: str, field: str | None, starts: Any, late: Any, whole: bool) -> None:
        """The batch's rows (but the late ones) into their windows: whole when they share one (streams are mostly
        in order), else cut by window after a stable sort (rows keep their order within a window)."""
        pa = import_pyarrow()
        pc = pa.compute
        columns = {"key": batch.data.column(key)}
        if field is not None and self.how != "count":
            columns["field"] = batch.data.column(field)
        rows = pa.record_batch(columns)
        if late is not None:
            kept = pc.invert(late)
            rows, starts = rows.filter(kept), starts.filter(kept)
            if not rows.num_rows:
                return
        self._check(rows)
        self.whole_seconds = whole
        low, high = (value.as_py() for value in pc.min_max(starts).values())
        if low == high:
            self._hold(low, rows)
            return
        order = pc.sort_indices(starts)
        rows, counted = rows.take(order), pc.value_counts(starts.take(order))  # counts in ascending start order
        offset = 0
        for start, count in zip(counted.field(0).to_pylist(), counted.field(1).to_pylist(), strict=True):
            self._hold(start, rows.slice(offset, count))
            offset += count

    def _check(self, rows: Any) -> None:
        """Aggregate one row of the first batch of each schema: a batch the aggregate cannot take (a sum of
        strings) fails as it arrives, named by the task instance, not later when its window fires."""
        if rows.schema != self._checked:
            self._grouped([rows.slice(0, 1)])
            self._checked = rows.schema

    def _hold(self, start: int, rows: Any) -> None:
        window = self.window(start)
        held = self.held.get(start)
        if held is None:
            held = self.held[start] = _Held()
        elif rows.schema != held.batches[0].schema:
            self._settle(start, window)  # one group_by takes one schema: the rows held so far are folded first
            held = self.held[start] = _Held()
        held.batches.append(rows)
        held.rows += rows.num_rows
        if held.rows >= FOLD_ROWS or _dictionary(rows.schema):
            # memory stays bounded however long the window; dictionary columns may each carry a dictionary
            # of their own, which one group_by over them refuses to unify
            self._settle(start, window)

    def _grouped(self, batches: list[Any]) -> Any:
        """One ``group_by("key")`` over ``batches``: keys in the order they first came, and their aggregates."""
        pa = import_pyarrow()
        pc = pa.compute
        table = pa.Table.from_batches(batches)
        if self.how == "count":
            return grouped_in_order(table, "key", [("key", "count", pc.CountOptions(mode="all"))])
        table = table.set_column(1, "field", decoded(table.column("field")))
        if self.how in ("sum", "mean"):
            table = table.set_column(1, "field", summable(table.column("field")))
        if self.how == "mean":  # the count of valid values, as the sum
            return grouped_in_order(table, "key", [("field", "sum"), ("field", "count")])
        return grouped_in_order(table, "key", [("field", self.how)])

    def _parts(self, grouped: Any) -> list[Any]:
        """The grouped aggregates as Python values (``mean``: ``[sum, count]`` pairs), as ``folded`` keeps them."""
        if self.how == "count":
            return list(grouped.column("key_count").to_pylist())
        if self.how == "mean":
            sums, counts = exact_sums(grouped.column("field_sum")), grouped.column("field_count").to_pylist()
            return [[total, count] if count else None for total, count in zip(sums, counts, strict=True)]
        if self.how == "sum":
            return exact_sums(grouped.column("field_sum"))
        return list(grouped.column(f"field_{self.how}").to_pylist())

    def _settle(self, start: int, window: ClosedWindow) -> None:
        """Fold the rows held for ``window`` (starting at tick ``start``) into its value per key (``folded``)."""
        held = self.held.pop(start, None)
        if held is None:
            return
        grouped = self._grouped(held.batches)
        if window.folded is None:
            window.folded = {}
        merge_partials(window.folded, grouped.column("key").to_pylist(), self._parts(grouped), self.how)

    def close_until(self, tick: float) -> list[ClosedWindow]:
        """The windows ending by ``tick``, each with its results: an Arrow batch (``columns``), or ``folded``."""
        closed = super().close_until(tick)
        for window in closed:
            self._results(window)
        return closed

    def _results(self, window: ClosedWindow) -> None:
        start = self.ticks.of(window.start)
        held = self.held.get(start)
        if window.folded is None and held is not None:  # the common case: rows only, in Arrow from end to end
            del self.held[start]
            window.columns = self._columns(window, self._grouped(held.batches))
            return
        self._settle(start, window)  # held rows and a value settled by a snapshot (or a restore): merged per key
        if window.folded:
            window.columns = self._columns_of_folded(window, window.folded)
        elif window.folded is None:
            window.folded = {}  # nothing to emit (never left None: the task would run on the window's records)

    def _columns(self, window: ClosedWindow, grouped: Any) -> ColumnBatch | None:
        """A fired window's results from its ``group_by``; ``None`` (``folded`` set instead) when they do not fit
        Arrow as the element path gives them."""
        pa = import_pyarrow()
        if self.how == "count":
            return self._batch(window, grouped.column("key"), grouped.column("key_count"))
        if self.how in ("min", "max"):
            return self._batch(window, grouped.column("key"), grouped.column(f"field_{self.how}"))
        if self.how == "sum" and not pa.types.is_decimal(grouped.column("field_sum").type):
            return self._batch(window, grouped.column("key"), grouped.column("field_sum"))
        # a decimal sum (past 64 bits) or a mean: exact in Python, as the element path computes them
        window.folded = dict(zip(grouped.column("key").to_pylist(), self._parts(grouped), strict=True))
        return self._columns_of_folded(window, window.folded)

    def _columns_of_folded(self, window: ClosedWindow, folded: dict[Any, Any]) -> ColumnBatch | None:
        pa = import_pyarrow()
        values = [mean_of(pair) for pair in folded.values()] if self.how == "mean" else list(folded.values())
        try:
            batch = self._batch(window, pa.array(list(folded)), pa.array(values))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            batch = None  # tuple keys, an int past 64 bits: its records, as window_reduce makes them
        if batch is not None:
            window.folded = None
        elif self.how == "mean":
            window.folded = dict(zip(folded, values, strict=True))
        return batch

    def _batch(self, window: ClosedWindow, keys: Any, values: Any) -> ColumnBatch:
        """The results of ``window`` as one record batch: per key its value, the result time and the bounds."""
        pa = import_pyarrow()
        rows = len(keys)
        stamp = self.result_ts(window)
        columns = [_array(pa, keys), _array(pa, values), pa.repeat(pa.scalar(stamp, pa.float64()), rows)]
        for bound in (window.start, window.end):  # int bounds for int timestamps, as the element path gives
            columns.append(pa.repeat(pa.scalar(bound, pa.int64() if type(bound) is int else pa.float64()), rows))
        data = pa.RecordBatch.from_arrays(columns, names=list(RESULT_COLUMNS))
        return ColumnBatch(data, "key", "value", "ts", window_start="window_start", window_end="window_end")

    def snapshot(self) -> Any:
        """The element path's snapshot: the rows held are settled into each window's value per key first."""
        for start in list(self.held):
            self._settle(start, self.windows[start])
        return super().snapshot()

    def restore(self, snapshot: Any) -> None:
        """Continue from :meth:`snapshot`'s data (the windows' values per key; no rows held)."""
        super().restore(snapshot)
        self.held = {}


def _dictionary(schema: Any) -> bool:
    types = import_pyarrow().types
    return any(types.is_dictionary(column.type) for column in schema)


def _array(pa: Any, column: Any) -> Any:
    """A column of a ``group_by`` result (chunked) as one array."""
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
