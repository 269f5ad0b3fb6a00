"""Joins: ``interval_join`` and ``asof_join`` against a hand-written dict-and-heap join over the same records.

The records: ``records`` in all, half left and half right, alternating, 1 ms
apart with up to 20 ms of disorder, over 1 000 keys (a key every second per
side). The interval join pairs records within ``[-0.5, +0.5]`` s; the as-of
join meets each left record (a trade) with its key's latest right record
(a price) at or before it.

The baseline is what a careful engineer writes by hand on asyncio (uvloop,
batches of 1 000 ``__slots__`` records through bounded queues, the two
producers feeding one join stage, a batch of each side in turn): per key a list of held records of each
side, a heap of ``(expiry, key)`` to drop them once the watermark (the
minimum over both sides of the largest ts seen, less the disorder bound)
passes, and for as-of a sorted list of versions per key with the left
records waiting in a heap until the watermark passes them. Both sides'
outputs are compared as multisets every run.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import uvloop

import streamlet as sl
from benchmarks.common import SlotRecord, alternating, median_rate, report

BATCH = 1000
KEYS = 1000
LOWER, UPPER = -0.5, 0.5
DISORDER = 0.02

Pair = tuple[Any, Any, Any, float]


def make_records(count: int, seed: int = 5) -> tuple[list[tuple[str, int, float]], list[tuple[str, int, float]]]:
    """Left and right ``(key, value, ts)``: alternating, 1 ms apart, up to 20 ms of disorder, in whole ms."""
    rng = random.Random(seed)
    made = [(f"k{rng.randrange(KEYS)}", index, (index + rng.randrange(20)) / 1000) for index in range(count)]
    return made[0::2], made[1::2]


# -- the hand-written baselines -------------------------------------------------------------------------------------


async def _produce(side: int, records: list[SlotRecord], out: asyncio.Queue[Any]) -> None:
    for start in range(0, len(records), BATCH):
        await out.put((side, records[start : start + BATCH]))
    await out.put((side, None))


async def _take_turns(inboxes: tuple[asyncio.Queue[Any], asyncio.Queue[Any]]) -> Any:
    """A batch from each side in turn, while both last (one queue shared by two producers would let one run
    ahead of the other, holding back the watermark and so holding every record of the side ahead)."""
    open_sides = [0, 1]
    turn = 0
    while open_sides:
        side = open_sides[turn % len(open_sides)]
        item = await inboxes[side].get()
        if item[1] is None:
            open_sides.remove(side)
        else:
            turn += 1
        yield item


async def _collect(inbox: asyncio.Queue[Any]) -> list[Pair]:
    found: list[Pair] = []
    while (batch := await inbox.get()) is not None:
        found.extend((r.key, r.value[0], r.value[1], r.ts) for r in batch)
    return found


async def _interval_stage(inboxes: tuple[asyncio.Queue[Any], asyncio.Queue[Any]], out: asyncio.Queue[Any]) -> None:
    held: dict[str, tuple[list[SlotRecord], list[SlotRecord]]] = {}
    expiries: list[tuple[float, str]] = []
    seen = [float("-inf"), float("-inf")]
    async for side, batch in _take_turns(inboxes):
        if batch is None:
            seen[side] = float("inf")
            continue
        results = []
        for record in batch:
            key, ts = record.key, record.ts
            sides = held.get(key)
            if sides is None:
                sides = held[key] = ([], [])
            if side == 0:
                low, high = ts + LOWER, ts + UPPER
                results += [
                    SlotRecord(key, (record.value, b.value), max(ts, b.ts)) for b in sides[1] if low <= b.ts <= high
                ]
                heapq.heappush(expiries, (ts + UPPER, key))
            else:
                low, high = ts - UPPER, ts - LOWER
                results += [
                    SlotRecord(key, (a.value, record.value), max(ts, a.ts)) for a in sides[0] if low <= a.ts <= high
                ]
                heapq.heappush(expiries, (ts - LOWER, key))
            sides[side].append(record)
            if ts > seen[side]:
                seen[side] = ts
        watermark = min(seen) - DISORDER
        due = set()
        while expiries and expiries[0][0] < watermark:
            due.add(heapq.heappop(expiries)[1])
        for key in due:  # each key's held records filtered once per watermark, however many expired
            lefts, rights = held[key]
            held[key] = (
                [a for a in lefts if a.ts + UPPER >= watermark],
                [b for b in rights if b.ts - LOWER >= watermark],
            )
        if results:
            await out.put(results)
    await out.put(None)


async def _asof_stage(inboxes: tuple[asyncio.Queue[Any], asyncio.Queue[Any]], out: asyncio.Queue[Any]) -> None:
    versions: dict[str, tuple[list[float], list[Any]]] = {}  # key -> (sorted ts, values)
    waiting: list[tuple[float, int, SlotRecord]] = []
    seen = [float("-inf"), float("-inf")]
    order = 0
    async for side, batch in _take_turns(inboxes):
        if batch is None:
            seen[side] = float("inf")
        else:
            for record in batch:
                if side == 0:
                    heapq.heappush(waiting, (record.ts, order, record))
                    order += 1
                else:
                    times, values = versions.setdefault(record.key, ([], []))
                    at = bisect.bisect_right(times, record.ts)
                    times.insert(at, record.ts)
                    values.insert(at, record.value)
                if record.ts > seen[side]:
                    seen[side] = record.ts
        watermark = min(seen) - DISORDER
        results = []
        while waiting and waiting[0][0] < watermark:
            ts, _, trade = heapq.heappop(waiting)
            times, values = versions.get(trade.key, ([], []))
            at = bisect.bisect_right(times, ts)
            if at:
                results.append(SlotRecord(trade.key, (trade.value, values[at - 1]), ts))
                if at > 1:  # the versions before the one met: no later trade can meet them
                    del times[: at - 1], values[: at - 1]
        if results:
            await out.put(results)
    await out.put(None)


def run_baseline(left: list[SlotRecord], right: list[SlotRecord], stage: Callable[..., Any]) -> list[Pair]:
    async def pipeline() -> list[Pair]:
        inboxes: tuple[asyncio.Queue[Any], asyncio.Queue[Any]] = (asyncio.Queue(8), asyncio.Queue(8))
        out: asyncio.Queue[Any] = asyncio.Queue(8)
        results = await asyncio.gather(
            _produce(0, left, inboxes[0]), _produce(1, right, inboxes[1]), stage(inboxes, out), _collect(out)
        )
        found: list[Pair] = results[3]
        return found

    return uvloop.run(pipeline())


# -- streamlet --------------------------------------------------------------------------------------------------------


class Pairs(sl.Sink):
    """Keeps every pair, as the baseline's collector does."""

    def __init__(self) -> None:
        self.found: list[Pair] = []

    def open(self, context: sl.SinkContext) -> sl.ElementWriter:
        return _PairsWriter(self.found)


