"""A brute-force model of the columnar ``aggregate`` of docs/columnar.md, written from the page alone.

The input is the list of batches a ``ColumnarSource`` reads, each a list of rows ``(key, value, ts)`` as plain
Python values (a dictionary-encoded column already decoded to the values it stands for, a null as ``None``):
the key and field columns the aggregate folds and the row's event time. Every answer is recomputed from the
rows with Python's exact integers, never with Arrow.

What the page says, and the decisions written into it where it was silent:

* ``count`` counts the rows of a key (a row whose field is null too, as ``window_reduce``'s ``"count"`` counts
  records); ``sum``, ``min``, ``max`` and ``mean`` skip null fields (SQL) and are null for a key none of whose
  rows has one. ``mean`` is the float nearest to the exact sum divided by the number of non-null fields.
* Integer results are exact, past 64 bits too (a Python int). Float sums are left to the tests, which use
  values whose sums are exact in any order.
* ``emit="batch"``: after each batch, one result per key the batch touched, in the order the keys first appear
  in it, with the key's value then (over every batch so far) and the ``ts`` of its last row in the batch.
* ``emit="end"``: every key's final value once the input ends, in the order the keys first came, with
  ``ts=None`` (what ``finish`` emits without ``ts=`` has none, docs/model.md).
* The windowed form (tumbling event-time ``TimeWindow(size)``, allowed lateness 0): the source's watermark after
  each batch is the largest event time read so far minus ``out_of_orderness``; a row is late when its window's
  end (in ticks) is at or before the watermark's nearest tick; a window fires when the watermark's tick reaches
  its end, windows in the order of their ends, and at the end of the input every open window fires. A window's
  results are one per key, keys in the order they first came into it, stamped with the window's last tick.
  Late rows leave unchanged (the source's record), in the order they came. Rows a ``where`` drops still moved
  the source's watermark (it comes from the sources, docs/windows.md).
* A null key is a key like any other (SQL's GROUP BY), in its place in the order of the keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

Row = tuple[Any, Any, Any]  # (key, field value, ts)
HOWS = ("count", "sum", "min", "max", "mean")


@dataclass
class Acc:
    """One key's fold: rows, non-null fields, their exact sum, min and max."""

    rows: int = 0
    values: int = 0
    total: Any = None
    low: Any = None
    high: Any = None

    def add(self, value: Any) -> None:
        self.rows += 1
        if value is None:
            return
        self.values += 1
        self.total = value if self.total is None else self.total + value
        self.low = value if self.low is None or value < self.low else self.low
        self.high = value if self.high is None or value > self.high else self.high

    def result(self, how: str) -> Any:
        if how == "count":
            return self.rows
        if how == "sum":
            return self.total
        if how == "min":
            return self.low
        if how == "max":
            return self.high
        if how == "mean":
            if self.values == 0:
                return None
            if isinstance(self.total, int):
                return float(Fraction(self.total, self.values))  # the nearest float to the exact quotient
            return self.total / self.values
        raise ValueError(how)


def aggregate(batches: Sequence[Sequence[Row]], how: str, emit: str = "batch") -> list[Row]:
    """Every result ``(key, value, ts)`` the aggregate emits, in order, for one instance that reads ``batches``."""
    accs: dict[Any, Acc] = {}
    out: list[Row] = []
    for batch in batches:
        touched: dict[Any, Any] = {}  # key -> ts of its last row in the batch, in order of first appearance
        for key, value, ts in batch:
            accs.setdefault(key, Acc()).add(value)
            touched[key] = ts
        if emit == "batch":
            out.extend((key, accs[key].result(how), ts) for key, ts in touched.items())
    if emit == "end":
        out.extend((key, acc.result(how), None) for key, acc in accs.items())
    return out


# ----------------------------------------------------------------------------------------------- windows


@dataclass
class WindowResult:
    key: Any
    value: Any
    ts: float
    window: tuple[Any, Any]
    moment: int  # the index of the watermark (or the end of input) that fired it


@dataclass
class _Window:
    accs: dict[Any, Acc] = field(default_factory=dict)


def window_aggregate(
    batches: Sequence[Sequence[Row]],
    how: str,
    size_ticks: int,
    out_of_orderness_ticks: int,
    ticks_per_second: int = 1000,
    int_bounds: bool = False,
    keep: Callable[[Any], bool] | None = None,
) -> tuple[list[WindowResult], list[Row]]:
    """(results, late rows) of ``aggregate(how, window=TimeWindow(size, time="event"))`` over one source instance
    reading ``batches`` (rows ``(key, value, ts, ...)``: a late row is given back whole); times in whole ticks
    (``ts`` are seconds on the grid of ``1 / ticks_per_second``).
    ``int_bounds``: the ts column is an integer one, so the window bounds are ints. ``keep``: the rows a ``where``
    before the aggregate keeps (the others still move the source's watermark, never the window's rows)."""

    def tick(ts: Any) -> int:
        return round(Fraction(ts) * ticks_per_second)

    def seconds(t: int) -> Any:
        if int_bounds:
            assert t % ticks_per_second == 0
            return t // ticks_per_second
        return t / ticks_per_second  # the float nearest to the exact time

    windows: dict[int, _Window] = {}  # window start tick -> its keys' folds, keys in the order they came
    watermark: int | None = None
    newest: int | None = None
    results: list[WindowResult] = []
    late: list[Row] = []
    moment = 0

    def fire(upto: int | None) -> None:
        for start in sorted(windows):
            end = start + size_ticks
            if upto is not None and end > upto:
                break
            for key, acc in windows.pop(start).accs.items():
                results.append(
                    WindowResult(
                        key, acc.result(how), (end - 1) / ticks_per_second, (seconds(start), seconds(end)), moment
                    )
                )

    for batch in batches:
        for row in batch:
            if keep is not None and not keep(row):
                continue
            key, value, ts = row[:3]
            t = tick(ts)
            start = t // size_ticks * size_ticks
            if watermark is not None and start + size_ticks <= watermark:
                late.append(row)  # the row as it came (a row may carry more than key, value and ts)
                continue
            windows.setdefault(start, _Window()).accs.setdefault(key, Acc()).add(value)
        for row in batch:  # the watermark counts every row the source read, late ones too
            newest = tick(row[2]) if newest is None else max(newest, tick(row[2]))
        if newest is not None:
            mark = newest - out_of_orderness_ticks
            if watermark is None or mark > watermark:
                watermark = mark
                fire(watermark)
        moment += 1
    fire(None)
    return results, late
