"""An event-time job whose output may not depend on where, or how parallel, it runs (issue 13).

One source instance (its batches fix which records are late), per-second
keyed sums, and 3 s sums of those (cascaded: the per-second results carry
their window's last tick, so they land whole in the 3 s windows). About one
record in 97 comes 3 s behind the others: late when its batch starts after
the watermark passed its second. A cluster job file: ``streamlet submit
tests/support/event_time_job.py -p per-second=N -p per-3s=N``.
"""

from __future__ import annotations

import random

import streamlet as sl

PARALLELISM = 1
BOUND = 0.5  # the source's out-of-orderness bound, seconds


def events(count: int = 6000, seed: int = 13) -> list[sl.Record]:
    """``count`` readings 10 ms apart with up to 300 ms of disorder; every 97th is 3 s behind."""
    rng = random.Random(seed)
    records = []
    for index in range(count):
        ts = index * 0.01 + rng.random() * 0.3 - (3.0 if index % 97 == 0 else 0.0)
        records.append(sl.Record(f"s{rng.randrange(12)}", rng.randrange(100), round(ts, 3)))
    return records


def build_topology(parallelism: int = PARALLELISM) -> sl.Topology:
    """events -> per-second sums -> 3 s sums -> 'sums'; the per-second late port -> 'late'."""
    topology = sl.Topology("event-time")
    source = topology.add_source("events", events(), watermarks=sl.Watermarks(out_of_orderness=BOUND))
    second = sl.TimeWindow(1.0, time="event")
    per_second = topology.window_reduce("per-second", "sum", window=second, parallelism=parallelism)
    per_second.set_input(source, partitioning=sl.SAME_KEY)
    three = sl.TimeWindow(3.0, time="event")
    per_3s = topology.window_reduce("per-3s", "sum", window=three, parallelism=parallelism)
    per_3s.set_input(per_second, partitioning=sl.SAME_KEY)
    topology.add_sink("sums", sl.CollectSink()).set_input(per_3s)
    topology.add_sink("late", sl.CollectSink()).set_input(per_second, out_port=sl.LATE)
    return topology
