"""Enrichment: ``map_async`` over a function that awaits 10 ms, at concurrency 64, against a hand-written loop;
and ``lookup_join`` at a 90 % cache hit rate (the ``lookup_*`` fields, ``benchmarks.enrich_lookup``).

Both sides run on uvloop over the same ``records`` records. streamlet: an
iterable source, ``map_async("enrich", lookup, concurrency=64)`` (ordered) and
a collecting sink. The baseline is what a careful engineer writes by hand: an
``asyncio.Semaphore(64)`` around each call and one ``asyncio.gather`` over
every record, results in input order. The ideal is 6 400 records/s (64 calls
per 10 ms); both outputs are checked equal every run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop

import streamlet as sl
from benchmarks import enrich_lookup
from benchmarks.common import alternating, median_rate, report

CONCURRENCY = 64
DELAY = 0.010


async def lookup(record: sl.Record) -> tuple[Any, Any]:
    """The remote call: 10 ms of waiting, then the value doubled."""
    await asyncio.sleep(DELAY)
    return record.key, record.value * 2


def run_streamlet(records: list[tuple[str, int]]) -> list[Any]:
    """The records through ``map_async``; the values out, in order."""
    topology = sl.Topology("enrich-bench")
    source = topology.add_source("in", records)
    mapped = topology.map_async("enrich", lookup, concurrency=CONCURRENCY).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(mapped)
    return [record.value for record in sl.run(topology).sink("out")]


async def _baseline(records: list[tuple[str, int]]) -> list[Any]:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(key: str, value: int) -> Any:
        async with limit:
            await asyncio.sleep(DELAY)
            return key, value * 2

    answers = await asyncio.gather(*(one(key, value) for key, value in records))
    return [value for _key, value in answers]


def run_baseline(records: list[tuple[str, int]]) -> list[Any]:
    """The records through a semaphore and one gather, on uvloop."""
    return uvloop.run(_baseline(records))


def main(records: int, repeats: int) -> dict[str, Any]:
    """Both, alternating order; medians; outputs compared every run."""
    made = [(f"k{i % 1000}", i) for i in range(records)]
    timings = alternating(repeats, {"streamlet": lambda: run_streamlet(made), "baseline": lambda: run_baseline(made)})
    expected = [2 * i for i in range(records)]
    for name, runs in timings.items():
        for _seconds, values in runs:
            if values != expected:
                raise AssertionError(f"{name}: the output differs from the input doubled")
    rates = {name: median_rate(records, [seconds for seconds, _ in runs]) for name, runs in timings.items()}
    return report(
        "enrich",
        rates["streamlet"],
        rates["baseline"],
        ideal_records_per_s=round(CONCURRENCY / DELAY),
        concurrency=CONCURRENCY,
        delay_ms=DELAY * 1000,
        records=records,
        repeats=repeats,
        **enrich_lookup.measure(10 * records, repeats),
    )
