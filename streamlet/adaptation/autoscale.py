"""Autoscaling as DS2 does it: each task's right parallelism from its *true* processing rate.

A task's observed rate says little when it is backpressured or starved; its
true rate does: records processed per second of busy time (time spent in
``execute``, not waiting for input or for room downstream). From the true
rates, DS2 walks the graph from the sources: a source's target output rate
is what it emits when not held back (records out per second it was not
blocked); a task's target input rate is the sum of its upstreams' target
output rates, its target output rate that times its selectivity (records
out per record in), and its right parallelism the target input rate over one
instance's true rate, rounded up. One decision reaches the right parallelism
for a step change when rates are linear in instances (DS2 shows ≤ 3 in
practice); bounds, a cooldown and a dead band keep it from flapping.

Instances are sized to be 85 % busy at the target rate (``UTILIZATION``):
sized to exactly its need, a task never drains the backlog a surge left,
and DS2 flaps between too few instances (the backlog makes the source look
faster) and too many.

Everything here is a pure function: statistics snapshots in, decisions out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.core.model.topology import Topology

Snapshot = Mapping[str, Any]  # an ``InstanceSnapshot.to_data()``
UTILIZATION = 0.85  # how busy DS2 sizes instances to be at the target rate: the rest is headroom


@dataclass(frozen=True, slots=True)
class InstanceWindow:
    """One instance over an observation window of ``seconds``: what it did (differences of two snapshots)."""

    node: str
    index: int
    kind: str
    records_in: int
    records_out: int
    busy: float
    blocked: float
    seconds: float


@dataclass(frozen=True, slots=True)
class Scaling:
    """A decision: give ``task`` ``instances`` instances (it has ``current``), and why."""

    task: str
    current: int
    instances: int
    reason: str


def node_edges(topology: Topology) -> list[tuple[str, str]]:
    """The job's graph as the policies walk it: (upstream, downstream) node pairs, once each, sorted."""
    return sorted({(edge.upstream, edge.downstream) for edge in topology.edges})


def windows(before: Mapping[str, Snapshot], after: Mapping[str, Snapshot], seconds: float) -> list[InstanceWindow]:
    """What each instance did between two sets of snapshots (``"node.index"`` -> snapshot) ``seconds`` apart;
    an instance in only one of them (added or retired meanwhile) is left out."""
    found = []
    for name, now in after.items():
        then = before.get(name)
        if then is None or seconds <= 0:
            continue
        window = InstanceWindow(
            str(now["node"]), int(now["index"]), str(now["kind"]),
            int(now["records_in"]) - int(then["records_in"]), int(now["records_out"]) - int(then["records_out"]),
            float(now["busy"]) - float(then["busy"]), float(now["blocked"]) - float(then["blocked"]), seconds,
        )  # fmt: skip
        found.append(window)
    return found


@dataclass(frozen=True, slots=True)
class NodeRates:
    """A node over a window: observed rates, and the true rates of one instance (per busy second)."""

    name: str
    kind: str
    instances: int
    true_in: float  # records processed per busy second, per instance (sources: read per unblocked second)
    selectivity: float  # records out per record in


def node_rates(observed: Sequence[InstanceWindow]) -> dict[str, NodeRates]:
    """Per node: observed and true rates over the window (nodes with nothing measured are left out)."""
    by_node: dict[str, list[InstanceWindow]] = {}
    for window in observed:
        by_node.setdefault(window.node, []).append(window)
    rates = {}
    for name, group in by_node.items():
        records_in = sum(w.records_in for w in group)
        records_out = sum(w.records_out for w in group)
        kind = group[0].kind
        if kind == "source":  # what it reads when nothing holds it back (shed records too: offered input)
            free = sum(max(w.seconds - w.blocked, 0.0) for w in group)
            true = records_in / free if free > 0 else 0.0
            selectivity = 1.0
        else:
            busy = sum(w.busy for w in group)
            true = records_in / busy if busy > 0 else 0.0
            selectivity = records_out / records_in if records_in else 1.0
        rates[name] = NodeRates(name, kind, len(group), true, selectivity)
    return rates


def ds2(
    edges: Sequence[tuple[str, str]],
    rates: Mapping[str, NodeRates],
    parallelism: Mapping[str, int],
    bounds: Mapping[str, tuple[int, int]],
    dead_band: float = 0.1,
    utilization: float = UTILIZATION,
) -> list[Scaling]:
    """The rescalings DS2 asks for: ``edges`` (upstream, downstream) of the job, ``rates`` from
    :func:`node_rates`, the tasks' ``parallelism`` now and their ``bounds`` (only tasks named there are
    scaled). Instances are sized to be ``utilization`` busy at the target rate (headroom: a task sized to
    exactly its need never drains a backlog, and flaps between too few and too many). A task whose need is
    within ``dead_band`` (a share of one instance) of what it has, or that measured nothing, keeps it."""
    order = _upstream_first(edges, set(rates) | set(parallelism))
    target_out: dict[str, float] = {}
    decisions = []
    for name in order:
        node = rates.get(name)
        upstream = [u for u, d in edges if d == name]
        if node is not None and node.kind == "source":
            target_out[name] = node.true_in * node.instances
            continue
        target_in = sum(target_out.get(u, 0.0) for u in upstream)
        if node is None:
            target_out[name] = target_in
            continue
        target_out[name] = target_in * node.selectivity
        if name not in bounds or node.true_in <= 0:
            continue
        low, high = bounds[name]
        need = target_in / (node.true_in * utilization)
        have = parallelism.get(name, node.instances)
        wanted = min(high, max(low, math.ceil(need - dead_band)))
        if wanted != have:
            reason = (
                f"input {target_in:,.0f} rec/s needs {need:.2f} instances at {node.true_in:,.0f} rec/s per busy "
                f"second each, {utilization:.0%} busy (DS2); had {have}, bounds {low}..{high}"
            )
            decisions.append(Scaling(name, have, wanted, reason))
    return decisions


def _upstream_first(edges: Sequence[tuple[str, str]], names: set[str]) -> list[str]:
    """``names`` ordered so that a node comes after its upstreams (ties by name; loops keep their order)."""
    names = names | {u for u, _ in edges} | {d for _, d in edges}
    order: list[str] = []
    remaining = sorted(names)
    while remaining:
        ready = [n for n in remaining if all(u in order or u == n for u, d in edges if d == n)]
        if not ready:  # a loop: take the first and go on
            ready = remaining[:1]
        for name in ready:
            order.append(name)
            remaining.remove(name)
    return order
