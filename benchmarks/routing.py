"""SAME_KEY routing through key segments against the routing it replaced (``stable_hash % n``).

Both sides route the same records (10 000 keys, Zipf-free uniform draw) into
4 instance buffers in batches of 1000, with the per-key cache each uses:

- measured: streamlet's ``KeyedRoute`` (key -> segment -> instance through
  the segment table, the instance cached per key);
- baseline: the previous router, written out here as it was: the instance
  ``stable_hash(key) % 4`` cached per key, appended to that instance's buffer.

The issue's budget: segments may cost at most 5 % (ratio >= 0.95). A second
pair of figures times a whole keyed job (source -> keyed count, 4 instances)
so the routing share can be seen in context; its baseline is the same job
with one instance (no routing at all).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import streamlet as sl
from benchmarks.common import alternating, median_rate, report
from streamlet.core.model.partition import stable_hash
from streamlet.core.model.record import Batch, Element
from streamlet.core.model.segments import DEFAULT_SEGMENTS, SegmentTable
from streamlet.core.runtime.channel import Inbox, LocalChannel
from streamlet.core.runtime.routing import KeyedRoute

BATCH = 1000
INSTANCES = 4


def _records(count: int, keys: int = 10_000, seed: int = 11) -> list[Batch]:
    rng = random.Random(seed)
    now = time.time()
    records = [(f"key{rng.randrange(keys)}", 1, now) for _ in range(count)]
    return [records[start : start + BATCH] for start in range(0, count, BATCH)]


def _old_router(buffers: list[Batch]) -> Callable[[Element], None]:
    """The router before segments: ``stable_hash(key) % n`` with a per-key cache."""
    appenders = [buffer.append for buffer in buffers]
    cache: dict[Any, int] = {}
    parts, limit = len(buffers), 1 << 17

    def add(element: Element) -> None:
        key = element[0]
        try:
            index = cache.get(key)
        except TypeError:
            index = None
        if index is None:
            index = stable_hash(key) % parts
            if len(cache) >= limit:
                cache.clear()
            cache[key] = index
        appenders[index](element)

    return add


def _drive(batches: list[Batch], add: Callable[[Element], None], buffers: list[Batch]) -> int:
    routed = 0
    for batch in batches:
        for record in batch:
            add(record)
        for buffer in buffers:
            routed += len(buffer)
            buffer.clear()
    return routed


def _segments(batches: list[Batch]) -> int:
    inbox = Inbox(2)
    channels: list[Any] = [LocalChannel(inbox, inbox.add_channel(0)) for _ in range(INSTANCES)]
    route = KeyedRoute(channels, SegmentTable.contiguous(DEFAULT_SEGMENTS, INSTANCES))
    return _drive(batches, route.add, route.buffers)


def _previous(batches: list[Batch]) -> int:
    buffers: list[Batch] = [[] for _ in range(INSTANCES)]
    return _drive(batches, _old_router(buffers), buffers)


def _job(words: list[tuple[str, int]], parallelism: int) -> int:
    topology = sl.Topology("keyed")
    source = topology.add_source("in", words)
    count = topology.reduce("count", lambda a, b: a + b, parallelism=parallelism)
    count.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", lambda record: None).set_input(count)
    result = asyncio.run(sl.Job(topology, channel_factory=LocalChannel).run())
    return result.statistics.nodes["count"].records_in


def main(records: int, repeats: int) -> dict[str, Any]:
    """Route ``records`` records both ways; the ratio is segments / previous."""
    batches = _records(records)
    timings = alternating(repeats, {"segments": lambda: _segments(batches), "previous": lambda: _previous(batches)})
    assert all(result == records for _, result in timings["segments"] + timings["previous"])
    words = [(element[0], 1) for batch in batches[: max(1, len(batches) // 4)] for element in batch]
    jobs = alternating(max(1, repeats // 2), {"four": lambda: _job(words, INSTANCES), "one": lambda: _job(words, 1)})
    return report(
        "routing",
        median_rate(records, [seconds for seconds, _ in timings["segments"]]),
        median_rate(records, [seconds for seconds, _ in timings["previous"]]),
        keys=10_000,
        instances=INSTANCES,
        segments=DEFAULT_SEGMENTS,
        job_keyed_4_records_per_s=round(median_rate(len(words), [s for s, _ in jobs["four"]])),
        job_keyed_1_records_per_s=round(median_rate(len(words), [s for s, _ in jobs["one"]])),
    )
