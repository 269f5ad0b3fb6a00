"""Load shedding under a QoS (ETRI): how much of the sources' input to shed to keep the job's latency.

The job is overloaded when its latency passes the QoS bound or its sources
are held back (backpressure: records wait outside the job, where no queue of
ours measures them). Then, if no capacity can be added (the autoscaler had
nothing to give), the shed ratio rises multiplicatively (by half, at least
``STEP``) up to the QoS's ``max_shed_ratio``; once the latency is under half
the bound and the sources flow freely, it falls by ``STEP`` per window back
to 0 (and held records, with ``recover``, are replayed). A rise is fast and
a fall slow, so the ratio does not swing.

The latency is estimated from the instances' histograms of the window: per
node the p99 of its instances' merged histogram, summed along the slowest
path from a source to a sink (an upper bound of a record's time inside the
job). Pure functions: statistics in, a ratio out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.core.model.histogram import LatencyHistogram
from streamlet.core.model.qos import QoS

STEP = 0.1  # the least a rise, and every fall, changes the ratio by
HELD_BACK = 0.5  # a source blocked this share of the window is held back: the job cannot take its input
FLOWING = 0.1  # a source blocked less than this share flows freely


@dataclass(frozen=True, slots=True)
class Shedding:
    """Shed ``ratio`` of the sources' records from now on (it was ``current``), and why."""

    current: float
    ratio: float
    reason: str


def path_latency(edges: Sequence[tuple[str, str]], p99: Mapping[str, float]) -> float:
    """The largest sum of per-node p99 latencies along a path of ``edges`` (nodes without a figure add 0)."""
    nodes = {name for edge in edges for name in edge} | set(p99)
    downstream: dict[str, list[str]] = {name: [] for name in nodes}
    for upstream, receiver in edges:
        downstream[upstream].append(receiver)
    longest: dict[str, float] = {}

    def through(name: str, visiting: frozenset[str]) -> float:  # a loop is walked once
        if name in longest:
            return longest[name]
        after = [through(n, visiting | {name}) for n in downstream[name] if n not in visiting]
        longest[name] = p99.get(name, 0.0) + max(after, default=0.0)
        return longest[name]

    return max((through(name, frozenset()) for name in sorted(nodes)), default=0.0)


def node_p99(histograms: Mapping[str, Sequence[LatencyHistogram]]) -> dict[str, float]:
    """Per node, the p99 (seconds) of its instances' window histograms merged (nodes with none left out)."""
    found = {}
    for node, parts in histograms.items():
        counts = [sum(bucket) for bucket in zip(*(part.counts for part in parts), strict=True)] if parts else []
        merged = LatencyHistogram(counts or None)
        quantile = merged.quantile(0.99)
        if quantile is not None:
            found[node] = quantile
    return found


def decide(qos: QoS, current: float, latency: float, held_back: float, can_grow: bool = False) -> Shedding | None:
    """The new shed ratio, or ``None`` to keep ``current``: ``latency`` is the job's estimate (seconds),
    ``held_back`` the largest share of the window a source was blocked, ``can_grow`` whether capacity can
    still be added (then the autoscaler acts, not shedding)."""
    over = latency > qos.max_latency
    if (over or held_back >= HELD_BACK) and not can_grow:
        ratio = min(qos.max_shed_ratio, round(max(current * 1.5, current + STEP), 4))
        if ratio <= current:
            return None  # at the QoS's limit already
        why = f"latency {latency:.3f} s over {qos.max_latency:g} s" if over else f"sources held back {held_back:.0%}"
        return Shedding(current, ratio, f"{why} and no capacity to add: shed {ratio:.0%}")
    if current > 0 and latency < qos.max_latency / 2 and held_back < FLOWING:
        ratio = max(0.0, round(current - STEP, 4))
        return Shedding(current, ratio, f"latency {latency:.3f} s, sources flowing: shed {ratio:.0%}")
    return None


def window_latency(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]], edges: Sequence[tuple[str, str]]
) -> float:
    """The job's latency estimate over a window, from two sets of instance snapshots (``"node.index"`` ->
    ``InstanceSnapshot.to_data()``): give it every instance of the job, wherever it runs, so a path that
    crosses workers sums its nodes."""
    histograms: dict[str, list[LatencyHistogram]] = {}
    for name, now in after.items():
        then = before.get(name)
        if then is not None:
            window = LatencyHistogram(list(now["latency"])).since(LatencyHistogram(list(then["latency"])))
            histograms.setdefault(str(now["node"]), []).append(window)
    return path_latency(edges, node_p99(histograms))


def held_back(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]], seconds: float) -> float:
    """The largest share of a window of ``seconds`` a source instance was blocked (0 with none measured)."""
    shares = [
        (float(now["blocked"]) - float(before[name]["blocked"])) / seconds
        for name, now in after.items()
        if now["kind"] == "source" and name in before and seconds > 0
    ]
    return max(shares, default=0.0)
