"""source -> map to (word, 1) -> keyed count -> sink, against a hand-written asyncio pipeline.

The baseline is what a careful engineer writes without a framework: three
stages joined by bounded queues, batches of 1000 plain ``(key, value, ts)``
tuples (no object per record: the fastest honest shape, issue 18), and a
dict count. ``slots_baseline_*`` is the same pipeline building a
``__slots__`` record object per record at the source and at the map stage,
the baseline of earlier measurements, kept for comparison.
"""

from __future__ import annotations

import asyncio
import operator
import random
import time
import tracemalloc
from typing import Any

import uvloop

import streamlet as sl
from benchmarks.common import SlotRecord, alternating, median_rate, report
from streamlet.core.model.topology import ErrorPolicy
from streamlet.gc_policy import tuned_gc

BATCH = 1000
QUEUE_BATCHES = 8


def make_words(count: int, vocabulary: int = 10_000, seed: int = 7) -> list[str]:
    """``count`` words drawn from ``vocabulary`` distinct ones, reproducibly."""
    rng = random.Random(seed)
    vocab = [f"word{index}" for index in range(vocabulary)]
    return rng.choices(vocab, k=count)


# -- the hand-written baseline ----------------------------------------------


async def _produce_tuples(words: list[str], out: asyncio.Queue[Any]) -> None:
    for start in range(0, len(words), BATCH):
        ts = time.time()
        await out.put([(None, word, ts) for word in words[start : start + BATCH]])
    await out.put(None)


async def _map_tuples(inbox: asyncio.Queue[Any], out: asyncio.Queue[Any]) -> None:
    while (batch := await inbox.get()) is not None:
        await out.put([(value, 1, ts) for _, value, ts in batch])
    await out.put(None)


