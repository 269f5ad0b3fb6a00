"""``lookup_join`` at a 90 % cache hit rate against a hand-written dict cache in front of the same lookup.

The lookup is a store's round trip: 1 ms of waiting per call, then a row per key
asked. Nine records in ten carry one of 100 hot keys (looked up once, then
cached); the tenth a key never seen before, so nine in ten are joined from the
cache. The baseline is what a careful engineer writes by hand: batches of 1 000
records (streamlet's batch size), one ``await lookup(misses)`` per batch for its
distinct uncached keys, a dict as the cache, ``(value, row)`` per record in
order. streamlet runs ``lookup_join`` with ``concurrency=1`` (one lookup at a
time, as the baseline) for the ratio, and with its default ``concurrency=4``
beside it. The outputs are checked equal every run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop

import streamlet as sl
from benchmarks.common import alternating, median_rate

DELAY = 0.001
BATCH = 1000
HOT_KEYS = 100


async def lookup(keys: list[str]) -> dict[str, tuple[str, int]]:
    """The store: one round trip, then each key's row."""
    await asyncio.sleep(DELAY)
    return {key: (key.upper(), len(key)) for key in keys}


def make_records(records: int) -> list[tuple[str, int]]:
    """Every tenth record a new key; the others one of the hot keys."""
    return [(f"new{i}" if i % 10 == 0 else f"hot{i % HOT_KEYS}", i) for i in range(records)]


def run_streamlet(records: list[tuple[str, int]], concurrency: int) -> tuple[list[Any], int]:
    """The records through ``lookup_join``; the values out, in order, and the records joined from the cache."""
    topology = sl.Topology("lookup-bench")
    source = topology.add_source("in", records)
    joined = topology.lookup_join("enrich", lookup, concurrency=concurrency, cache_size=1_000_000)
    joined.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    result = sl.run(topology)
    return [record.value for record in result.sink("out")], result.statistics.nodes["enrich"].cache_hits


async def _baseline(records: list[tuple[str, int]]) -> list[Any]:
    cache: dict[str, Any] = {}
    values: list[Any] = []
    for start in range(0, len(records), BATCH):
        batch = records[start : start + BATCH]
        misses = list(dict.fromkeys(key for key, _ in batch if key not in cache))
        if misses:
            cache.update(await lookup(misses))
        values.extend((value, cache[key]) for key, value in batch)
    return values


def run_baseline(records: list[tuple[str, int]]) -> list[Any]:
    """The records through a dict cache and one lookup per batch, on uvloop."""
    return uvloop.run(_baseline(records))


def measure(records: int, repeats: int) -> dict[str, Any]:
    """The lookup line's fields: rates, ratio, the hit rate measured; outputs compared every run."""
    made = make_records(records)
    timings = alternating(
        repeats,
        {
            "lookup": lambda: run_streamlet(made, 1),
            "lookup_concurrent": lambda: run_streamlet(made, 4),
            "lookup_baseline": lambda: (run_baseline(made), None),
        },
    )
    expected = [(value, (key.upper(), len(key))) for key, value in made]
    for name, runs in timings.items():
        for _seconds, (values, _hits) in runs:
            if values != expected:
                raise AssertionError(f"{name}: the output differs from each record joined with its row")
    hits = timings["lookup"][0][1][1]
    rates = {name: median_rate(records, [seconds for seconds, _ in runs]) for name, runs in timings.items()}
    return {
        "lookup_records_per_s": round(rates["lookup"]),
        "lookup_baseline_records_per_s": round(rates["lookup_baseline"]),
        "lookup_ratio": round(rates["lookup"] / rates["lookup_baseline"], 3),
        "lookup_concurrency_4_records_per_s": round(rates["lookup_concurrent"]),
        "lookup_hit_rate": round(hits / records, 3),
        "lookup_records": records,
    }
