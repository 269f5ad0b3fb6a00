"""The shed policy as a pure function: the job's latency and backpressure in, a shed ratio out."""

from __future__ import annotations

from typing import Any

import pytest

import streamlet as sl
from streamlet.adaptation.shedding import decide, held_back, node_p99, path_latency, window_latency
from streamlet.core.model.histogram import LatencyHistogram

QOS = sl.QoS(max_latency=1.0, max_shed_ratio=0.5)


def test_over_the_bound_the_ratio_rises_by_half_at_least_a_step_up_to_the_qos_limit() -> None:
    ratios, current = [], 0.0
    while (shedding := decide(QOS, current, latency=2.0, held_back=0.0)) is not None:
        ratios.append(shedding.ratio)
        current = shedding.ratio
    assert ratios == [0.1, 0.2, 0.3, 0.45, 0.5]
    assert decide(QOS, 0.0, 2.0, 0.0).reason == "latency 2.000 s over 1 s and no capacity to add: shed 10%"  # type: ignore[union-attr]


def test_sources_held_back_count_as_overload_too() -> None:
    shedding = decide(QOS, 0.0, latency=0.1, held_back=0.8)
    assert shedding is not None
    assert (shedding.ratio, shedding.reason) == (0.1, "sources held back 80% and no capacity to add: shed 10%")


def test_no_shedding_while_capacity_can_be_added() -> None:
    assert decide(QOS, 0.0, latency=2.0, held_back=0.9, can_grow=True) is None


def test_once_quiet_the_ratio_falls_a_step_a_window() -> None:
    shedding = decide(QOS, 0.45, latency=0.2, held_back=0.0)
    assert shedding is not None
    assert (shedding.current, shedding.ratio) == (0.45, 0.35)
    assert shedding.reason == "latency 0.200 s, sources flowing: shed 35%"
    assert decide(QOS, 0.05, 0.2, 0.0).ratio == 0.0  # type: ignore[union-attr]
    assert decide(QOS, 0.3, latency=0.7, held_back=0.0) is None  # within the bound, not yet quiet: keep it
    assert decide(QOS, 0.0, latency=0.2, held_back=0.0) is None


def test_the_latency_of_a_job_is_its_slowest_path() -> None:
    edges = [("in", "a"), ("a", "out"), ("in", "b"), ("b", "c"), ("c", "out")]
    assert path_latency(edges, {"a": 0.5, "b": 0.2, "c": 0.2, "out": 0.1}) == pytest.approx(0.6)
    assert path_latency([("a", "b"), ("b", "a")], {"a": 1.0, "b": 2.0}) == 3.0  # a loop is walked once


def test_node_p99_merges_the_instances_histograms() -> None:
    fast, slow = LatencyHistogram(), LatencyHistogram()
    for _ in range(99):
        fast.add(0.000_003)  # bucket [2, 4) us
    slow.add(0.5)  # one in [262144, 524288) us
    assert node_p99({"t": [fast, slow]}) == {"t": 4e-6}
    slow.add(0.5)
    assert node_p99({"t": [fast, slow], "idle": [LatencyHistogram()]}) == {"t": 524288e-6}


def snapshot(node: str, kind: str, blocked: float, latencies: list[float]) -> dict[str, Any]:
    histogram = LatencyHistogram()
    for seconds in latencies:
        histogram.add(seconds)
    return {"node": node, "kind": kind, "blocked": blocked, "latency": histogram.counts}


def test_window_latency_and_held_back_from_two_sets_of_snapshots() -> None:
    before = {"in.0": snapshot("in", "source", 1.0, []), "work.0": snapshot("work", "task", 0, [0.001])}
    after = {
        "in.0": snapshot("in", "source", 2.5, []),
        "work.0": snapshot("work", "task", 0, [0.001, 0.3, 0.3]),
        "work.1": snapshot("work", "task", 0, [9.0]),  # added during the window: left out
    }
    assert window_latency(before, after, [("in", "work")]) == 524288e-6  # the window's 0.3 s, not the 1 ms
    assert held_back(before, after, 2.0) == 0.75  # blocked 1.5 s of 2


def test_a_path_across_workers_sums_its_nodes() -> None:
    """Snapshots of every worker merged: in and out on one worker, work on another, the path sums all three."""
    before = {name: snapshot(name, "task", 0, []) for name in ("in", "work", "out")}
    after = {name: snapshot(name, "task", 0, [0.1]) for name in ("in", "work", "out")}
    edges = [("in", "work"), ("work", "out")]
    merged = window_latency({f"{k}.0": v for k, v in before.items()}, {f"{k}.0": v for k, v in after.items()}, edges)
    assert merged == pytest.approx(3 * 131072e-6)


def test_a_rise_never_passes_the_qos_limit_after_rounding() -> None:
    shedding = decide(sl.QoS(max_latency=1.0, max_shed_ratio=0.12345), 0.1, latency=2.0, held_back=0.0)
    assert shedding is not None
    assert shedding.ratio == 0.12345
