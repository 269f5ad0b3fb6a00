"""Tumbling event-time windows of a columnar ``aggregate``, folded per Arrow batch.

The window of each row is computed in Arrow with the element path's tick arithmetic
(:class:`~streamlet.core.windows.logic.EventTimeLogic`: the nearest tick of ``ts``, less
its remainder by the size), rows are grouped by (window, key) with ``pyarrow.compute``,
and each group's partial is merged into its window's value per key. Windows open, fire
(when the watermark reaches their end), stamp their results, count late rows and
checkpoint exactly as ``window_reduce`` does on the same window; only the folding differs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from streamlet.core.model.columnar import AggregateTask, exact_sums, mean_of, merge_partials, summable
from streamlet.core.model.columns import ColumnBatch, columns_of, import_pyarrow
from streamlet.core.model.record import Batch
from streamlet.core.model.windows import Ticks, TimeWindow, WindowSpec
from streamlet.core.windows.fold import ClosedWindow
from streamlet.core.windows.logic import EventTimeLogic

#: Resolves a batch's (key, field) column names for the aggregate (``AggregateTask.key_and_field``).
Fields = Callable[[ColumnBatch], tuple[str, str | None]]

_START = "__window_start"  # the column of each row's window start tick (a name no user column has)


def aggregate_window(spec: WindowSpec, task: AggregateTask) -> ColumnarWindowLogic:
    """The window logic of a columnar ``aggregate`` on ``spec`` (validated: see ``check_window``)."""
    assert isinstance(spec, TimeWindow)
    return ColumnarWindowLogic(spec, task.how, task.key_and_field)


class ColumnarWindowLogic(EventTimeLogic):
    """A tumbling event-time ``TimeWindow`` aggregated per Arrow batch (``count``/``sum``/``min``/``max``/``mean``).

    Window values are kept folded per key (``mean``: ``[sum, count]``, divided when the window fires),
    so :meth:`snapshot` is the element path's and restores the same way.
    """

    def __init__(self, spec: TimeWindow, how: str, fields: Fields) -> None:
        super().__init__(spec.size, spec.size, 0.0, None, Ticks(spec.time_unit))
        self.how, self.fields = how, fields

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        """Elements (the input is not columnar): as columns ``key``, ``value``, ``ts``; late ones as they came."""
        closed, late = self.add_columns(columns_of(batch), now)
        return closed, [] if late is None else list(itertools.compress(batch, late.to_pylist()))

    def add_columns(self, batch: ColumnBatch, now: float) -> tuple[list[ClosedWindow], Any]:
        """Fold ``batch`` into its windows; the windows overdue after a restore, and the mask of its late rows
        (``None`` when none is late)."""
        caught = self._catch_up() if self.overdue else []
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
        self._fold(batch, key, field, starts, late, whole_seconds)
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

    def _fold(self, batch: ColumnBatch, key: str, field: str | None, starts: Any, late: Any, whole: bool) -> None:
        pa = import_pyarrow()
        columns = {_START: starts, "key": batch.data.column(key)}
        if field is not None and self.how != "count":
            column = batch.data.column(field)
            columns["field"] = summable(column) if self.how in ("sum", "mean") else column
        table = pa.table(columns)
        if late is not None:
            table = table.filter(pa.compute.invert(late))
            if not table.num_rows:
                return
        self.whole_seconds = whole
        grouped = table.group_by([_START, "key"], use_threads=False).aggregate(self._aggregations())
        window_starts, keys = grouped.column(_START).to_pylist(), grouped.column("key").to_pylist()
        parts = self._parts(grouped)
        groups = sorted(range(len(keys)), key=window_starts.__getitem__)  # stable: keys keep their order
        for start, members in itertools.groupby(groups, key=window_starts.__getitem__):
            chosen = list(members)
            window = self.window(start)
            if window.folded is None:
                window.folded = {}
            merge_partials(window.folded, [keys[i] for i in chosen], [parts[i] for i in chosen], self.how)

    def _aggregations(self) -> list[Any]:
        pc = import_pyarrow().compute
        if self.how == "count":
            return [("key", "count", pc.CountOptions(mode="all"))]
        if self.how == "mean":
            return [("field", "sum"), ("field", "count")]  # the count of valid values, as the sum
        return [("field", self.how)]

    def _parts(self, grouped: Any) -> list[Any]:
        if self.how == "count":
            return list(grouped.column("key_count").to_pylist())
        if self.how == "mean":
            sums, counts = exact_sums(grouped.column("field_sum")), grouped.column("field_count").to_pylist()
            return [[total, count] if count else None for total, count in zip(sums, counts, strict=True)]
        if self.how == "sum":
            return exact_sums(grouped.column("field_sum"))
        return list(grouped.column(f"field_{self.how}").to_pylist())

    def close_until(self, tick: float) -> list[ClosedWindow]:
        """The windows ending by ``tick``, with their values final (``mean``: the sum over the count)."""
        closed = super().close_until(tick)
        if self.how == "mean":
            for window in closed:
                if window.folded is not None:
                    window.folded = {key: mean_of(pair) for key, pair in window.folded.items()}
        return closed
