"""DS2 autoscaling on synthetic snapshots: true rates from busy time, targets walked from the sources."""

from __future__ import annotations

from typing import Any

import pytest

from streamlet.adaptation.autoscale import InstanceWindow, Scaling, ds2, node_rates, windows

EDGES = [("src", "parse"), ("parse", "count"), ("count", "out")]


def window(node: str, index: int, kind: str, records_in: int, records_out: int, busy: float, blocked: float = 0.0):
    return InstanceWindow(node, index, kind, records_in, records_out, busy, blocked, 1.0)


def observed() -> list[InstanceWindow]:
    """One second: the source emitted 5 000 but was blocked half of it (it can do 10 000/s); parse (one
    instance, busy all second) took 5 000 and emitted 10 000; count (two instances, busy 0.25 s each) took
    10 000; the sink kept up."""
    return [
        window("src", 0, "source", 5_000, 5_000, 0.1, blocked=0.5),
        window("parse", 0, "task", 5_000, 10_000, 1.0),
        window("count", 0, "task", 5_000, 5_000, 0.25),
        window("count", 1, "task", 5_000, 5_000, 0.25),
        window("out", 0, "sink", 10_000, 0, 0.1),
    ]


def test_true_rates_come_from_busy_time_and_unblocked_time() -> None:
    rates = node_rates(observed())
    assert (rates["src"].true_in, rates["src"].selectivity) == (10_000.0, 1.0)
    assert (rates["parse"].true_in, rates["parse"].selectivity) == (5_000.0, 2.0)
    assert (rates["count"].true_in, rates["count"].instances) == (20_000.0, 2)


def test_ds2_scales_the_bottleneck_up_and_the_idle_task_down_in_one_decision() -> None:
    bounds = {"parse": (1, 8), "count": (1, 8)}
    decisions = ds2(EDGES, node_rates(observed()), {"parse": 1, "count": 2}, bounds, utilization=1.0)
    assert [(d.task, d.current, d.instances) for d in decisions] == [("parse", 1, 2), ("count", 2, 1)]
    assert decisions[0].reason == (
        "input 10,000 rec/s needs 2.00 instances at 5,000 rec/s per busy second each, 100% busy (DS2); "
        "had 1, bounds 1..8"
    )


def test_instances_are_sized_with_headroom() -> None:
    """At 85 % busy (the default) parse needs 10 000 / (5 000 x 0.85) = 2.35 instances, so 3; count's
    20 000/s over 20 000/s per instance needs 1.18: it keeps its 2."""
    decisions = ds2(EDGES, node_rates(observed()), {"parse": 1, "count": 2}, {"parse": (1, 8), "count": (1, 8)})
    assert decisions == [
        Scaling(
            "parse", 1, 3,
            "input 10,000 rec/s needs 2.35 instances at 5,000 rec/s per busy second each, 85% busy (DS2); "
            "had 1, bounds 1..8",
        )
    ]  # fmt: skip


def test_bounds_cap_the_decision_and_unbounded_tasks_are_left_alone() -> None:
    decisions = ds2(EDGES, node_rates(observed()), {"parse": 1, "count": 2}, {"count": (2, 4)}, utilization=1.0)
    assert decisions == []  # parse is not scaled (no bounds), count needs 1 but may not go below 2


def test_a_need_within_the_dead_band_keeps_the_parallelism() -> None:
    busy_parse = [*observed()]
    busy_parse[1] = window("parse", 0, "task", 5_000, 10_000, 0.975)  # true 5 128/s: needs 1.95 -> 2
    busy_parse[0] = window("src", 0, "source", 5_000, 5_000, 0.1, blocked=0.5)
    assert ds2(EDGES, node_rates(busy_parse), {"parse": 2}, {"parse": (1, 8)}, utilization=1.0) == []
    needs_a_bit_more = [window("src", 0, "source", 10_600, 10_600, 0.1), *observed()[1:]]  # 10 600/s: 2.12
    decisions = ds2(EDGES, node_rates(needs_a_bit_more), {"parse": 2}, {"parse": (1, 8)}, utilization=1.0)
    assert decisions == [
        Scaling(
            "parse", 2, 3,
            "input 10,600 rec/s needs 2.12 instances at 5,000 rec/s per busy second each, 100% busy (DS2); "
            "had 2, bounds 1..8",
        )
    ]  # fmt: skip


def test_a_task_that_measured_nothing_keeps_its_parallelism() -> None:
    idle = [window("src", 0, "source", 0, 0, 0.0), window("parse", 0, "task", 0, 0, 0.0)]
    assert ds2(EDGES, node_rates(idle), {"parse": 3}, {"parse": (1, 8)}) == []


def snapshot(node: str, index: int, records_in: int, busy: float) -> dict[str, Any]:
    return {
        "node": node, "index": index, "kind": "task", "records_in": records_in, "records_out": records_in,
        "batches": 0, "busy": busy, "blocked": 0.0, "queued": 0, "fill": 0.0, "state": "NORMAL", "latency": [],
    }  # fmt: skip


def test_windows_are_differences_and_skip_instances_seen_once() -> None:
    before = {"count.0": snapshot("count", 0, 1_000, 0.5), "count.1": snapshot("count", 1, 50, 0.1)}
    after = {"count.0": snapshot("count", 0, 4_000, 1.5), "count.2": snapshot("count", 2, 10, 0.1)}
    assert windows(before, after, 2.0) == [InstanceWindow("count", 0, "task", 3_000, 3_000, 1.0, 0.0, 2.0)]
    assert node_rates(windows(before, after, 2.0))["count"].true_in == pytest.approx(3_000.0)
