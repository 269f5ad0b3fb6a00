"""``inputs.get()`` hands out record views refilled wake-up after wake-up: never one the task kept."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.model import views
from streamlet.core.model.record import WindowRecord
from streamlet.core.model.views import RecordViews

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


def test_a_record_let_go_is_refilled_and_a_kept_one_is_never_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Position by position: the record of a batch nobody holds is refilled with the next batch's element
    (the same object, no record made); one the task kept keeps its fields and the position gets a new view."""
    made: list[int] = []
    original = views.new_view

    def counted() -> sl.Record:
        made.append(1)
        return original()

    monkeypatch.setattr(views, "new_view", counted)
    pool = RecordViews()
    first = pool.records_of([("a", 1, 1.0), ("b", 2, 2.0)])
    kept, let_go = first[0], id(first[1])  # an id, not a reference: holding it would keep it
    del first
    made.clear()
    second = pool.records_of([("c", 3, 3.0), ("d", 4, 4.0)])
    assert [(r.key, r.value, r.ts) for r in second] == [("c", 3, 3.0), ("d", 4, 4.0)]
    assert (kept.key, kept.value, kept.ts) == ("a", 1, 1.0)
    # One view made (position 0's); position 1 is the record handed out before, alive all along in the pool.
    assert (len(made), second[0] is kept, id(second[1]) == let_go) == (1, False, True)


def test_a_record_still_in_the_last_list_handed_out_is_not_refilled() -> None:
    """Keeping the whole list keeps every record in it."""
    pool = RecordViews()
    first = pool.records_of([("a", 1, None), ("b", 2, None)])
    second = pool.records_of([("c", 3, None), ("d", 4, None)])
    assert [r.key for r in first] == ["a", "b"]
    assert [r.key for r in second] == ["c", "d"]


def test_positions_past_the_limit_and_wide_elements_get_records_of_their_own() -> None:
    """A batch longer than the limit gets new records past it; a window's six-wide element its own
    ``WindowRecord``, between views."""
    pool = RecordViews(limit=2)
    window = (0.0, 60.0)
    batch = [("a", 1, 1.0), ("w", 9, 59.0, 0, window, "on_time"), ("c", 3, 3.0), ("d", 4, 4.0)]
    records = pool.records_of(batch)
    assert [type(r) for r in records] == [sl.Record, WindowRecord, sl.Record, sl.Record]
    assert records[1].window == window
    held = list(records)
    del records
    again = pool.records_of(batch)
    assert [r is h for r, h in zip(again, held, strict=True)] == [False, False, False, False]


def test_where_reference_counts_cannot_be_trusted_every_record_is_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyPy or a free-threaded build: nothing is refilled."""
    monkeypatch.setattr(views, "getrefcount", views.never_free)
    pool = RecordViews()
    first = pool.records_of([("a", 1, None)])
    identity = id(first[0])
    record = first[0]
    del first
    second = pool.records_of([("b", 2, None)])
    assert (record.key, second[0].key, id(second[0]) == identity) == ("a", "b", False)


class KeepEveryThird(sl.Task):
    """Keeps every third record it reads (the records themselves) and emits them at the end; counts the rest."""

    def prepare(self, config: dict[str, Any]) -> None:
        self.kept: list[sl.Record] = []
        self.seen = 0

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            if record.value % 3 == 0:
                self.kept.append(record)
            self.seen += 1

    def finish(self, outputs: sl.Outputs) -> None:
        for record in self.kept:
            outputs.emit(record.key, record.value)
        outputs.emit("seen", self.seen)


def test_records_a_task_keeps_across_wake_ups_stay_as_they_were_read() -> None:
    """Over a hundred wake-ups of 10 records, the records a task kept (in a list on itself) still hold what
    they held when it read them."""
    topology = sl.Topology("keep")
    source = topology.add_source("in", [(f"k{i}", i) for i in range(1000)])
    keep = topology.add_task("keep", KeepEveryThird).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(keep)
    result = sl.run(topology, batch_size=10)
    expected = [(f"k{i}", i) for i in range(0, 1000, 3)] + [("seen", 1000)]
    assert [(r.key, r.value) for r in result.sink("out")] == expected


@pytest.mark.parametrize(
    ("implementation", "version", "gil", "reuses"),
    [
        ("cpython", (3, 11, 7), True, True),
        ("cpython", (3, 12, 0), True, True),
        ("cpython", (3, 13, 5), True, True),
        ("cpython", (3, 13, 5), False, False),  # a free-threaded build: approximate counts
        ("cpython", (3, 14, 0), True, False),  # borrowed stack references: a held record may look free
        ("cpython", (3, 15, 0), True, False),  # not proven yet
        ("cpython", (3, 10, 12), True, False),
        ("pypy", (3, 11, 0), True, False),
    ],
)
def test_records_are_reused_only_where_the_reference_count_rule_is_proven(
    implementation: str, version: tuple[int, ...], gil: bool, reuses: bool
) -> None:
    """CPython 3.11 to 3.13 with its GIL; a record per element anywhere else."""
    assert views.counts_exactly(implementation, version, gil) is reuses


class FakedVersion(tuple):  # type: ignore[type-arg]
    """``sys.version_info`` as another CPython would have it."""

    major = property(lambda self: self[0])
    minor = property(lambda self: self[1])


def views_loaded_on(version: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh copy of the views module, loaded while ``sys.version_info`` says ``version``."""
    monkeypatch.setattr(sys, "version_info", FakedVersion((*version, "final", 0)))
    spec = importlib.util.spec_from_file_location("faked_views", views.__file__)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("version", "reuses"), [((3, 14, 0), False), ((3, 13, 1), True), ((3, 11, 7), True)])
def test_the_switch_follows_the_version_the_interpreter_says(
    version: tuple[int, ...], reuses: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded on a faked 3.14, records are never reused (every one is new); on 3.11 to 3.13 they are."""
    faked = views_loaded_on(version, monkeypatch)
    assert faked.EXACT_COUNTS is reuses
    assert (faked.getrefcount is sys.getrefcount) is reuses
    pool = faked.RecordViews()
    first = pool.records_of([("a", 1, None)])
    identity = id(first[0])
    del first  # let go: a reusing pool refills the same view
    second = pool.records_of([("b", 2, None)])
    assert (id(second[0]) == identity) is reuses
