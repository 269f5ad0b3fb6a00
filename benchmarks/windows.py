"""Keyed sums per window: a tumbling count window, an event-time tumbling window and event-time sessions.

Over the same 1 M pre-built records (10 k keys, event times 1 ms apart with
up to 50 ms of disorder), source -> windowed keyed sum -> sink, against a
hand-written asyncio pipeline doing the same with the same record objects:
three stages, bounded queues, batches of 1000, incremental per-window dicts
(for sessions: one open session per key and a heap of their ends). The
event-time jobs get their watermarks from the source (the newest event time
minus 100 ms after every batch), as the baselines compute theirs.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Callable
from typing import Any

import uvloop

import streamlet as sl
from benchmarks.common import SlotRecord, alternating, median_rate, report

BATCH = 1000
COUNT = 1000
SECONDS = 1.0
LATENESS = 0.1
GAP = 5.0  # session gap: a key's records are ~10 s apart on average, so sessions both merge and split


def make_records(count: int, keys: int = 10_000, seed: int = 11) -> list[tuple[str, int, float]]:
    """``(key, value, ts)`` with ts 1 ms apart plus up to 50 ms of disorder."""
    rng = random.Random(seed)
    return [(f"key{rng.randrange(keys)}", 1, index * 0.001 + rng.random() * 0.05) for index in range(count)]


# -- the hand-written baseline ----------------------------------------------


async def _produce(records: list[SlotRecord], out: asyncio.Queue[Any]) -> None:
    for start in range(0, len(records), BATCH):
        await out.put(records[start : start + BATCH])
    await out.put(None)


async def _count_windows(inbox: asyncio.Queue[Any], out: asyncio.Queue[Any]) -> None:
    sums: dict[str, int] = {}
    seen = 0
    while (batch := await inbox.get()) is not None:
        for record in batch:
            sums[record.key] = sums.get(record.key, 0) + record.value
            seen += 1
            if seen % COUNT == 0:
                await out.put([SlotRecord(key, total, record.ts) for key, total in sums.items()])
                sums = {}
    if sums:
        await out.put([SlotRecord(key, total, 0.0) for key, total in sums.items()])
    await out.put(None)


async def _event_windows(inbox: asyncio.Queue[Any], out: asyncio.Queue[Any]) -> None:
    windows: dict[float, dict[str, int]] = {}
    watermark = float("-inf")
    while (batch := await inbox.get()) is not None:
        for record in batch:
            start = record.ts - record.ts % SECONDS
            if start + SECONDS <= watermark:
                continue  # late (none in this data)
            sums = windows.get(start)
            if sums is None:
                sums = windows[start] = {}
            sums[record.key] = sums.get(record.key, 0) + record.value
            if record.ts - LATENESS > watermark:
                watermark = record.ts - LATENESS
        for start in sorted(s for s in windows if s + SECONDS <= watermark):
            await out.put([SlotRecord(k, v, start + SECONDS) for k, v in windows.pop(start).items()])
    for start in sorted(windows):
        await out.put([SlotRecord(k, v, start + SECONDS) for k, v in windows.pop(start).items()])
    await out.put(None)


async def _session_windows(inbox: asyncio.Queue[Any], out: asyncio.Queue[Any]) -> None:
    sessions: dict[str, list[float]] = {}  # key -> [start, end, total]; end = last ts + gap
    ends: list[tuple[float, str]] = []  # heap of (end, key), stale entries skipped
    watermark = float("-inf")
    while (batch := await inbox.get()) is not None:
        for record in batch:
            key, ts = record.key, record.ts
            session = sessions.get(key)
            if session is not None and session[0] - GAP <= ts < session[1]:  # joins (or stretches) it
                session[0] = min(session[0], ts)
                if ts + GAP > session[1]:
                    session[1] = ts + GAP
                    heapq.heappush(ends, (session[1], key))
                session[2] += record.value
                continue
            if session is not None:  # disorder is below the gap: an older session of this key has ended
                await out.put([SlotRecord(key, session[2], session[1])])
            sessions[key] = [ts, ts + GAP, record.value]
            heapq.heappush(ends, (ts + GAP, key))
            if ts - LATENESS > watermark:
                watermark = ts - LATENESS
        done = []
        while ends and ends[0][0] <= watermark:
            end, key = heapq.heappop(ends)
            session = sessions.get(key)
            if session is not None and session[1] == end:
                done.append(SlotRecord(key, sessions.pop(key)[2], end))
        if done:
            await out.put(done)
    await out.put([SlotRecord(key, total, end) for key, (_start, end, total) in sessions.items()])
    await out.put(None)


async def _collect(inbox: asyncio.Queue[Any]) -> int:
    total = 0
    while (batch := await inbox.get()) is not None:
        total += sum(record.value for record in batch)
    return total


def run_baseline(records: list[SlotRecord], stage: Callable[..., Any]) -> int:
    """The hand-written pipeline; returns the sum of all window sums."""

    async def pipeline() -> int:
        first: asyncio.Queue[Any] = asyncio.Queue(8)
        second: asyncio.Queue[Any] = asyncio.Queue(8)
        _, _, total = await asyncio.gather(_produce(records, first), stage(first, second), _collect(second))
        return int(total)

    return uvloop.run(pipeline())


# -- streamlet ----------------------------------------------------------------


class Total(sl.Sink):
    """Adds up every value it receives."""

    def __init__(self) -> None:
        self.total = 0

    def open(self, context: sl.SinkContext) -> sl.ElementWriter:
        return _TotalWriter(self)


class _TotalWriter(sl.ElementWriter):
    def __init__(self, sink: Total) -> None:
        self.sink = sink

    def write(self, batch: list[Any]) -> None:
        self.sink.total += sum(element[1] for element in batch)


def run_streamlet(records: list[sl.Record], window: sl.WindowSpec) -> int:
    """The streamlet job (``window_reduce`` with the built-in sum); returns the sum of all window sums."""
    topology = sl.Topology("windows-bench")
    source = topology.add_source("records", records, watermarks=sl.Watermarks(out_of_orderness=LATENESS))
    summed = topology.window_reduce("sum", "sum", window=window).set_input(source)
    total = Total()
    topology.add_sink("total", total).set_input(summed)
    result = sl.run(topology)
    if result.statistics.late:
        raise AssertionError("the benchmark data should have no late records")
    return total.total


def main(records: int, repeats: int) -> dict[str, Any]:
    """Event-time and count windows, each against its baseline, alternating order; medians."""
    raw = make_records(records)
    ours = [sl.Record(key, value, ts) for key, value, ts in raw]
    theirs = [SlotRecord(key, value, ts) for key, value, ts in raw]
    event_window = sl.TimeWindow(SECONDS, time="event")
    session_window = sl.SessionWindow(GAP, time="event")
    timings = alternating(
        repeats,
        {
            "event": lambda: run_streamlet(ours, event_window),
            "event_base": lambda: run_baseline(theirs, _event_windows),
            "session": lambda: run_streamlet(ours, session_window),
            "session_base": lambda: run_baseline(theirs, _session_windows),
            "count": lambda: run_streamlet(ours, sl.CountWindow(COUNT)),
            "count_base": lambda: run_baseline(theirs, _count_windows),
        },
    )
    for name, runs in timings.items():
        if any(total != records for _, total in runs):
            raise AssertionError(f"{name}: the window sums do not add up to {records}")
    rates = {name: median_rate(records, [seconds for seconds, _ in runs]) for name, runs in timings.items()}
    return report(
        "windows",
        rates["event"],
        rates["event_base"],
        count_window_records_per_s=round(rates["count"]),
        count_window_baseline_records_per_s=round(rates["count_base"]),
        count_window_ratio=round(rates["count"] / rates["count_base"], 3),
        session_window_records_per_s=round(rates["session"]),
        session_window_baseline_records_per_s=round(rates["session_base"]),
        session_window_ratio=round(rates["session"] / rates["session_base"], 3),
        records=records,
        repeats=repeats,
    )