class _PairsWriter(sl.ElementWriter):
    def __init__(self, found: list[Pair]) -> None:
        self.found = found

    def write(self, batch: list[Any]) -> None:
        self.found.extend((element[0], element[1][0], element[1][1], element[2]) for element in batch)


def run_streamlet(left: list[sl.Record], right: list[sl.Record], kind: str) -> list[Pair]:
    """Both sides through the join (one instance, as the baseline has one stage); every pair collected."""
    topology = sl.Topology(f"{kind}-bench")
    join = topology.interval_join("join", LOWER, UPPER) if kind == "interval" else topology.asof_join("join")
    watermarks = sl.Watermarks(out_of_orderness=DISORDER)
    join.set_input(topology.add_source("left", left, watermarks=watermarks), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("right", right, watermarks=watermarks), in_port=sl.RIGHT,
                   partitioning=sl.SAME_KEY)  # fmt: skip
    pairs = Pairs()
    topology.add_sink("pairs", pairs).set_input(join)
    result = sl.run(topology)
    if result.statistics.late:
        raise AssertionError("the benchmark data should have no late records")
    return pairs.found


def check(name: str, ours: list[Pair], theirs: list[Pair]) -> int:
    """The same pairs on both sides (as multisets); how many."""
    mine, baseline = Counter(ours), Counter(theirs)
    if mine != baseline:
        differing = sorted(((mine - baseline) + (baseline - mine)).elements(), key=repr)[:3]
        raise AssertionError(f"{name}: the join's pairs differ from the baseline's, e.g. {differing}")
    return len(ours)


def main(records: int, repeats: int) -> dict[str, Any]:
    """Interval and as-of joins, each against its baseline, alternating order; medians."""
    left_raw, right_raw = make_records(records)
    ours = [sl.Record(*r) for r in left_raw], [sl.Record(*r) for r in right_raw]
    theirs = [SlotRecord(*r) for r in left_raw], [SlotRecord(*r) for r in right_raw]
    timings = alternating(
        repeats,
        {
            "interval": lambda: run_streamlet(*ours, "interval"),
            "interval_base": lambda: run_baseline(*theirs, _interval_stage),
            "asof": lambda: run_streamlet(*ours, "asof"),
            "asof_base": lambda: run_baseline(*theirs, _asof_stage),
        },
        keep=lambda found: found,
    )
    counts = {}
    for name in ("interval", "asof"):
        for (_, mine), (_, baseline) in zip(timings[name], timings[f"{name}_base"], strict=True):
            counts[name] = check(name, mine, baseline)
    rates = {name: median_rate(records, [seconds for seconds, _ in runs]) for name, runs in timings.items()}
    return report(
        "joins",
        rates["interval"],
        rates["interval_base"],
        asof_records_per_s=round(rates["asof"]),
        asof_baseline_records_per_s=round(rates["asof_base"]),
        asof_ratio=round(rates["asof"] / rates["asof_base"], 3),
        interval_pairs=counts["interval"],
        asof_pairs=counts["asof"],
        records=records,
        repeats=repeats,
    )
