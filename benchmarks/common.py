"""Shared helpers: timing, medians and the one-line JSON report."""

from __future__ import annotations

import gc
import json
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any


class SlotRecord:
    """The record a careful hand-written pipeline would use: key, value, ts in slots."""

    __slots__ = ("key", "ts", "value")

    def __init__(self, key: Any, value: Any, ts: float) -> None:
        self.key = key
        self.value = value
        self.ts = ts


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn()`` took, and what it returned."""
    began = time.perf_counter()
    result = fn()
    return time.perf_counter() - began, result


def alternating(
    repeats: int, runs: dict[str, Callable[[], Any]], keep: Callable[[Any], Any] | None = None
) -> dict[str, list[tuple[float, Any]]]:
    """Time every run ``repeats`` times, rotating which goes first.

    The order matters on this machine (a run following another is measurably
    slower), so each repeat starts with a different run, and garbage is
    collected before every timed run. ``keep`` (untimed) turns a run's result
    into what is kept of it for the checks, e.g. a digest of a large result.
    """
    names = list(runs)
    timings: dict[str, list[tuple[float, Any]]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            seconds, result = timed(runs[name])
            timings[name].append((seconds, result if keep is None else keep(result)))
    return timings


def median_rate(records: int, seconds: list[float]) -> float:
    """Records per second at the median of the timed runs."""
    return records / statistics.median(seconds)


def latency_ms(seconds: list[float], prefix: str = "") -> dict[str, float]:
    """``p50_ms`` and ``p99_ms`` (with ``prefix``) of latencies given in seconds."""
    ordered = sorted(seconds)

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 3)

    return {f"{prefix}p50_ms": at(0.50), f"{prefix}p99_ms": at(0.99)}


def report(name: str, records_per_s: float, baseline_records_per_s: float, **extra: Any) -> dict[str, Any]:
    """The benchmark's JSON line (``ratio`` = measured / baseline; higher is better)."""
    line = {
        "name": name,
        "records_per_s": round(records_per_s),
        "baseline_records_per_s": round(baseline_records_per_s),
        "ratio": round(records_per_s / baseline_records_per_s, 3),
        **extra,
    }
    return line


def peak_rss_mb() -> float:
    """The largest resident set, in MB, of this process or of any child it has waited for (as
    ``getrusage`` reports each; a benchmark's baseline runs in the same process, so this is the peak of
    the whole run, streamlet's or the baseline's; a cluster's worker processes count once they exit)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, children) / 1024, 1)  # Linux reports kilobytes


def emit(line: dict[str, Any], as_json: bool) -> None:
    """Print the result: one JSON line, or a readable summary; every line gets ``peak_rss_mb``."""
    line = {**line, "peak_rss_mb": peak_rss_mb()}
    if as_json:
        print(json.dumps(line))
    else:
        for key, value in line.items():
            print(f"{key:>28}: {value}")


def median_of_repeats(lines: list[dict[str, Any]], by: str = "ratio") -> dict[str, Any]:
    """One line from a benchmark's repeats: each number the median over them, each list that of the repeat
    whose ``by`` is the median; ``<by>s`` lists every repeat's ``by``, ``repeats`` their count."""
    ordered = sorted(line[by] for line in lines)
    middle = next(line for line in lines if line[by] == ordered[(len(ordered) - 1) // 2])
    merged = dict(middle)
    for key, value in middle.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            merged[key] = round(statistics.median(line[key] for line in lines), 4)
    return {**merged, f"{by}s": [line[by] for line in lines], "repeats": len(lines)}
