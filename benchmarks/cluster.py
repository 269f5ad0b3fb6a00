"""Word count on a local cluster of 1 and of 2 workers (2 also with ``--no-tls``); idle RSS of a master and a
worker.

Each configuration starts its own cluster (ZooKeeper, one master, the
workers) in a temporary state directory, submits ``benchmarks.cluster_job``
by reference and reads the workers' reports: the job's records/s is the
word count over the slowest worker's wall time (``*_with_submission``: over
the time from submitting to the job's end, scheduling and the workers'
start included), and ``tcp_share`` the share of records received over TCP
among all records received by tasks and sinks. Every run's totals are
checked against a plain count of the words.
Baseline: the same job in-process, in the same run. Recovery without a shared
disk (a worker killed and its folder deleted, restored from replicas) is
``benchmarks.recovery``.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

import streamlet as sl
from benchmarks.common import report
from benchmarks.recovery import recovery_with_replicas
from streamlet.backends.cluster.client import api as client
from streamlet.backends.cluster.local import local_cluster
from streamlet.backends.cluster.local.run import SESSION_TIMEOUT
from streamlet.backends.cluster.tree import paths

TARGET = "benchmarks.cluster_job:build_topology"


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MiB."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


Check = Callable[[dict[str, list[list[Any]]]], None]  # a job's collected sinks -> an AssertionError if wrong


def run_on_cluster(
    workers: int,
    records: int,
    repeats: int,
    target: str = TARGET,
    capacity: int = 3,
    tls: bool = True,
    check: Check | None = None,
    adapt: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start a cluster of ``workers`` (``capacity`` each; ``tls``: mutual TLS between them, as ``cluster up``
    by default), run the job ``target`` ``repeats`` times (under the adaptation settings ``adapt``, default:
    the cluster's), checking each run's output with ``check`` (default: the word count's totals), stop it.
    Besides the medians: every run's rate (``rates``, in order) and its adaptation decisions' actions."""  # fmt: skip
    check = check or (lambda sinks: check_totals(sinks["totals"], records))
    with tempfile.TemporaryDirectory() as directory:
        state_dir = Path(directory)
        state = local_cluster.up(state_dir, f"bench{workers}", workers, 1, None, capacity=capacity, tls=tls)
        try:
            anyio.run(_wait_ready, state, workers)
            time.sleep(2.0)  # let the processes settle before reading idle memory
            idle = {p["role"]: rss_mb(int(p["pid"])) for p in state.processes if p["role"] in ("master", "worker")}
            rates, shares, whole, decided = [], [], [], []
            for repeat in range(repeats):
                began = time.perf_counter()
                outcome = anyio.run(
                    client.submit_and_wait,
                    state.settings(),
                    client.Submission(target, f"wc{repeat}", adapt=adapt),
                    True,
                    300,
                )
                whole.append(records / (time.perf_counter() - began))
                if outcome["state"] != "FINISHED":
                    raise RuntimeError(f"cluster job failed: {outcome['errors']}")
                check(client.collected(outcome))
                reports = list(outcome["done"].values())
                wall = max(r["statistics"]["wall_time"] for r in reports)
                received = sum(
                    node["records_in"] for r in reports for node in r["statistics"]["nodes"].values()
                    if node["kind"] != "source"
                )  # fmt: skip
                rates.append(records / wall)
                decided.append([decision["action"] for decision in outcome.get("decisions", [])])
                shares.append(sum(r["tcp_records_in"] for r in reports) / received)
            gaps = anyio.run(checkpoint_gaps, state, state_dir) if workers > 1 and target == TARGET else []
            return {
                "rate": statistics.median(rates), "tcp_share": round(statistics.median(shares), 3), "idle": idle,
                "with_submission": statistics.median(whole),
                "gap": round(statistics.median(gaps), 3) if gaps else None, "gaps": len(gaps),
                "rates": rates, "decisions": decided,
            }  # fmt: skip
        finally:
            local_cluster.down(state_dir)


def check_totals(rows: list[list[Any]], records: int) -> None:
    """The job's totals ([word, count, ts] rows) are exactly a plain count of its words."""
    from collections import Counter

    from benchmarks.wordcount import make_words

    found = {word: count for word, count, _ts in rows}
    if len(found) != len(rows) or found != dict(Counter(make_words(records))):
        raise AssertionError("the cluster's word counts differ from a plain count of the words")


CHECKPOINT_INTERVAL = 0.5


async def checkpoint_gaps(state: local_cluster.ClusterState, state_dir: Path) -> list[float]:
    """The job again with a checkpoint every ``CHECKPOINT_INTERVAL`` s: the gaps between completions (s)."""
    from streamlet.backends.cluster.tree.zk import ZkStore

    checkpoint = {"interval": CHECKPOINT_INTERVAL, "replicas": None}
    submission = client.Submission("benchmarks.cluster_job:build_long_topology", "checkpointed", checkpoint=checkpoint)
    await client.submit_and_wait(state.settings(), submission, False, 60)
    completions: list[float] = []
    async with ZkStore(state.zk, state.name, secret=state.secret()) as zk:
        version: int | None = None
        with anyio.fail_after(300):
            while True:
                data, version = await zk.wait_changed(paths.completed("checkpointed"), version)
                if data is None:
                    continue
                if data["finished"]:  # the final checkpoint comes when the job ends, not on the interval
                    break
                completions.append(float(data["at"]))
    return [later - earlier for earlier, later in itertools.pairwise(completions)]


async def _wait_ready(state: local_cluster.ClusterState, workers: int) -> None:
    from streamlet.backends.cluster.client.status import wait_until_ready

    await wait_until_ready(state.settings(), workers)


def in_process(records: int, repeats: int) -> float:
    """The same job in one process (median records/s)."""
    from benchmarks.cluster_job import build_topology

    rates = []
    for _ in range(repeats):
        topology = build_topology()
        began = time.perf_counter()
        sl.run(topology)
        rates.append(records / (time.perf_counter() - began))
    return statistics.median(rates)


def main(records: int, repeats: int) -> dict[str, Any]:
    """1 worker, 2 workers and in-process; the line's figure is the 2-worker rate."""
    os.environ["STREAMLET_BENCH_RECORDS"] = str(records)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    )
    one = run_on_cluster(1, records, repeats)
    two = run_on_cluster(2, records, repeats)
    cleartext = run_on_cluster(2, records, repeats, tls=False)
    local = in_process(records, repeats)
    recovery = recovery_with_replicas()
    return report(
        "cluster",
        two["rate"],
        local,
        records_per_s_with_submission=round(two["with_submission"]),
        one_worker_records_per_s=round(one["rate"]),
        one_worker_records_per_s_with_submission=round(one["with_submission"]),
        two_worker_cleartext_records_per_s=round(cleartext["rate"]),
        tls_ratio=round(two["rate"] / cleartext["rate"], 3),  # mutual TLS (the default) over --no-tls
        two_worker_tcp_share=two["tcp_share"],
        one_worker_tcp_share=one["tcp_share"],
        idle_master_rss_mb=two["idle"]["master"],
        idle_worker_rss_mb=two["idle"]["worker"],
        **recovery,
        checkpoint_interval=CHECKPOINT_INTERVAL,
        checkpoint_gap_median_seconds=two["gap"],
        checkpoint_gaps_measured=two["gaps"],
        session_timeout=SESSION_TIMEOUT,
        records=records,
        repeats=repeats,
    )


if __name__ == "__main__":  # pragma: no cover
    subprocess.run([sys.executable, "-m", "benchmarks", "cluster", "--json"], check=True)
