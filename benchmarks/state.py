"""Keyed state in memory vs in RocksDB: a keyed count over many distinct keys, each backend in a process of its
own (so each reports its own peak RSS).

The job is the word count's (a pairing map, then ``benchmarks.wordcount.CountWords`` writing ``self.state.values``
in its hot loop) over ``keys`` distinct words, each seen ``records / keys`` times; the words are made as they are
read, and at the end the count walks its state and emits one summary (the keys and the sum of their counts)
instead of a record per key (which ``finish`` would hold all at once), so a run's peak RSS is its state's. The
baseline is the same job on the in-memory dict (the default backend, the fastest); the measured figure is the
job on ``RocksDBState(cache_mb=64)``. ``ratio`` = RocksDB / dict (target >= 0.4 at 1 M keys). Each variant runs
``repeats`` times in a fresh interpreter; medians.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import report

VARIANT = """
import json, sys, time
sys.path.insert(0, {root!r})
import streamlet as sl
from benchmarks.wordcount import CountWords

keys, records, backend = {keys}, {records}, {backend!r}
totals = []


class CountAndSum(CountWords):
    def finish(self, outputs):  # the state walked, one summary emitted: the output holds nothing per key
        kept = total = 0
        for _, count in self.state.items():
            kept, total = kept + 1, total + count
        outputs.emit("summary", (kept, total))


def words():  # made as read, and the totals counted as they come: the process holds the state, not the data
    for i in range(records):
        yield f"w{{i % keys}}"


def counted(record):
    totals.append(record.value)


topology = sl.Topology("state-bench")
pairs = topology.map("pair", lambda record: (record.value, 1)).set_input(topology.add_source("words", words()))
count = topology.add_task("count", CountAndSum).set_input(pairs, partitioning=sl.SAME_KEY)
topology.add_sink("totals", sl.CallbackSink(counted)).set_input(count)
state = None if backend == "memory" else sl.RocksDBState({folder!r}, cache_mb=64)
began = time.perf_counter()
sl.run(topology, state_backend=state)
seconds = time.perf_counter() - began
assert totals == [(keys, records)], totals
with open("/proc/self/status") as status:  # this process's own peak (getrusage keeps the parent's from before exec)
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
print(json.dumps({{"seconds": seconds, "peak_rss_mb": peak}}))
"""


def run_variant(backend: str, keys: int, records: int) -> dict[str, float]:
    """One run of the count on ``backend`` in a new interpreter: its seconds and peak RSS (MB)."""
    root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory() as folder:
        code = VARIANT.format(root=root, keys=keys, records=records, backend=backend, folder=folder)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    measured: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def main(records: int, repeats: int, keys: int = 1_000_000) -> dict[str, Any]:
    """Alternate the backends ``repeats`` times; median rates and peak RSS of each."""
    keys = min(keys, records)  # a short run (--records) counts fewer distinct keys
    runs: dict[str, list[dict[str, float]]] = {"memory": [], "rocksdb": []}
    began = time.perf_counter()
    for turn in range(repeats):
        for backend in ("memory", "rocksdb") if turn % 2 == 0 else ("rocksdb", "memory"):
            runs[backend].append(run_variant(backend, keys, records))

    def rate(backend: str) -> float:
        return records / statistics.median(run["seconds"] for run in runs[backend])

    def rss(backend: str) -> float:
        return round(statistics.median(run["peak_rss_mb"] for run in runs[backend]), 1)

    return report(
        "state",
        rate("rocksdb"),
        rate("memory"),
        keys=keys,
        records=records,
        repeats=repeats,
        rocksdb_peak_rss_mb=rss("rocksdb"),
        memory_peak_rss_mb=rss("memory"),
        cache_mb=64,
        wall_seconds=round(time.perf_counter() - began, 1),
    )
