"""source -> map to (word, 1) -> keyed count -> sink, against a hand-written asyncio pipeline.

The baseline is what a careful engineer writes without a framework: three
stages joined by bounded queues, batches of 1000, the same ``__slots__``
record objects created at the source and at the map stage, and a dict count.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import uvloop

import streamlet as sl
from benchmarks.common import SlotRecord, alternating, median_rate, report

BATCH = 1000
QUEUE_BATCHES = 8


def make_words(count: int, vocabulary: int = 10_000, seed: int = 7) -> list[str]:
    """``count`` words drawn from ``vocabulary`` distinct ones, reproducibly."""
    rng = random.Random(seed)
    vocab = [f"word{index}" for index in range(vocabulary)]
    return rng.choices(vocab, k=count)


# -- the hand-written baseline ----------------------------------------------


async def _produce(words: list[str], out: asyncio.Queue[Any]) -> None:
    for start in range(0, len(words), BATCH):
        ts = time.time()
        await out.put([SlotRecord(None, word, ts) for word in words[start : start + BATCH]])
    await out.put(None)


async def _map(inbox: asyncio.Queue[Any], out: asyncio.Queue[Any]) -> None:
    while (batch := await inbox.get()) is not None:
        await out.put([SlotRecord(record.value, 1, record.ts) for record in batch])
    await out.put(None)


async def _count(inbox: asyncio.Queue[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    get = counts.get
    while (batch := await inbox.get()) is not None:
        for record in batch:
            counts[record.key] = get(record.key, 0) + record.value
    return counts


async def _baseline(words: list[str]) -> dict[str, int]:
    first: asyncio.Queue[Any] = asyncio.Queue(QUEUE_BATCHES)
    second: asyncio.Queue[Any] = asyncio.Queue(QUEUE_BATCHES)
    _, _, counts = await asyncio.gather(_produce(words, first), _map(first, second), _count(second))
    return counts


def run_baseline(words: list[str]) -> dict[str, int]:
    """The hand-written pipeline on uvloop; returns the counts."""
    return uvloop.run(_baseline(words))


# -- streamlet ----------------------------------------------------------------


class CountWords(sl.Task):
    """Keyed count in runtime-owned state; totals emitted at the end."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        counts = self.state.values  # the state's dict itself: the documented fast path
        get = counts.get
        for record in inputs.get():
            counts[record.key] = get(record.key, 0) + record.value

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(self.state.items())


def build(words: list[str], parallelism: int = 1) -> sl.Topology:
    """The streamlet topology doing the baseline's work."""
    topology = sl.Topology("wordcount-bench")
    source = topology.add_source("words", words)
    pairs = topology.map("pair", lambda record: (record.value, 1)).set_input(source)
    count = topology.add_task("count", CountWords, parallelism=parallelism)
    count.set_input(pairs, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(count)
    return topology


def run_streamlet(words: list[str], parallelism: int = 1) -> dict[str, int]:
    """The streamlet job on uvloop; returns the counts."""
    result = sl.run(build(words, parallelism))
    return {record.key: record.value for record in result.sink("totals")}


def main(records: int, repeats: int) -> dict[str, Any]:
    """Both pipelines ``repeats`` times, alternating which goes first; report medians."""
    words = make_words(records)
    timings = alternating(repeats, {"streamlet": lambda: run_streamlet(words), "baseline": lambda: run_baseline(words)})
    if any(counts != timings["baseline"][0][1] for _, counts in timings["streamlet"]):
        raise AssertionError("streamlet and the baseline disagree on the counts")
    rate = median_rate(records, [seconds for seconds, _ in timings["streamlet"]])
    baseline = median_rate(records, [seconds for seconds, _ in timings["baseline"]])
    return report("wordcount", rate, baseline, records=records, repeats=repeats)
