"""Join jobs with known answers: orders and payments over a few keys, and a naive reference for each join.

The records are made from a fixed seed; each ``expected_*`` function computes
the join's answer by brute force (every pair of the same key), so a test
compares a run (in process, in processes, on a cluster, across a checkpoint or
a rescale) with it as a multiset.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import streamlet as sl

KEYS = 23
LOWER, UPPER = -2.0, 3.0
WINDOW = 10.0


def lefts(count: int = 2000, seed: int = 7) -> list[sl.Record]:
    """Left records: about one per 0.05 s, a little out of order (up to 0.5 s)."""
    rng = random.Random(seed)
    return [sl.Record(f"k{rng.randrange(KEYS)}", i, round(i * 0.05 + rng.uniform(-0.5, 0.0), 3)) for i in range(count)]


def rights(count: int = 2000, seed: int = 11) -> list[sl.Record]:
    """Right records, as :func:`lefts` but from another seed, every ninth a ``None`` (a tombstone for as-of)."""
    rng = random.Random(seed)
    return [
        sl.Record(
            f"k{rng.randrange(KEYS)}", None if i % 9 == 4 else f"r{i}", round(i * 0.05 + rng.uniform(-0.5, 0.0), 3)
        )
        for i in range(count)
    ]


def _wired(topology: sl.Topology, join: sl.NodeHandle, left: list[sl.Record], right: list[sl.Record]) -> None:
    watermarks = sl.Watermarks(out_of_orderness=0.5)
    join.set_input(topology.add_source("left", left, watermarks=watermarks), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(
        topology.add_source("right", right, watermarks=watermarks), in_port=sl.RIGHT, partitioning=sl.SAME_KEY
    )
    topology.add_sink("out", sl.CollectSink()).set_input(join)


def interval_topology(how: str = "inner", parallelism: int = 2, count: int = 2000) -> sl.Topology:
    """Left and right through ``interval_join(LOWER, UPPER, how)``."""
    topology = sl.Topology(f"interval-{how}")
    join = topology.interval_join("join", LOWER, UPPER, how=how, parallelism=parallelism)
    _wired(topology, join, lefts(count), [r for r in rights(count) if r.value is not None])
    return topology


def asof_topology(how: str = "inner", parallelism: int = 2, count: int = 2000) -> sl.Topology:
    """Left and right (with tombstones) through ``asof_join(how)``."""
    topology = sl.Topology(f"asof-{how}")
    join = topology.asof_join("join", how=how, parallelism=parallelism)
    _wired(topology, join, lefts(count), rights(count))
    return topology


def window_topology(how: str = "inner", parallelism: int = 2, count: int = 600) -> sl.Topology:
    """Left and right through a tumbling event-time ``window_join``."""
    topology = sl.Topology(f"window-{how}")
    join = topology.window_join("join", sl.TimeWindow(WINDOW, time="event"), how=how, parallelism=parallelism)
    _wired(topology, join, lefts(count), [r for r in rights(count) if r.value is not None])
    return topology


def table_topology(parallelism: int = 2, count: int = 2000) -> sl.Topology:
    """Every left record through a ``table_join(how="left")`` whose table (a row for every other key, never
    changed) comes from a source of its own: in processing order, a left record meets its row or, if it came
    first, none (see :func:`check_table`)."""
    topology = sl.Topology("table-left")
    join = topology.table_join("join", how="left", parallelism=parallelism)
    table = [sl.Record(f"k{i}", f"row{i}") for i in range(0, KEYS, 2)]
    join.set_input(topology.add_source("right", table), in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("left", lefts(count)), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    return topology


# -- the references -------------------------------------------------------------------------------------------


def _by_key(records: list[sl.Record]) -> dict[Any, list[sl.Record]]:
    found: dict[Any, list[sl.Record]] = {}
    for record in records:
        found.setdefault(record.key, []).append(record)
    return found


def expected_interval(how: str = "inner", count: int = 2000) -> list[tuple[Any, Any, float]]:
    """Every pair within the bounds, and the unpaired records of an outer kind (nothing is late: the
    out-of-orderness bound covers the disorder)."""
    left, right = lefts(count), _by_key([r for r in rights(count) if r.value is not None])
    out, paired_right = [], set()
    for a in left:
        matches = [b for b in right.get(a.key, []) if a.ts + LOWER <= b.ts <= a.ts + UPPER]
        out += [(a.key, (a.value, b.value), max(a.ts, b.ts)) for b in matches]
        paired_right.update(id(b) for b in matches)
        if not matches and how in ("left", "outer"):
            out.append((a.key, (a.value, None), a.ts))
    if how in ("right", "outer"):
        out += [(b.key, (None, b.value), b.ts) for bs in right.values() for b in bs if id(b) not in paired_right]
    return sorted(out, key=repr)


def expected_asof(how: str = "inner", count: int = 2000) -> list[tuple[Any, Any, float]]:
    """Each left record with its key's right record of the greatest ts <= its own (the last among equals)."""
    right = _by_key(rights(count))
    out = []
    for a in lefts(count):
        best = None
        for b in right.get(a.key, []):
            if b.ts <= a.ts and (best is None or b.ts >= best.ts):
                best = b
        value = None if best is None else best.value
        if value is not None or how == "left":
            out.append((a.key, (a.value, value), a.ts))
    return sorted(out, key=repr)


