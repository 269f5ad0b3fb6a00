"""What the dashboard shows, as plain data: pure functions from a :class:`Reading` to the cluster and job views.

A *reading* is everything read at one moment: the cluster's status (masters, leader and epoch, workers;
``None`` for an embedded job), each worker's *sample* (its heartbeat: CPU, memory, every local instance's
statistics snapshot, every local job part's counters; see ``metrics``) and each job (state, attempt,
where its instances run, its topology's graph, its adaptation decisions, its last checkpoint). Counters
in snapshots are cumulative, so rates and windowed latency quantiles come from two readings:
:class:`Rates` keeps the previous snapshot of every instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamlet.core.model.histogram import LatencyHistogram
from streamlet.core.model.topology import Topology

TIMELINE_LENGTH = 200  # events kept per job


@dataclass
class Reading:
    """Everything the dashboard reads at one moment (see the module docstring)."""

    at: float
    cluster: dict[str, Any] | None
    samples: list[dict[str, Any]]
    jobs: list[dict[str, Any]]


def graph_of(topology: Topology) -> dict[str, Any]:
    """The topology as the page draws it: nodes (name, kind, parallelism) and edges (port to port)."""
    return {
        "nodes": [
            {"name": node.name, "kind": str(node.kind), "parallelism": node.parallelism}
            for node in topology.nodes.values()
        ],
        "edges": [
            {
                "from": edge.upstream,
                "to": edge.downstream,
                "out_port": edge.out_port,
                "in_port": edge.in_port,
                "partitioning": str(getattr(edge.partitioning, "name", edge.partitioning)),
            }
            for edge in topology.edges
        ],
    }


@dataclass
class Rates:
    """Per-instance rates between its last two distinct samples (the first sample of an instance has none).

    A worker's heartbeat carries the counters its loop last read and when (``sampled``); a reading that finds
    the same sample again shows the rate it showed for it, not 0 over the seconds since (the dashboard reads
    on its own clock, the workers sample on theirs)."""

    _previous: dict[str, tuple[float, dict[str, Any], dict[str, Any]]] = field(default_factory=dict)

    def update(
        self, at: float, snapshots: dict[str, dict[str, Any]], sampled: dict[str, float] | None = None
    ) -> dict[str, dict[str, Any]]:
        """``job/task.index`` -> records in and out per second, p50 and p99 latency (ms) over the window;
        ``sampled`` says when each snapshot was read (missing: ``at``, the reading's time)."""
        found = {}
        previous = {}
        for key, snapshot in snapshots.items():
            when = (sampled or {}).get(key, at)
            before = self._previous.get(key)
            if before is not None and when == before[0]:
                found[key], previous[key] = before[2], before
                continue
            found[key] = _rates(when, snapshot, None if before is None else before[:2])
            previous[key] = (when, snapshot, found[key])
        self._previous = previous
        return found


def _rates(at: float, snapshot: dict[str, Any], before: tuple[float, dict[str, Any]] | None) -> dict[str, Any]:
    if before is None or at <= before[0]:
        return {"in_per_s": 0.0, "out_per_s": 0.0, "p50_ms": None, "p99_ms": None}
    seconds, earlier = at - before[0], before[1]
    window = LatencyHistogram(list(snapshot["latency"])).since(LatencyHistogram(list(earlier["latency"])))
    p50, p99 = window.quantile(0.5), window.quantile(0.99)
    return {
        "in_per_s": round(max(0, snapshot["records_in"] - earlier["records_in"]) / seconds, 1),
        "out_per_s": round(max(0, snapshot["records_out"] - earlier["records_out"]) / seconds, 1),
        "p50_ms": None if p50 is None else round(p50 * 1000, 3),
        "p99_ms": None if p99 is None else round(p99 * 1000, 3),
    }


@dataclass
class Timeline:
    """Each job's lifecycle as the dashboard saw it change: state (with reason), attempts, checkpoints,
    live changes; the adaptation decisions come from ZooKeeper (kept there) and are merged in."""

    _seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    _events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def observe(self, at: float, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Record what changed in ``job`` since the last reading; returns its timeline, oldest first."""
        name, seen = job["name"], self._seen.get(job["name"], {})
        events = self._events.setdefault(name, [])
        checks = {
            "state": (job.get("state"), f"{job.get('state')}: {job.get('reason', '')}"),
            "attempt": (job.get("attempt"), f"attempt {job.get('attempt')}"),
            "checkpoint": ((job.get("checkpoint") or {}).get("epoch"),
                           f"checkpoint {(job.get('checkpoint') or {}).get('epoch')} completed"),
            "reconfigurations": (job.get("reconfigurations"), f"live change {job.get('reconfigurations')} done"),
        }  # fmt: skip
        for kind, (value, text) in checks.items():
            if value not in (None, 0) and value != seen.get(kind):
                events.append({"at": at, "kind": kind, "text": text})
            seen[kind] = value
        self._seen[name] = seen
        del events[:-TIMELINE_LENGTH]
        decisions = [
            {"at": float(d.get("at", 0.0)), "kind": "decision",
             "text": f"{d.get('policy', 'adapt')}: {d.get('action', '')} ({d.get('reason', '')})"}
            for d in job.get("decisions", [])
        ]  # fmt: skip
        return sorted([*events, *decisions], key=lambda event: event["at"])[-TIMELINE_LENGTH:]


def sample_times(reading: Reading) -> dict[str, float]:
    """``job/task.index`` -> when its worker read its counters (``sampled`` in the heartbeat; else the reading's
    time), by the same rule as :func:`instance_snapshots`."""
    found: dict[str, float] = {}
    for sample in reading.samples:
        load = sample.get("load") or {}
        for key in load.get("instances") or {}:
            found[key] = float(load.get("sampled", reading.at))
    return found


def instance_snapshots(reading: Reading) -> dict[str, tuple[str, dict[str, Any]]]:
    """``job/task.index`` -> (worker, snapshot), over every sample (a fresher worker wins a duplicate)."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for sample in reading.samples:
        for key, snapshot in ((sample.get("load") or {}).get("instances") or {}).items():
            found[key] = (str(sample["worker"]), snapshot)
    return found


def cluster_view(reading: Reading, rates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Masters, leader and epoch, workers (state, CPU, memory, load state, rates) and the allocation matrix
    of instances x workers, and every job's state."""
    status = reading.cluster or {}
    snapshots = instance_snapshots(reading)
    per_worker: dict[str, dict[str, float]] = {}
    for key, (worker, _) in snapshots.items():
        totals = per_worker.setdefault(worker, {"in_per_s": 0.0, "out_per_s": 0.0})
        totals["in_per_s"] += rates.get(key, {}).get("in_per_s", 0.0)
        totals["out_per_s"] += rates.get(key, {}).get("out_per_s", 0.0)
    workers = [
        {**row, **{k: round(v, 1) for k, v in per_worker.get(row["id"], {"in_per_s": 0, "out_per_s": 0}).items()}}
        for row in status.get("workers", [])
    ]
    matrix = [
        {"instance": f"{job['name']}/{instance}", "worker": worker}
        for job in reading.jobs
        for instance, worker in sorted((job.get("instances") or {}).items())
    ]
    return {
        "at": reading.at,
        "cluster": status.get("cluster"),
        "leader": status.get("leader"),
        "masters": status.get("candidates", []),
        "zookeeper": status.get("zookeeper"),  # each member and its mode (a ZooKeeper the cluster started)
        "problem": None,  # set when a reading fails: why the views are not fresh
        "workers": workers,
        "matrix": {"workers": [row["id"] for row in workers], "cells": matrix},
        "jobs": [
            {key: job.get(key) for key in ("name", "state", "reason", "attempt", "reconfigurations")}
            for job in reading.jobs
        ],
    }


def job_view(
    reading: Reading, job: dict[str, Any], rates: dict[str, dict[str, Any]], timeline: list[dict[str, Any]]
) -> dict[str, Any]:
    """One job: lifecycle and timeline, the graph with per-edge rates, per task and instance the rates,
    p50/p99 latency, queue state, and the job's late, dead-lettered, shed and dropped counts."""
    name = job["name"]
    snapshots = {key: value for key, value in instance_snapshots(reading).items() if key.startswith(f"{name}/")}
    graph = job.get("graph") or {"nodes": [], "edges": []}
    tasks = []
    node_rates: dict[str, dict[str, float]] = {}
    for node in graph["nodes"]:
        instances = []
        for index in range(int(node["parallelism"])):
            key = f"{name}/{node['name']}.{index}"
            worker, snapshot = snapshots.get(key, (None, None))
            instances.append({
                "index": index, "worker": worker or (job.get("instances") or {}).get(f"{node['name']}.{index}"),
                **rates.get(key, {"in_per_s": 0.0, "out_per_s": 0.0, "p50_ms": None, "p99_ms": None}),
                "queue": None if snapshot is None else snapshot["state"],
                "fill": None if snapshot is None else round(float(snapshot["fill"]), 3),
                "records_in": 0 if snapshot is None else snapshot["records_in"],
                "records_out": 0 if snapshot is None else snapshot["records_out"],
                "shed": 0 if snapshot is None else snapshot.get("shed", 0),
                "loop_held": 0.0 if snapshot is None else round(float(snapshot.get("loop_held", 0.0)), 3),
            })  # fmt: skip
        totals = {
            "in_per_s": round(sum(i["in_per_s"] for i in instances), 1),
            "out_per_s": round(sum(i["out_per_s"] for i in instances), 1),
        }
        node_rates[node["name"]] = totals
        tasks.append({**node, **totals, "instances": instances})
    inputs: dict[str, int] = {}
    for edge in graph["edges"]:
        inputs[edge["to"]] = inputs.get(edge["to"], 0) + 1
    edges = [
        {**edge, "per_s": node_rates.get(edge["to"] if inputs[edge["to"]] == 1 else edge["from"], {}).get(
            "in_per_s" if inputs[edge["to"]] == 1 else "out_per_s", 0.0)}
        for edge in graph["edges"]
    ]  # fmt: skip
    counters = _job_counters(reading, name)
    return {
        "name": name,
        **{key: job.get(key) for key in ("state", "reason", "attempt", "reconfigurations", "checkpoint")},
        "timeline": timeline,
        "graph": {"nodes": graph["nodes"], "edges": edges},
        "tasks": tasks,
        **counters,
    }


def _job_counters(reading: Reading, job: str) -> dict[str, int]:
    """The job's counters summed over the workers running parts of it."""
    totals = dict.fromkeys(("late", "dead_lettered", "dropped", "shed", "restarts", "checkpoints"), 0)
    for sample in reading.samples:
        counters = ((sample.get("load") or {}).get("jobs") or {}).get(job) or {}
        for key in totals:
            totals[key] += int(counters.get(key, 0))
    return totals
