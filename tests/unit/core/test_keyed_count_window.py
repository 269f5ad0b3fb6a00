"""Per-key count windows (CountWindow(per_key=True)): each key's records counted on their own, driven
directly and in jobs."""

from __future__ import annotations

import re
from typing import Any

import msgpack
import pytest

import streamlet as sl
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.windows.build import logic_for
from streamlet.core.windows.fold import ClosedWindow, WindowLogic
from streamlet.core.windows.keyed_count import KeyedCountLogic
from tests.conftest import pairs, values
from tests.support.elements import el

PAIRS = sl.CountWindow(2, per_key=True)


def keyed(*keys: Any) -> list[Any]:
    """One record per key in ``keys``; each value names its key and its place in the stream (``"a3"``)."""
    return [el(key, f"{key}{index}") for index, key in enumerate(keys)]


def shown(windows: list[ClosedWindow]) -> list[tuple[float, float, list[Any]]]:
    """``(start, end, values)`` of every window."""
    return [(w.start, w.end, values(w.all_records())) for w in windows]


def add(logic: WindowLogic, batch: list[Any]) -> list[Any]:
    """The windows ``add`` closed, as :func:`shown`; nothing is ever late."""
    closed, late = logic.add(0, batch, 0.0)
    assert late == []
    return shown(closed)


STREAM = keyed("a", "b", "a", "c", "b", "a", "a", "c", "b")


def test_per_key_spec_builds_keyed_count_logic() -> None:
    """CountWindow(per_key=True) gets the keyed logic; the default stays one count over the whole stream."""
    assert type(logic_for(PAIRS)) is KeyedCountLogic
    assert type(logic_for(sl.CountWindow(2))) is not KeyedCountLogic


def test_tumbling_windows_per_key_close_in_the_order_they_fill() -> None:
    """Windows of 2 records of one key: a's first fills at a2, b's at b4, a's second at a6, c's at c7."""
    logic = logic_for(PAIRS)
    assert add(logic, STREAM) == [
        (0, 2, ["a0", "a2"]),
        (0, 2, ["b1", "b4"]),
        (2, 4, ["a5", "a6"]),
        (0, 2, ["c3", "c7"]),
    ]
    assert shown(logic.close_all()) == [(2, 3, ["b8"])]
    assert logic.close_all() == []


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_windows_do_not_depend_on_batches(size: int) -> None:
    """The stream in batches of ``size`` closes the same windows, in the same order."""
    logic = logic_for(PAIRS)
    closed = [window for first in range(0, len(STREAM), size) for window in add(logic, STREAM[first : first + size])]
    assert closed == add(logic_for(PAIRS), STREAM)


def test_sliding_windows_per_key_and_partial_windows_at_the_end() -> None:
    """CountWindow(3, slide=2, per_key): each key has [0,3), [2,5), ...; partial ones end at its last record,
    keys in the order they first came."""
    logic = logic_for(sl.CountWindow(3, slide=2, per_key=True))
    assert add(logic, keyed("a", "b", "a", "a", "b", "a", "a")) == [
        (0, 3, ["a0", "a2", "a3"]),
        (2, 5, ["a3", "a5", "a6"]),
    ]
    assert shown(logic.close_all()) == [(4, 5, ["a6"]), (0, 2, ["b1", "b4"])]


def test_per_key_windows_fold_per_key() -> None:
    """With window_reduce's fold each window holds its one key's value."""
    logic = logic_for(PAIRS)
    logic.fold = "sum"
    closed, _ = logic.add(0, [el(key, value) for key, value in [("a", 1), ("b", 10), ("a", 2), ("b", 20)]], 0.0)
    assert [(w.start, w.end, w.folded) for w in closed] == [(0, 2, {"a": 3}), (0, 2, {"b": 30})]


def test_window_keeps_records_per_port() -> None:
    """Records of two input ports go to the same per-key window, listed port by port."""
    logic = logic_for(PAIRS)
    logic.add(1, [el("a", "one")], 0.0)
    [window], _ = logic.add(0, [el("b", "x"), el("a", "zero")], 0.0)
    assert window.records == {1: [el("a", "one")], 0: [el("a", "zero")]}


def test_results_carry_the_last_event_time() -> None:
    """Like CountWindow, a per-key window's results carry its last record's event time (result_ts is None)."""
    logic = logic_for(PAIRS)
    [window], _ = logic.add(0, [el("a", 1, 5.0), el("b", 2, 6.0), el("a", 3, 7.0)], 0.0)
    assert (logic.result_ts(window), window.all_records()[-1][2]) == (None, 7.0)


