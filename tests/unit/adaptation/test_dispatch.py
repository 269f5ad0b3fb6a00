"""Load-aware dispatch: co-location first, then the least loaded NORMAL worker, OVERLOADED last."""

from __future__ import annotations

import pytest

from streamlet.adaptation.dispatch import WorkerLoad, assign
from streamlet.errors import DispatchError

CHAIN = [("src", 0), ("split", 0), ("split", 1), ("count", 0), ("count", 1), ("out", 0)]
UPSTREAM = {
    ("split", 0): [("src", 0)],
    ("split", 1): [("src", 0)],
    ("count", 0): [("split", 0), ("split", 1)],
    ("count", 1): [("split", 0), ("split", 1)],
    ("out", 0): [("count", 0), ("count", 1)],
}


def test_everything_co_located_when_one_worker_has_room() -> None:
    """With room enough, every instance joins its upstream neighbours on one worker (no TCP hop)."""
    placed = assign(CHAIN, UPSTREAM, [WorkerLoad("w0", 8), WorkerLoad("w1", 8)])
    assert set(placed.values()) == {"w0"}


def test_capacity_spreads_the_chain_in_topological_order() -> None:
    """Capacity 3 each: the first three instances on w0, the rest on w1."""
    placed = assign(CHAIN, UPSTREAM, [WorkerLoad("w0", 3), WorkerLoad("w1", 3)])
    assert [placed[i] for i in CHAIN] == ["w0", "w0", "w0", "w1", "w1", "w1"]


def test_overloaded_workers_are_avoided() -> None:
    """An OVERLOADED worker gets nothing while a NORMAL one has room."""
    placed = assign(CHAIN, UPSTREAM, [WorkerLoad("w0", 8, overloaded=True), WorkerLoad("w1", 8)])
    assert set(placed.values()) == {"w1"}


def test_existing_load_counts() -> None:
    """A worker already running instances is filled last."""
    placed = assign([("a", 0), ("b", 0)], {}, [WorkerLoad("w0", 4, used=3), WorkerLoad("w1", 4, used=0)])
    assert placed == {("a", 0): "w1", ("b", 0): "w1"}


def test_full_cluster_still_places_everything() -> None:
    """With every worker full, instances go to the least loaded one rather than nowhere."""
    placed = assign(CHAIN, UPSTREAM, [WorkerLoad("w0", 1), WorkerLoad("w1", 1)])
    assert len(placed) == 6
    assert sorted(placed.values()).count("w0") == 3


def test_no_worker_is_an_error() -> None:
    """Nothing registered: a clear error."""
    with pytest.raises(DispatchError, match=r"^no worker is registered$"):
        assign(CHAIN, UPSTREAM, [])


def test_allowed_workers_restrict_a_task() -> None:
    """A task limited to w1 runs there even though w0 holds its upstream instances."""
    placed = assign(CHAIN, UPSTREAM, [WorkerLoad("w0", 8), WorkerLoad("w1", 8)], {"count": {"w1"}})
    assert [placed[i] for i in CHAIN] == ["w0", "w0", "w0", "w1", "w1", "w1"]


def test_a_task_allowed_nowhere_registered_is_an_error() -> None:
    """A restriction to workers that are not there names the task and the workers."""
    with pytest.raises(DispatchError, match=r"^task 'count' may run only on \['w9'\], and none of them is registered$"):
        assign(CHAIN, UPSTREAM, [WorkerLoad("w0", 8)], {"count": {"w9"}})


def test_an_instance_goes_where_its_state_is_when_that_worker_has_room() -> None:
    """count.1's state is on w1 (then w2): it goes there, not beside its upstream on w0; out.0 prefers w2,
    which is full, so it falls back to the other choice rules (co-location with its upstream: count.0 on w0
    and count.1 on w1 tie, the less loaded w1 wins)."""
    workers = [WorkerLoad("w0", 8), WorkerLoad("w1", 8), WorkerLoad("w2", 1, used=1)]
    prefer = {("count", 1): ["w1", "w2"], ("out", 0): ["w2"]}
    placed = assign(CHAIN, UPSTREAM, workers, prefer=prefer)
    assert placed == {
        ("src", 0): "w0", ("split", 0): "w0", ("split", 1): "w0", ("count", 0): "w0", ("count", 1): "w1",
        ("out", 0): "w1",
    }  # fmt: skip


def test_a_cpu_bound_task_spreads_while_cheap_stages_stay_co_located() -> None:
    """With 'split' hinted CPU-bound, its two instances take a worker each; the rest joins its upstream (each
    count instance has one split instance on each worker: a tie, which the less loaded worker wins)."""
    placed = assign(CHAIN, UPSTREAM, [WorkerLoad("w0", 8), WorkerLoad("w1", 8)], spread={"split"})
    assert [placed[i] for i in CHAIN] == ["w0", "w0", "w1", "w1", "w0", "w1"]


def test_a_spread_task_still_fills_a_worker_when_no_other_has_room() -> None:
    """Spreading yields to capacity: with w1 full, both instances of 'split' run on w0."""
    loads = [WorkerLoad("w0", 8), WorkerLoad("w1", 2, used=2)]
    placed = assign(CHAIN, UPSTREAM, loads, spread={"split"})
    assert set(placed.values()) == {"w0"}
