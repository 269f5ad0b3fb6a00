"""The dashboard's views and the Prometheus families, from synthetic readings (no server, no clock)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from streamlet.backends.monitor.metrics import exposition
from streamlet.backends.monitor.views import Rates, Reading, Timeline, cluster_view, job_view
from streamlet.core.model.histogram import LatencyHistogram


def snapshot(records_in: int, records_out: int, latencies: list[float], kind: str = "task") -> dict[str, Any]:
    """An instance's statistics snapshot as a heartbeat carries it."""
    histogram = LatencyHistogram()
    for seconds in latencies:
        histogram.add(seconds)
    return {
        "node": "count", "index": 0, "kind": kind, "records_in": records_in, "records_out": records_out,
        "batches": records_in // 10, "busy": 0.0, "blocked": 0.0, "queued": 2, "fill": 0.5, "state": "YELLOW",
        "latency": histogram.counts, "segments": {}, "shed": 0, "ports": [2, 0],
        "loop_held": 0.0 if kind == "source" else 2.5,
    }  # fmt: skip


GRAPH = {
    "nodes": [
        {"name": "words", "kind": "source", "parallelism": 1},
        {"name": "count", "kind": "task", "parallelism": 1},
    ],
    "edges": [{"from": "words", "to": "count", "out_port": 0, "in_port": 0, "partitioning": "SAME_KEY"}],
}


def reading(at: float, counted: int, latencies: list[float]) -> Reading:
    """One job 'wc' on two workers: the source on w0, count on w1 (``counted`` records in and out so far)."""
    samples = [
        {"worker": "w0", "load": {"cpu_share": 0.25, "rss_bytes": 30 << 20, "loop_lag": 1.25,
                                  "instances": {"wc/words.0": snapshot(0, counted, [], kind="source")}}},
        {"worker": "w1", "load": {"cpu_share": 0.5, "rss_bytes": 31 << 20,
                                  "instances": {"wc/count.0": snapshot(counted, counted, latencies)},
                                  "jobs": {"wc": {"late": 3, "dead_lettered": 1, "shed": 0, "dropped": 0,
                                                  "restarts": 0, "checkpoints": 4,
                                                  "checkpoint_durations": LatencyHistogram().counts}}}},
    ]  # fmt: skip
    workers = [
        {"id": worker, "address": f"127.0.0.{n + 2}:1", "state": "LIVE/running", "load": "NORMAL", "cpu": 0,
         "queued": 0, "rss_mb": 30.0, "labels": [], "instances": [], "stale": False}
        for n, worker in enumerate(("w0", "w1"))
    ]  # fmt: skip
    status = {
        "cluster": "c",
        "leader": {"name": "master-0", "epoch": 3},
        "candidates": ["master-0"],
        "workers": workers,
    }
    job = {"name": "wc", "state": "RUNNING", "reason": "running on w0, w1", "attempt": 1, "reconfigurations": 0,
           "instances": {"words.0": "w0", "count.0": "w1"}, "decisions": [], "graph": GRAPH,
           "checkpoint": {"epoch": 4, "attempt": 1, "at": at}}  # fmt: skip
    return Reading(at, status, samples, [job])


def test_rates_are_differences_over_the_window_and_latency_quantiles_come_from_its_histogram() -> None:
    """1000 records in 2 s: 500/s in and out; the window's latencies (all 3 ms) give p50 = p99 = 4.096 ms
    (the upper bound of their doubling bucket); before a second reading nothing is known."""
    rates = Rates()
    first = rates.update(10.0, {"wc/count.0": snapshot(1000, 1000, [0.001] * 50)})
    assert first["wc/count.0"] == {"in_per_s": 0.0, "out_per_s": 0.0, "p50_ms": None, "p99_ms": None}
    second = rates.update(12.0, {"wc/count.0": snapshot(2000, 2000, [0.001] * 50 + [0.003] * 40)})
    assert second["wc/count.0"] == {"in_per_s": 500.0, "out_per_s": 500.0, "p50_ms": 4.096, "p99_ms": 4.096}


def test_a_sample_read_again_keeps_its_rate_and_the_next_spans_the_samples() -> None:
    """Readings at 10, 11 and 12 s of samples taken at 9.5, 9.5 (the same, read again) and 11.5 s: the second
    reading shows the rate the first pair gave (no 0 for a sample the worker has not refreshed yet), the third
    divides 1000 records by the 2 s between the samples."""
    rates = Rates()
    rates.update(9.0, {"wc/count.0": snapshot(0, 0, [])}, {"wc/count.0": 8.5})
    first = rates.update(10.0, {"wc/count.0": snapshot(1000, 1000, [0.001] * 50)}, {"wc/count.0": 9.5})
    again = rates.update(11.0, {"wc/count.0": snapshot(1000, 1000, [0.001] * 50)}, {"wc/count.0": 9.5})
    later = rates.update(12.0, {"wc/count.0": snapshot(2000, 2000, [0.001] * 90)}, {"wc/count.0": 11.5})
    assert [r["wc/count.0"]["in_per_s"] for r in (first, again, later)] == [1000.0, 1000.0, 500.0]


