"""Keyed sums per window: a tumbling count window, an event-time tumbling window and event-time sessions.

Over the same 1 M pre-built records (10 k keys, event times 1 ms apart with
up to 50 ms of disorder), source -> windowed keyed sum -> sink, against a
hand-written asyncio pipeline doing the same with the same record objects:
three stages, bounded queues, batches of 1000, incremental per-window dicts
(for sessions: one open session per key and a heap of their ends). The
event-time jobs get their watermarks from the source (the newest event time
minus 100 ms after every batch), as the baselines compute theirs.
Every run's windows are checked against the baseline's, window by window:
the multiset of (key, window end, sum) for time windows and sessions, of
(key, sum) for count windows (a count window has no end of its own); each
side pays one tuple per window result for it, inside the timed region.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections import Counter
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
    """``(key, value, ts)`` with ts 1 ms apart plus up to 50 ms of disorder, in whole milliseconds (streamlet
    counts event time in ticks of 1 ms, a timestamp going to its nearest tick: the baselines' windows are
    compared result by result, so the data has no time finer than a tick)."""
    rng = random.Random(seed)
    return [(f"key{rng.randrange(keys)}", 1, (index + rng.randrange(50)) / 1000) for index in range(count)]


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
            if session is not None and session[0] - GAP <= ts <= session[1]:  # joins (or stretches) it: a record
                # exactly a gap away touches the session and merges, as in streamlet and Flink
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


Window = tuple[Any, ...]  # (key, end, sum), or (key, sum) for a count window


async def _collect(inbox: asyncio.Queue[Any], timed: bool) -> list[Window]:
    found: list[Window] = []
    add = found.append
    while (batch := await inbox.get()) is not None:
        for record in batch:
            add((record.key, record.ts, record.value) if timed else (record.key, record.value))
    return found


def run_baseline(records: list[SlotRecord], stage: Callable[..., Any], timed: bool = True) -> list[Window]:
    """The hand-written pipeline; returns every window's result."""

    async def pipeline() -> list[Window]:
        first: asyncio.Queue[Any] = asyncio.Queue(8)
        second: asyncio.Queue[Any] = asyncio.Queue(8)
        results = await asyncio.gather(_produce(records, first), stage(first, second), _collect(second, timed))
        windows: list[Window] = results[2]
        return windows

    return uvloop.run(pipeline())


# -- streamlet ----------------------------------------------------------------


class Windows(sl.Sink):
    """Keeps every window result it receives, as the baseline's collector does."""

    def __init__(self, timed: bool) -> None:
        self.timed = timed
        self.found: list[Window] = []

    def open(self, context: sl.SinkContext) -> sl.ElementWriter:
        return _WindowsWriter(self)


class _WindowsWriter(sl.ElementWriter):
    def __init__(self, sink: Windows) -> None:
        self.sink = sink

    def write(self, batch: list[Any]) -> None:
        if self.sink.timed:  # a window's result carries its (start, end): the element's fifth field
            self.sink.found.extend((element[0], element[4][1], element[1]) for element in batch)
        else:
            self.sink.found.extend((element[0], element[1]) for element in batch)


def run_streamlet(records: list[sl.Record], window: sl.WindowSpec, timed: bool = True) -> list[Window]:
    """The streamlet job (``window_reduce`` with the built-in sum); returns every window's result."""
    topology = sl.Topology("windows-bench")
    source = topology.add_source("records", records, watermarks=sl.Watermarks(out_of_orderness=LATENESS))
    summed = topology.window_reduce("sum", "sum", window=window).set_input(source)
    windows = Windows(timed)
    topology.add_sink("windows", windows).set_input(summed)
    result = sl.run(topology)
    if result.statistics.late:
        raise AssertionError("the benchmark data should have no late records")
    return windows.found


def check_windows(name: str, ours: list[Window], theirs: list[Window], records: int) -> None:
    """Every window result the same on both sides (ends to the microsecond), and the sums adding up."""

    def rounded(found: list[Window]) -> Counter[Window]:
        return Counter(tuple(round(part, 6) if isinstance(part, float) else part for part in w) for w in found)

    mine, baseline = rounded(ours), rounded(theirs)
    if mine != baseline:
        differing = sorted(((mine - baseline) + (baseline - mine)).elements(), key=repr)[:3]
        count = sum(((mine - baseline) + (baseline - mine)).values())
        raise AssertionError(f"{name}: {count} window results differ from the baseline's, e.g. {differing}")
    if sum(window[-1] for window in ours) != records:
        raise AssertionError(f"{name}: the window sums do not add up to {records}")


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
            "count": lambda: run_streamlet(ours, sl.CountWindow(COUNT), timed=False),
            "count_base": lambda: run_baseline(theirs, _count_windows, timed=False),
        },
    )
    for name in ("event", "session", "count"):
        for (_, mine), (_, baseline) in zip(timings[name], timings[f"{name}_base"], strict=True):
            check_windows(name, mine, baseline, records)
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
