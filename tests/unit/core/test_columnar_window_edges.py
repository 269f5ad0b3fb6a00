"""The columnar window logic at its edges: rows without a time, overdue windows after a merge, the rows a
window holds before it folds them, and the order of keys whatever the threads."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

import streamlet as sl
from streamlet.core.model.columnar import FOLD_ROWS, AggregateTask
from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.windows.build import logic_for
from streamlet.core.windows.columnar import ColumnarWindowLogic, aggregate_window
from streamlet.core.windows.fold import ClosedWindow
from streamlet.core.windows.split import merge_window_snapshots

WINDOW = sl.TimeWindow(10, time="event")


def logic(how: str) -> ColumnarWindowLogic:
    """The window logic of a columnar ``aggregate(how)`` on 10 s windows."""
    return aggregate_window(WINDOW, AggregateTask(how, None, None, "batch"))  # type: ignore[arg-type]


def rows(keys: list[Any], stamps: list[Any] | None = None) -> ColumnBatch:
    """A batch of ``keys`` with the value 1 each, and their timestamps (no ts column when ``None``)."""
    columns: dict[str, Any] = {"k": keys, "n": [1] * len(keys)}
    if stamps is not None:
        columns["ts"] = stamps
    return ColumnBatch(pa.record_batch(columns), "k", "n", None if stamps is None else "ts")


def fired(windows: list[ClosedWindow]) -> list[tuple[Any, ...]]:
    """Each fired window's bounds (with their types) and its results as elements."""
    return [(w.start, w.end, type(w.start).__name__, w.columns.elements()) for w in windows]


def test_rows_without_a_ts_column_fall_in_the_window_of_the_clock() -> None:
    """A batch without ts is timed by the clock's ``now`` (25 s: window [20, 30)), with float bounds as the
    element path gives a record without ts."""
    counts = logic("count")
    assert counts.add_columns(rows(["a", "b", "a"]), now=25.0) == ([], None)
    bounds = (20.0, 30.0)
    assert fired(counts.close_all()) == [
        (*bounds, "float", [("a", 2, 29.999, 0, bounds, "on_time"), ("b", 1, 29.999, 0, bounds, "on_time")])
    ]


def test_a_row_with_a_null_ts_falls_in_the_window_of_the_clock() -> None:
    """In a ts column, a null is the clock's ``now``: that row goes to [20, 30), the others to [0, 10)."""
    counts = logic("count")
    counts.add_columns(rows(["a", "b", "a"], [1, None, 3]), now=25.0)
    assert [(w.start, w.end, w.columns.data.to_pydict()["key"]) for w in counts.close_all()] == [
        (0, 10, ["a"]),
        (20, 30, ["b"]),
    ]


def test_an_overdue_window_fires_first_on_the_next_batch() -> None:
    """Merged with an instance whose watermark passed it, an open window fires, on time, before the next batch
    is even placed: ``add_columns`` hands it over."""
    behind, ahead = logic("count"), logic("count")
    behind.add_columns(rows(["a", "a"], [1, 2]), now=0.0)
    assert behind.advance(5.0) == []
    ahead.add_columns(rows(["b"], [3]), now=0.0)
    assert fired(ahead.advance(15.0)) == [(0, 10, "int", [("b", 1, 9.999, 0, (0, 10), "on_time")])]
    merged = logic("count")
    merged.restore(unpackb(packb(merge_window_snapshots(WINDOW, [behind.snapshot(), ahead.snapshot()]))))
    caught, late = merged.add_columns(rows(["a"], [16]), now=0.0)
    assert (fired(caught), late) == ([(0, 10, "int", [("a", 2, 9.999, 0, (0, 10), "on_time")])], None)
    assert fired(merged.close_all()) == [(10, 20, "int", [("a", 1, 19.999, 0, (10, 20), "on_time")])]


def test_a_fired_window_is_not_kept_after_it_fires() -> None:
    """Without allowed lateness nothing is kept of a fired window: the snapshot right after holds none."""
    counts = logic("count")
    counts.add_columns(rows(["a"], [1]), now=0.0)
    assert len(counts.advance(10.5)) == 1
    snapshot = counts.snapshot()
    assert (snapshot["windows"], snapshot["fired"], snapshot["watermark"]) == ([], [], 10_500)


def test_a_count_holds_only_the_key_column_of_its_rows() -> None:
    """A count needs no values: a window holds the key column alone, whatever the batch's value column."""
    counts = logic("count")
    counts.add_columns(rows(["a", "b"], [1, 2]), now=0.0)
    assert [batch.schema.names for batch in counts.held[0].batches] == [["key"]]


def test_a_window_folds_its_rows_once_it_holds_fold_rows_of_them() -> None:
    """Rows wait in their window until FOLD_ROWS of them are held (over any number of batches), then are
    folded into its value per key, so memory stays bounded; the window fires the count of every row."""
    counts = logic("count")
    half = FOLD_ROWS // 2

    def ones(size: int) -> ColumnBatch:
        return ColumnBatch(pa.record_batch({"k": pa.repeat("a", size), "ts": pa.repeat(1, size)}), "k", None, "ts")

    counts.add_columns(ones(half), now=0.0)
    counts.add_columns(ones(half - 1), now=0.0)
    assert (list(counts.held), counts.windows[0].folded) == ([0], None)  # FOLD_ROWS - 1 rows wait
    counts.add_columns(ones(1), now=0.0)
    assert (counts.held, counts.windows[0].folded) == ({}, {"a": FOLD_ROWS})
    counts.add_columns(ones(1), now=0.0)
    assert [w.columns.data.to_pydict()["value"] for w in counts.close_all()] == [[FOLD_ROWS + 1]]


@pytest.fixture
def many_threads() -> Iterator[None]:
    """Arrow's thread pool at 8 threads (an ordinary server): a threaded ``group_by`` then orders its groups
    by which thread finished first."""
    before = pa.cpu_count()
    pa.set_cpu_count(8)
    yield
    pa.set_cpu_count(before)


@pytest.mark.usefixtures("many_threads")
@pytest.mark.parametrize("how", ["count", "sum", "mean"])
def test_keys_fire_in_the_order_they_first_came_whatever_the_threads(how: str) -> None:
    """A window of 64 batches, each bringing 8 new keys among keys seen before, fires its 512 keys in the
    order they first came, every time."""
    rng = random.Random(7)
    batches = [
        [f"k{8 * i + j}" for j in range(8)] + [f"k{rng.randrange(8 * i + 1)}" for _ in range(20)] for i in range(64)
    ]
    first_come = list(dict.fromkeys(key for keys in batches for key in keys))
    for _ in range(3):
        aggregated = logic(how)
        for keys in batches:
            aggregated.add_columns(rows(keys, [1] * len(keys)), now=0.0)
        [window] = aggregated.close_all()
        assert window.columns.data.to_pydict()["key"] == first_come


def test_a_restored_window_without_values_per_key_fires_with_nothing_to_emit() -> None:
    """A window restored from state that kept records, not values per key (an element-path logic's), fires
    with an empty value per key and no columns: its records are never handed to the task."""
    element_path = logic_for(WINDOW)
    element_path.add(0, [("a", 1, 1.0)], 0.0)
    counts = logic("count")
    counts.restore(unpackb(packb(element_path.snapshot())))
    assert [(w.start, w.end, w.folded, w.columns) for w in counts.close_all()] == [(0.0, 10.0, {}, None)]