async def _count_tuples(inbox: asyncio.Queue[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    get = counts.get
    while (batch := await inbox.get()) is not None:
        for key, value, _ in batch:
            counts[key] = get(key, 0) + value
    return counts


async def _tuple_baseline(words: list[str]) -> dict[str, int]:
    first: asyncio.Queue[Any] = asyncio.Queue(QUEUE_BATCHES)
    second: asyncio.Queue[Any] = asyncio.Queue(QUEUE_BATCHES)
    _, _, counts = await asyncio.gather(
        _produce_tuples(words, first), _map_tuples(first, second), _count_tuples(second)
    )
    return counts


def run_tuple_baseline(words: list[str]) -> dict[str, int]:
    """The hand-written pipeline of plain tuples on uvloop; returns the counts."""
    return uvloop.run(_tuple_baseline(words))


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
    """The hand-written pipeline of slot records on uvloop; returns the counts."""
    return uvloop.run(_baseline(words))


# -- streamlet ----------------------------------------------------------------


class CountWords(sl.Task):
    """Keyed count in runtime-owned state; totals emitted at the end. It reads its input as the runtime
    carries it (``inputs.elements()``: tuples, no record made) and writes the state's dict itself: the
    documented fast paths of a hot loop."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        counts = self.state.values
        get = counts.get
        for element in inputs.elements():
            key = element[0]
            counts[key] = get(key, 0) + element[1]

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(self.state.items())


class CountWordsFromRecords(CountWords):
    """The same count reading ``inputs.get()``: one ``Record`` made per word at this hop."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        counts = self.state.values
        get = counts.get
        for record in inputs.get():
            counts[record.key] = get(record.key, 0) + record.value


class CountWordsAsTheReadme(CountWords):
    """The README's count: ``inputs.get()`` and ``self.state.get``/``put`` per word, no fast path used."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)


def build(
    words: list[str], parallelism: int = 1, counter: type[sl.Task] = CountWords, on_error: ErrorPolicy = "fail"
) -> sl.Topology:
    """The streamlet topology doing the baseline's work (``on_error``: the count's error policy)."""
    topology = sl.Topology("wordcount-bench")
    source = topology.add_source("words", words)
    pairs = topology.map("pair", lambda record: (record.value, 1)).set_input(source)
    count = topology.add_task("count", counter, parallelism=parallelism, on_error=on_error)
    count.set_input(pairs, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(count)
    return topology


def run_streamlet(
    words: list[str], parallelism: int = 1, counter: type[sl.Task] = CountWords, on_error: ErrorPolicy = "fail"
) -> dict[str, int]:
    """The streamlet job on uvloop; returns the counts."""
    result = sl.run(build(words, parallelism, counter, on_error))
    return {record.key: record.value for record in result.sink("totals")}


class LastValues(sl.Sink):
    """Keeps the last value of every key (an upsert into a table): memory bounded by the keys."""

    def __init__(self) -> None:
        self.values: dict[Any, Any] = {}

    def open(self, context: sl.SinkContext) -> sl.ElementWriter:
        return _LastValuesWriter(self.values)


class _LastValuesWriter(sl.ElementWriter):
    def __init__(self, values: dict[Any, Any]) -> None:
        self.values = values

    def write(self, batch: list[Any]) -> None:
        values = self.values
        for element in batch:
            values[element[0]] = element[1]


def run_reduce(words: list[str], on_error: ErrorPolicy = "fail") -> dict[str, int]:
    """The count with the ``reduce`` shortcut (each key's value once per batch) into :class:`LastValues`."""
    topology = sl.Topology("wordcount-reduce")
    source = topology.add_source("words", words)
    pairs = topology.map("pair", lambda record: (record.value, 1)).set_input(source)
    counts = topology.reduce("count", operator.add, on_error=on_error)
    counts.set_input(pairs, partitioning=sl.SAME_KEY)
    totals = LastValues()
    topology.add_sink("totals", totals).set_input(counts)
    sl.run(topology)
    return totals.values


def reduce_traced_peak_mb(words: list[str]) -> float:
    """The most memory Python held at once, beyond what it held before, while :func:`run_reduce` ran (MB,
    ``tracemalloc``: a separate, untimed run)."""
    tracemalloc.start()
    try:
        run_reduce(words)
        return round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
    finally:
        tracemalloc.stop()


def run_streamlet_tuned_gc(words: list[str]) -> dict[str, int]:
    """The streamlet job under the garbage-collector policy of the processes streamlet owns
    (``streamlet.gc_policy``: what ``streamlet run`` and the workers apply)."""
    with tuned_gc():
        return run_streamlet(words)


def run_baseline_tuned_gc(words: list[str]) -> dict[str, int]:
    """The hand-written tuple pipeline under the same policy: tuning the collector is open to it too."""
    with tuned_gc():
        return run_tuple_baseline(words)


def main(records: int, repeats: int) -> dict[str, Any]:
    """The pipelines ``repeats`` times each, alternating which goes first; report medians. The headline is
    streamlet with the interpreter's defaults (as embedded) against the baseline with them; ``tuned_gc_*``
    are both under the policy ``streamlet run`` and the workers use (``tuned_gc_ratio``: streamlet's over
    the baseline's, both tuned; ``tuned_gc_speedup``: streamlet tuned over streamlet as embedded);
    ``records_api_*``: the count reading ``inputs.get()`` (records refilled batch after batch), as embedded,
    ``records_api_slots_ratio`` its rate over the slots pipeline's; ``readme_task_*``: the README's count
    (``inputs.get()`` and ``self.state.get``/``put``);
    ``reduce_*``: the count with the ``reduce`` shortcut into a sink keeping each key's last value, and the
    most memory it held at once beyond its input (a separate run under ``tracemalloc``); ``skip_*`` and
    ``reduce_skip_*``: the same counts under ``on_error="skip"`` (each call's state writes journaled so a
    failed record can be taken back), ``*_cost`` the share of throughput that costs against ``fail``."""
    words = make_words(records)
    timings = alternating(repeats, {
        "streamlet": lambda: run_streamlet(words), "baseline": lambda: run_tuple_baseline(words),
        "tuned": lambda: run_streamlet_tuned_gc(words), "baseline_tuned": lambda: run_baseline_tuned_gc(words),
        "slots": lambda: run_baseline(words),
        "records_api": lambda: run_streamlet(words, counter=CountWordsFromRecords),
        "readme_task": lambda: run_streamlet(words, counter=CountWordsAsTheReadme),
        "reduce": lambda: run_reduce(words),
    })  # fmt: skip
    # Apart, so that the default runs above share the heap with the same neighbours as before: each policy's
    # cost against "fail" is measured beside its own "fail" run.
    policies = alternating(repeats, {
        "fail": lambda: run_streamlet(words), "skip": lambda: run_streamlet(words, on_error="skip"),
        "reduce_fail": lambda: run_reduce(words), "reduce_skip": lambda: run_reduce(words, on_error="skip"),
    })  # fmt: skip
    timings.update(policies)
    runs = ("streamlet", "tuned", "baseline_tuned", "slots", "records_api", "readme_task")
    runs += ("reduce", "skip", "reduce_skip")
    if any(counts != timings["baseline"][0][1] for run in runs for _, counts in timings[run]):
        raise AssertionError("streamlet and the baseline disagree on the counts")
    rate = median_rate(records, [seconds for seconds, _ in timings["streamlet"]])
    tuned = median_rate(records, [seconds for seconds, _ in timings["tuned"]])
    baseline = median_rate(records, [seconds for seconds, _ in timings["baseline"]])
    baseline_tuned = median_rate(records, [seconds for seconds, _ in timings["baseline_tuned"]])
    slots = median_rate(records, [seconds for seconds, _ in timings["slots"]])
    from_records = median_rate(records, [seconds for seconds, _ in timings["records_api"]])
    readme_task = median_rate(records, [seconds for seconds, _ in timings["readme_task"]])
    reduced = median_rate(records, [seconds for seconds, _ in timings["reduce"]])
    fail, skip, reduce_fail, reduce_skip = (
        median_rate(records, [seconds for seconds, _ in policies[run]])
        for run in ("fail", "skip", "reduce_fail", "reduce_skip")
    )
    return report(
        "wordcount", rate, baseline, slots_baseline_records_per_s=round(slots), slots_ratio=round(rate / slots, 3),
        tuned_gc_records_per_s=round(tuned),
        tuned_gc_baseline_records_per_s=round(baseline_tuned), tuned_gc_ratio=round(tuned / baseline_tuned, 3),
        tuned_gc_speedup=round(tuned / rate, 3), records_api_records_per_s=round(from_records),
        records_api_ratio=round(from_records / baseline, 3), records_api_slots_ratio=round(from_records / slots, 3),
        readme_task_records_per_s=round(readme_task), readme_task_slots_ratio=round(readme_task / slots, 3),
        reduce_records_per_s=round(reduced),
        reduce_ratio=round(reduced / baseline, 3), reduce_traced_peak_mb=reduce_traced_peak_mb(words),
        skip_records_per_s=round(skip), skip_cost=round(1 - skip / fail, 3),
        reduce_skip_records_per_s=round(reduce_skip), reduce_skip_cost=round(1 - reduce_skip / reduce_fail, 3),
        records=records, repeats=repeats,
    )  # fmt: skip
