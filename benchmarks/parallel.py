"""All the cores of one machine: a CPU-bound map in 2 worker processes against the same job in one process.

The job: numbers -> ``work`` (a map spending about 20 µs of pure Python
arithmetic per record, parallelism 2) -> ``totals`` (a user task summing the
results per key, emitted when the input ends) -> a ``CollectSink``. The
headline runs it with ``processes=2`` (each process runs one instance of
``work``: two cores) against the same job with ``processes=1`` (both
instances of ``work`` share one event loop, one core: the baseline). In the
same rounds the job with ``work`` at parallelism 1 runs in one process too,
so ``inprocess_ratio`` says what parallelism 2 costs or gains inside one
process (one core: nothing to gain, nothing should be lost). Every run's
totals must be equal. ``work_us_per_record`` is the map's cost measured
alone, outside any job. ``cluster_*``: the same job submitted to a local
cluster (ZooKeeper, a master, the workers) of 2 workers against one of 1
worker (``benchmarks.cluster.run_on_cluster``; records/s over the slowest
worker's wall time, medians of 3), every worker at the default capacity
(8). The dispatcher co-locates an instance with its upstream while the
worker has room (seed 000's rule, to keep edges in memory), so the job
starts packed on one worker; the default ``spread`` policy finds ``work``
CPU-bound from the first heartbeats and migrates ``work.1`` live, and keeps
a CPU hint for the topology, so the next submissions of it (the 2nd and
3rd run on the same cluster) are placed spread from the start.
``cluster_first_run_ratio`` is the first run alone (no hint yet: spread
by migration), ``cluster_decisions`` each run's adaptation decisions. For
the record: ``cluster_packed_ratio`` with ``--adapt none`` (co-located,
one core) and ``cluster_capacity_2_ratio`` with ``--adapt none`` at
capacity 2 (each worker runs one instance of ``work``: spread by capacity).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import streamlet as sl
import streamlet.backends.processes  # imported here, outside the timed runs (as every import)
from benchmarks.common import alternating, median_rate, report

ROUNDS = 410  # iterations of the arithmetic loop per record: about 20 µs here
KEYS = 16


def burn(value: int) -> int:
    """About 20 µs of pure Python arithmetic (no allocation worth counting, nothing the GIL lets go of)."""
    acc = value
    for step in range(ROUNDS):
        acc = (acc * 31 + step) % 1_000_003
    return acc


class Totals(sl.Task):
    """Sums the values per key; emits the totals when the input ends (so little goes back to the caller)."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        totals = self.state.values
        get = totals.get
        for record in inputs.get():
            totals[record.key] = get(record.key, 0) + record.value

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(self.state.items())


def build(records: int, parallelism: int) -> sl.Topology:
    """The job, with ``work`` at ``parallelism``."""
    topology = sl.Topology("parallel-bench")
    numbers = topology.add_source("numbers", [sl.Record(n % KEYS, n, 0.0) for n in range(records)])
    work = topology.map("work", lambda r: (r.key, burn(r.value)), parallelism=parallelism).set_input(numbers)
    totals = topology.add_task("totals", Totals).set_input(work)
    topology.add_sink("out", sl.CollectSink()).set_input(totals)
    return topology


def run(records: int, parallelism: int, processes: int) -> dict[int, int]:
    """One run of the job; its totals per key."""
    result = sl.run(build(records, parallelism), processes=processes)
    return {record.key: record.value for record in result.sink("out")}


def work_us_per_record(records: int = 20_000) -> float:
    """The map's own cost per record, outside any job (median of 3)."""
    timings = []
    for _ in range(3):
        began = time.perf_counter()
        for value in range(records):
            burn(value)
        timings.append(time.perf_counter() - began)
    return round(sorted(timings)[1] / records * 1e6, 2)


def on_clusters(records: int, expected: dict[int, int]) -> dict[str, Any]:
    """The job on a local cluster of 2 workers against one of 1 worker; every run's totals checked against
    ``expected`` (the in-process run's)."""
    from benchmarks.cluster import run_on_cluster

    def check(sinks: dict[str, list[list[Any]]]) -> None:
        if {key: value for key, value, _ts in sinks["out"]} != expected:
            raise AssertionError("the cluster's totals differ from the in-process run's")

    os.environ["STREAMLET_BENCH_RECORDS"] = str(records)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    )

    def on(workers: int, capacity: int = CAPACITY, adapt: dict[str, Any] | None = None) -> dict[str, Any]:
        return run_on_cluster(workers, records, 3, target=CLUSTER_TARGET, capacity=capacity, check=check, adapt=adapt)

    one = on(1)
    two = on(2)  # the default adaptation: spread
    packed = on(2, adapt=NO_ADAPTATION)
    split = on(2, capacity=2, adapt=NO_ADAPTATION)
    return {
        "cluster_two_workers_records_per_s": round(two["rate"]),
        "cluster_one_worker_records_per_s": round(one["rate"]),
        "cluster_two_workers_records_per_s_with_submission": round(two["with_submission"]),
        "cluster_one_worker_records_per_s_with_submission": round(one["with_submission"]),
        "cluster_ratio": round(two["rate"] / one["rate"], 3),
        "cluster_first_run_ratio": round(two["rates"][0] / one["rate"], 3),
        "cluster_decisions": two["decisions"],
        "cluster_packed_ratio": round(packed["rate"] / one["rate"], 3),
        "cluster_capacity_2_ratio": round(split["rate"] / one["rate"], 3),
    }


CAPACITY = 8  # ``streamlet cluster up``'s default capacity: what a user gets without asking
NO_ADAPTATION = {"policies": [], "bounds": {}, "interval": 2.0, "cooldown": 6.0}  # ``--adapt none``
CLUSTER_TARGET = "benchmarks.parallel_job:build_topology"


def main(records: int, repeats: int) -> dict[str, Any]:
    """The three runs ``repeats`` times each, alternating which goes first; report medians."""
    timings = alternating(repeats, {
        "processes": lambda: run(records, 2, processes=2),
        "baseline": lambda: run(records, 2, processes=1),
        "inprocess_1": lambda: run(records, 1, processes=1),
    })  # fmt: skip
    expected = timings["baseline"][0][1]
    if any(totals != expected for runs in timings.values() for _, totals in runs):
        raise AssertionError("the runs disagree on the totals")
    rate = median_rate(records, [seconds for seconds, _ in timings["processes"]])
    baseline = median_rate(records, [seconds for seconds, _ in timings["baseline"]])
    single = median_rate(records, [seconds for seconds, _ in timings["inprocess_1"]])
    return report(
        "parallel", rate, baseline, processes=2, inprocess_records_per_s=round(baseline),
        inprocess_parallelism_1_records_per_s=round(single), inprocess_ratio=round(baseline / single, 3),
        work_us_per_record=work_us_per_record(), **on_clusters(records, expected), cores=os.cpu_count(),
        records=records,
        repeats=repeats,
    )  # fmt: skip
