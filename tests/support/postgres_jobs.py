"""Keyed running counts written through two ``PostgresSink``s (append and upsert), in process, in a child
process a test kills, and as a job file for a real cluster.

Run as a script it is the child process a test kills::

    python -m tests.support.postgres_jobs DSN CHECKPOINTS --die-after-save N

which SIGKILLs itself right after checkpoint ``N`` is saved, before any sink commits it: the window in
which a checkpoint is complete but its rows are not in the table yet.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

import streamlet as sl
from tests.support import exactly_once
from tests.support.exactly_once import DieAfterSave, expected_output, items
from tests.support.postgres import sql

TABLES = """
CREATE TABLE counts_log (key text NOT NULL, n bigint NOT NULL, UNIQUE (key, n));
CREATE TABLE counts (key text PRIMARY KEY, n bigint NOT NULL);
"""


def create_tables(dsn: str) -> None:
    """The append table (``counts_log``: every (key, n) once, a unique key catching a double) and the upsert
    table (``counts``: each key's latest n)."""
    sql(dsn, TABLES)


def count_row(record: sl.Record) -> dict[str, Any]:
    """``{"key": ..., "n": ...}``."""
    return {"key": record.key, "n": record.value}


def sinks(dsn: str, batch_rows: int = 50) -> tuple[sl.PostgresSink, sl.PostgresSink]:
    """The append sink and the upsert sink (50 rows: an epoch is staged in several copies, in one transaction)."""
    return (
        sl.PostgresSink(dsn, "counts_log", row=count_row, batch_rows=batch_rows),
        sl.PostgresSink(dsn, "counts", row=count_row, conflict=["key"], batch_rows=batch_rows),
    )


def build(
    dsn: str,
    source: sl.Source | None = None,
    batch_rows: int = 50,
    fault: tuple[str, type[sl.Task]] = ("bomb", exactly_once.Bomb),
) -> sl.Topology:
    """4000 records (or ``source``) -> throttle -> the ``fault`` task (name, class; default: the bomb) -> running
    count (x2, SAME_KEY) -> append and upsert sinks (x2 each; the upsert sink by SAME_KEY: a key's rows through
    one instance, whose commits are ordered), holding ``batch_rows`` rows before they copy."""
    topology = sl.Topology("postgres-exactly-once")
    lines = topology.add_source("in", items() if source is None else source)
    throttle = topology.add_task("throttle", exactly_once.Throttle).set_input(lines)
    faulty = topology.add_task(fault[0], fault[1]).set_input(throttle)
    count = topology.add_task("count", exactly_once.RunningCount, parallelism=2)
    count.set_input(faulty, partitioning=sl.SAME_KEY)
    appended, latest = sinks(dsn, batch_rows)
    topology.add_sink("appended", appended, parallelism=2).set_input(count)
    topology.add_sink("latest", latest, parallelism=2).set_input(count, partitioning=sl.SAME_KEY)
    return topology


def run(
    dsn: str,
    checkpoints: Path,
    processes: int = 1,
    store: sl.CheckpointStore | None = None,
    source: sl.Source | None = None,
) -> sl.JobResult:
    """Run the job with a checkpoint every 20 ms."""
    options: dict[str, Any] = {"checkpoint_interval": 0.02, "batch_size": exactly_once.BATCH, "processes": processes}
    if store is None:
        options["checkpoint_dir"] = checkpoints
    else:
        options["checkpoint_store"] = store
    return sl.run(build(dsn, source), **options)


def appended_rows(dsn: str) -> list[tuple[str, int]]:
    """Every (key, n) in the append table, sorted."""
    return sorted(sql(dsn, "SELECT key, n FROM counts_log"))


def latest_rows(dsn: str) -> dict[str, int]:
    """key -> n of the upsert table."""
    return dict(sql(dsn, "SELECT key, n FROM counts"))


def expected_latest() -> dict[str, int]:
    """Each key's final count."""
    return dict(Counter(key for key, _ in items()))


def assert_exact(dsn: str) -> None:
    """Append: each (key, n) once; upsert: each key's final count; nothing left staged (no batch, no row)."""
    found, wanted = appended_rows(dsn), expected_output()
    doubled, missing = Counter(found) - Counter(wanted), Counter(wanted) - Counter(found)
    assert found == wanted, f"{doubled.total()} rows extra, first {sorted(doubled)[:10]}; " + (
        f"{missing.total()} missing, first {sorted(missing)[:10]}"
    )
    assert latest_rows(dsn) == expected_latest()
    assert sql(dsn, "SELECT count(*) FROM streamlet_sink_staging") == [(0,)]
    assert sql(dsn, "SELECT count(*) FROM streamlet_sink_staged") == [(0,)]


# The cluster job: the same counts from a list source, paced so checkpoints complete while it runs. The first
# sink instance to commit rows it staged (the checkpoint is complete, its rows are not in the tables yet) hits
# FAULT: "kill" SIGKILLs its worker; "stop" SIGSTOPs it (the test lets it sleep past its ZooKeeper session,
# then wakes it: a zombie that goes on with its commit, shielded so that its losing the session cannot cancel
# it first). The marker file MARK (holding the worker's PID) makes it happen once.
CLUSTER_JOB = """
import asyncio
import os
import signal
import anyio
import streamlet as sl

WORDS = [(f"w{(i * 7919) % 97}", i) for i in range(20_000)]

class Slow(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.1)  # pacing: 20 batches, about 2 s, so checkpoints complete while it runs
        outputs.emit_batch(inputs.get())

class RunningCount(sl.Task):
    def execute(self, inputs, outputs):
        for record in inputs.get():
            count = self.state.get(record.key, 0) + 1
            self.state.put(record.key, count)
            outputs.emit(record.key, count)

def count_row(record):
    return {"key": record.key, "n": record.value}

class FaultySink(sl.PostgresSink):
    def open(self, context):
        writer = super().open(context)
        commit = writer.commit

        async def faulty_commit(epoch):
            if writer.prepared and not os.path.exists(MARK):
                with open(MARK, "w", encoding="utf-8") as mark:
                    mark.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL if FAULT == "kill" else signal.SIGSTOP)
            with anyio.CancelScope(shield=True):
                await commit(epoch)

        writer.commit = faulty_commit
        return writer

def build_topology():
    topology = sl.Topology("postgres-cluster")
    source = topology.add_source("words", WORDS)
    slow = topology.add_task("slow", Slow).set_input(source)
    count = topology.add_task("count", RunningCount, parallelism=2).set_input(slow, partitioning=sl.SAME_KEY)
    appended = FaultySink(DSN, "counts_log", row=count_row, batch_rows=500)
    latest = FaultySink(DSN, "counts", row=count_row, conflict=["key"], batch_rows=500)
    topology.add_sink("appended", appended, parallelism=2).set_input(count)
    topology.add_sink("latest", latest, parallelism=2).set_input(count, partitioning=sl.SAME_KEY)
    return topology
"""
CLUSTER_WORDS = [f"w{(i * 7919) % 97}" for i in range(20_000)]


def cluster_expected() -> tuple[list[tuple[str, int]], dict[str, int]]:
    """What the cluster job's append and upsert tables hold after a failure-free run."""
    totals = Counter(CLUSTER_WORDS)
    appended = sorted((key, n) for key, total in totals.items() for n in range(1, total + 1))
    return appended, dict(totals)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("checkpoints")
    parser.add_argument("--die-after-save", type=int, required=True)
    args = parser.parse_args()
    run(args.dsn, Path(args.checkpoints), store=DieAfterSave(Path(args.checkpoints), args.die_after_save))