SPECS = [PAIRS, sl.CountWindow(3, slide=2, per_key=True)]
BATCHES = [
    [el(("u", 1), ("v", 0)), el("b", (1, [2])), el(("u", 1), ("v", 2))],
    [el("c", (3,)), el(("u", 1), ("v", 4)), el("b", (5, [6]))],
    [el("c", (7,)), el(("u", 1), ("v", 8))],
    [el("b", (9,)), el(("u", 1), ("v", 10)), el("c", (11,)), el("d", (12,))],
    [el(("u", 1), ("v", 13)), el("b", (14,))],
]


def drive(logic: WindowLogic, batches: list[list[Any]], close: bool = True) -> list[Any]:
    """What each batch closed, then (with ``close``) what close_all gives, with records and folded values."""
    out: list[Any] = []
    for batch in [*batches, None] if close else batches:
        closed = logic.close_all() if batch is None else logic.add(0, batch, 0.0)[0]
        out.append([(w.start, w.end, pairs(w.all_records()), w.folded) for w in closed])
    return out


@pytest.mark.parametrize("how", [None, lambda acc, value: acc + value], ids=["records", "folded"])
@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_restored_logic_continues_exactly_like_the_original(spec: sl.CountWindow, how: Any) -> None:
    """Restored from an exactly encoded mid-stream snapshot: the same windows, tuple keys and values intact."""
    original = logic_for(spec)
    original.fold = how
    drive(original, BATCHES[:2], close=False)
    restored = logic_for(spec)
    restored.fold = how
    restored.restore(unpackb(packb(original.snapshot())))
    assert drive(restored, BATCHES[2:]) == drive(original, BATCHES[2:])


def test_snapshot_through_plain_msgpack_keeps_tuple_keys() -> None:
    """Plain msgpack gives lists for tuple keys; restore makes them tuples, so the key's count goes on."""
    logic = logic_for(PAIRS)
    logic.add(0, [el(("user", 1), 1)], 0.0)
    restored = logic_for(PAIRS)
    restored.restore(msgpack.unpackb(msgpack.packb(logic.snapshot()), strict_map_key=False))
    [window], _ = restored.add(0, [el(("user", 1), 2)], 0.0)
    assert (window.start, window.end, pairs(window.all_records())) == (0, 2, [(("user", 1), 1), (("user", 1), 2)])


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (sl.CountWindow(2, per_key="yes"), "window per_key must be True or False, got 'yes'"),  # type: ignore[arg-type]
        (sl.CountWindow(0, per_key=True), "window size must be > 0, got 0"),
    ],
)
def test_impossible_per_key_window_is_rejected(window: sl.CountWindow, message: str) -> None:
    """add_task refuses an impossible per-key count window, naming the task."""
    with pytest.raises(sl.TopologyError, match="^" + re.escape(f"task 'w': {message}") + "$"):
        sl.Topology("t").add_task("w", Collect, window=window)


class Collect(sl.Task):
    """Emits one record per window: key ``inputs.window``, value the window's values."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit(inputs.window, values(inputs.get()))


def test_job_task_with_per_key_count_windows() -> None:
    """A task with window=CountWindow(2, per_key=True) runs once per key's pair, then the partial ones."""
    topology = sl.Topology("pairs")
    source = topology.add_source("in", [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5), ("a", 6)])
    node = topology.add_task("w", Collect, window=PAIRS).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, batch_size=2)
    assert pairs(result.sink("out")) == [((0, 2), [1, 3]), ((0, 2), [2, 5]), ((2, 3), [6]), ((0, 1), [4])]


def test_job_window_reduce_sums_every_two_records_of_each_key() -> None:
    """window_reduce over per-key pairs: one sum per key per pair, each with its window's bounds."""
    topology = sl.Topology("pair-sums")
    source = topology.add_source("in", [("a", 1), ("b", 2), ("a", 3), ("b", 4), ("b", 8), ("a", 5), ("a", 7)])
    summed = topology.window_reduce("s", "sum", window=PAIRS).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(summed)
    result = sl.run(topology, batch_size=3)
    assert [(r.key, r.value, r.window) for r in result.sink("out")] == [
        ("a", 4, (0, 2)),
        ("b", 6, (0, 2)),
        ("a", 12, (2, 4)),
        ("b", 8, (2, 3)),
    ]


def test_records_go_to_their_own_key_whatever_their_values() -> None:
    """A record whose value is the next record's key does not take that record into its key's window."""
    logic = logic_for(PAIRS)
    assert add(logic, [el("a", "b"), el("b", "x")]) == []
    assert shown(logic.close_all()) == [(0, 1, ["b"]), (0, 1, ["x"])]