def test_the_views_show_workers_the_allocation_matrix_the_graph_with_edge_rates_and_the_job_counters() -> None:
    """Two readings 1 s apart: the view has both workers with their rates, each instance's cell, the edge's
    rate (count's input), the queue state, and the job's late and dead-lettered counts."""
    rates, timeline = Rates(), Timeline()
    rates.update(100.0, _snapshots(reading(100.0, 0, [])))
    later = reading(101.0, 750, [0.0005] * 10)
    found = rates.update(101.0, _snapshots(later))
    cluster = cluster_view(later, found)
    assert [(w["id"], w["in_per_s"], w["out_per_s"]) for w in cluster["workers"]] == [
        ("w0", 0.0, 750.0), ("w1", 750.0, 750.0),
    ]  # fmt: skip
    assert cluster["matrix"] == {
        "workers": ["w0", "w1"],
        "cells": [{"instance": "wc/count.0", "worker": "w1"}, {"instance": "wc/words.0", "worker": "w0"}],
    }
    assert cluster["leader"] == {"name": "master-0", "epoch": 3}
    job = job_view(later, later.jobs[0], found, timeline.observe(101.0, later.jobs[0]))
    assert job["graph"]["edges"][0]["per_s"] == 750.0
    [count] = [task for task in job["tasks"] if task["name"] == "count"]
    assert count["instances"][0] == {
        "index": 0, "worker": "w1", "in_per_s": 750.0, "out_per_s": 750.0, "p50_ms": 0.512, "p99_ms": 0.512,
        "queue": "YELLOW", "fill": 0.5, "records_in": 750, "records_out": 750, "shed": 0, "loop_held": 2.5,
    }  # fmt: skip
    assert (job["late"], job["dead_lettered"], job["checkpoints"]) == (3, 1, 4)
    assert [event["text"] for event in job["timeline"]] == [
        "RUNNING: running on w0, w1", "attempt 1", "checkpoint 4 completed",
    ]  # fmt: skip


def test_a_timeline_records_only_changes_and_merges_the_adaptation_decisions() -> None:
    """A second identical reading adds nothing; a new attempt and a decision show up in time order."""
    timeline = Timeline()
    job = {"name": "wc", "state": "RUNNING", "reason": "r", "attempt": 1, "reconfigurations": 0, "decisions": []}
    assert len(timeline.observe(1.0, job)) == 2
    assert len(timeline.observe(2.0, job)) == 2
    decision = {"at": 2.5, "policy": "autoscale", "action": "rescale count to 3", "reason": "busy 95 %"}
    events = timeline.observe(3.0, {**job, "attempt": 2, "state": "RECOVERING", "decisions": [decision]})
    assert [(event["at"], event["text"]) for event in events[2:]] == [
        (2.5, "autoscale: rescale count to 3 (busy 95 %)"), (3.0, "RECOVERING: r"), (3.0, "attempt 2"),
    ]  # fmt: skip


def test_the_metrics_carry_every_family_with_its_labels_and_counters_grow_between_scrapes() -> None:
    """Parsed with prometheus_client's own parser: the families and labels docs/operations.md lists; records in grow
    from the first reading's scrape to the second's."""
    first = {f.name: f for f in text_string_to_metric_families(exposition(reading(1.0, 100, [0.001]).samples)
                                                                 .decode())}  # fmt: skip
    second = {f.name: f for f in text_string_to_metric_families(exposition(reading(2.0, 900, [0.001]).samples)
                                                                  .decode())}  # fmt: skip
    assert {
        "streamlet_records_in", "streamlet_records_out", "streamlet_batches", "streamlet_queue_fill",
        "streamlet_lag_items", "streamlet_latency_seconds", "streamlet_late_records", "streamlet_dead_letters",
        "streamlet_shed_records", "streamlet_restarts", "streamlet_checkpoints",
        "streamlet_checkpoint_duration_seconds", "streamlet_tcp_bytes_received", "streamlet_worker_rss_bytes",
        "streamlet_loop_blocked_seconds", "streamlet_loop_lag_seconds",
    } <= set(first)  # fmt: skip
    lags = {s.labels["worker"]: s.value for s in first["streamlet_loop_lag_seconds"].samples}
    assert lags == {"w0": 1.25, "w1": 0.0}
    [held] = [s for s in first["streamlet_loop_blocked_seconds"].samples if s.labels["task"] == "count"]
    assert (held.name, held.value) == ("streamlet_loop_blocked_seconds_total", 2.5)
    assert first["streamlet_records_in"].type == "counter"
    assert first["streamlet_latency_seconds"].type == "histogram"
    [lag] = [s for s in first["streamlet_lag_items"].samples if s.labels["task"] == "count" and s.labels["port"] == "0"]
    assert lag.labels == {"job": "wc", "task": "count", "instance": "0", "port": "0", "worker": "w1"}
    assert lag.value == 2

    def records_in(families: dict[str, Any]) -> float:
        [sample] = [s for s in families["streamlet_records_in"].samples
                    if s.name == "streamlet_records_in_total" and s.labels["task"] == "count"]  # fmt: skip
        return float(sample.value)

    assert (records_in(first), records_in(second)) == (100.0, 900.0)
    [late] = first["streamlet_late_records"].samples
    assert (late.labels, late.value) == ({"job": "wc", "worker": "w1"}, 3.0)


def _snapshots(found: Reading) -> dict[str, dict[str, Any]]:
    return {key: value for sample in found.samples for key, value in sample["load"]["instances"].items()}