def expected_window(how: str = "inner", count: int = 600) -> list[tuple[Any, Any, float]]:
    """Per key and tumbling window, every pair (and the unpaired of an outer kind), stamped with its last tick."""
    cells: dict[tuple[Any, float], tuple[list[Any], list[Any]]] = {}
    for side, records in enumerate((lefts(count), [r for r in rights(count) if r.value is not None])):
        for record in records:
            start = (record.ts // WINDOW) * WINDOW
            cells.setdefault((record.key, start), ([], []))[side].append(record.value)
    out = []
    for (key, start), (left, right) in cells.items():
        stamp = round(start + WINDOW - 0.001, 3)
        out += [(key, (a, b), stamp) for a in left for b in right]
        if not right and how in ("left", "outer"):
            out += [(key, (a, None), stamp) for a in left]
        if not left and how in ("right", "outer"):
            out += [(key, (None, b), stamp) for b in right]
    return sorted(out, key=repr)


def check_table(records: list[sl.Record], count: int = 2000) -> None:
    """Every left record out exactly once, with its key's row or ``None`` (a key without a row: always
    ``None``); a row is never given to another key."""
    rows = {f"k{i}": f"row{i}" for i in range(0, KEYS, 2)}
    got = sorted(((r.key, r.value[0], r.ts) for r in records), key=repr)
    assert got == sorted(((a.key, a.value, a.ts) for a in lefts(count)), key=repr)
    for record in records:
        assert record.value[1] in (None, rows.get(record.key)), record


def outcome(records: list[sl.Record]) -> list[tuple[Any, Any, float]]:
    """A run's output as the references give it."""
    return sorted(((r.key, r.value, r.ts) for r in records), key=repr)


BUILDERS: dict[str, Callable[..., sl.Topology]] = {
    "interval": interval_topology,
    "asof": asof_topology,
    "window": window_topology,
}
EXPECTED: dict[str, Callable[..., list[tuple[Any, Any, float]]]] = {
    "interval": expected_interval,
    "asof": expected_asof,
    "window": expected_window,
}


def queue_topology(kind: str, how: str, parallelism: int = 2) -> sl.Topology:
    """:data:`BUILDERS`' join fed by queue sources 'left' and 'right' instead (``feed`` sends the records)."""
    topology = sl.Topology(f"queued-{kind}-{how}")
    if kind == "interval":
        join = topology.interval_join("join", LOWER, UPPER, how=how, parallelism=parallelism)
    elif kind == "asof":
        join = topology.asof_join("join", how=how, parallelism=parallelism)
    else:
        join = topology.window_join("join", sl.TimeWindow(WINDOW, time="event"), how=how, parallelism=parallelism)
    watermarks = sl.Watermarks(out_of_orderness=0.5)
    for side, port in (("left", sl.LEFT), ("right", sl.RIGHT)):
        join.set_input(topology.add_source(side, sl.QueueSource(), watermarks=watermarks), in_port=port,
                       partitioning=sl.SAME_KEY)  # fmt: skip
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    return topology


def records_of(kind: str, count: int) -> tuple[list[sl.Record], list[sl.Record]]:
    """The left and right records :data:`BUILDERS`' ``kind`` runs on."""
    right = rights(count)
    return lefts(count), right if kind == "asof" else [r for r in right if r.value is not None]


async def feed(job: sl.Job, kind: str, count: int, start: float, stop: float) -> None:
    """Send each side's records in ``[start, stop)`` of their positions (fractions), alternating sides."""
    left, right = records_of(kind, count)
    lefts_now = left[int(start * len(left)) : int(stop * len(left))]
    rights_now = right[int(start * len(right)) : int(stop * len(right))]
    for a, b in itertools.zip_longest(lefts_now, rights_now):
        if a is not None:
            await job.send("left", a.key, a.value, a.ts)
        if b is not None:
            await job.send("right", b.key, b.value, b.ts)
