"""``python -m benchmarks postgres``: rows/s through ``PostgresSink`` (exactly-once, upsert and append) and
``PostgresSource``, each against a hand-written asyncpg loop doing the same work.

The baselines: the sink's copies the same rows in batches of ``batch_rows`` and commits once per batch
(append: ``COPY`` into the table; upsert: ``COPY`` into a temporary table, then ``INSERT ... SELECT DISTINCT
ON ... ON CONFLICT DO UPDATE``); the source's pages the table by its id (``WHERE id > $1 ORDER BY id LIMIT
n``). streamlet writes each row twice (staging, then the table, in the checkpoint's transaction), so the
sink's target is a ratio of at least 0.5.

The append line also measures what that design costs by hand (``two_write_*``): the same batches, each
copied into a staging table and committed, then moved (``INSERT ... SELECT ... ORDER BY``) and deleted from
staging in a second transaction, with no job around it: the least work any sink that stages before a
checkpoint completes does, so ``two_write_ratio`` is the ceiling this design reaches on the machine.
The benchmark starts a PostgreSQL server of its own (as the tests
do: ``streamlet.testing.postgres_server``, ``fsync=off``), one fresh database per measurement.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio

import streamlet as sl
from benchmarks.common import alternating, median_rate, report
from streamlet.testing.postgres_server import PostgresServer

BATCH_ROWS = 10_000
CHECKPOINT_INTERVAL = 0.1  # seconds: commits (moves) of one epoch overlap the staging of the next
TABLES = {
    "append": "CREATE TABLE IF NOT EXISTS {name} (key text, value bigint, ts double precision)",
    "upsert": "CREATE TABLE IF NOT EXISTS {name} (key text PRIMARY KEY, value bigint, ts double precision)",
}


async def _execute(dsn: str, *statements: str) -> Any:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        found = None
        for statement in statements:
            found = await connection.fetch(statement)
        return found
    finally:
        await connection.close()


def execute(dsn: str, *statements: str) -> Any:
    """Run ``statements`` in order; the last one's rows."""
    return anyio.run(_execute, dsn, *statements)


def new_database(server: PostgresServer, name: str) -> str:
    execute(server.dsn(), f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
    return server.dsn(name)


def records(count: int) -> list[sl.Record]:
    return [sl.Record(f"k{i % 1000}", i, float(i)) for i in range(count)]


def run_sink(dsn: str, items: list[sl.Record], mode: str) -> int:
    """The exactly-once sink, checkpoints every CHECKPOINT_INTERVAL s; rows in the table afterwards."""
    execute(dsn, TABLES[mode].format(name="streamlet_out"), "TRUNCATE streamlet_out")
    topology = sl.Topology(f"bench-{mode}")
    conflict = ["key"] if mode == "upsert" else None
    sink = sl.PostgresSink(dsn, "streamlet_out", conflict=conflict, batch_rows=BATCH_ROWS)
    topology.add_sink("out", sink).set_input(topology.add_source("in", items))
    with tempfile.TemporaryDirectory() as checkpoints:
        sl.run(topology, checkpoint_dir=Path(checkpoints), checkpoint_interval=CHECKPOINT_INTERVAL)
    return int(execute(dsn, "SELECT count(*) FROM streamlet_out")[0][0])


async def _baseline_sink(dsn: str, rows: list[tuple[Any, ...]], mode: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        columns = ["key", "value", "ts"]
        for start in range(0, len(rows), BATCH_ROWS):
            batch = rows[start : start + BATCH_ROWS]
            async with connection.transaction():
                if mode == "append":
                    await connection.copy_records_to_table("baseline_out", records=batch, columns=columns)
                    continue
                await connection.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS incoming (n serial, key text, value bigint, ts float8)"
                )
                await connection.execute("TRUNCATE incoming")
                await connection.copy_records_to_table("incoming", records=batch, columns=columns)
                await connection.execute(
                    "INSERT INTO baseline_out (key, value, ts) SELECT DISTINCT ON (key) key, value, ts FROM incoming "
                    "ORDER BY key, n DESC ON CONFLICT (key) DO UPDATE SET value = excluded.value, ts = excluded.ts"
                )
    finally:
        await connection.close()


async def _two_writes(dsn: str, rows: list[tuple[Any, ...]]) -> None:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        for start in range(0, len(rows), BATCH_ROWS):
            batch = [(start + n, *row) for n, row in enumerate(rows[start : start + BATCH_ROWS])]
            async with connection.transaction():
                await connection.copy_records_to_table("two_staged", records=batch, columns=["n", "key", "value", "ts"])
            async with connection.transaction():
                await connection.execute(
                    "INSERT INTO two_out (key, value, ts) SELECT key, value, ts FROM two_staged ORDER BY n"
                )
                await connection.execute("DELETE FROM two_staged")
    finally:
        await connection.close()


def run_two_writes(dsn: str, items: list[sl.Record]) -> int:
    """The staging design by hand: every batch staged and committed, then moved and deleted."""
    execute(
        dsn, TABLES["append"].format(name="two_out"), "TRUNCATE two_out",
        "CREATE TABLE IF NOT EXISTS two_staged (n bigint, key text, value bigint, ts double precision)",
    )  # fmt: skip
    anyio.run(_two_writes, dsn, [(r.key, r.value, r.ts) for r in items])
    return int(execute(dsn, "SELECT count(*) FROM two_out")[0][0])


def run_baseline_sink(dsn: str, items: list[sl.Record], mode: str) -> int:
    """The hand-written loop: the same rows, copied and committed once per batch of ``BATCH_ROWS``."""
    execute(dsn, TABLES[mode].format(name="baseline_out"), "TRUNCATE baseline_out")
    anyio.run(_baseline_sink, dsn, [(r.key, r.value, r.ts) for r in items], mode)
    return int(execute(dsn, "SELECT count(*) FROM baseline_out")[0][0])


class _Count(sl.ElementWriter):
    def __init__(self, into: list[int]) -> None:
        self.into = into

    def write(self, batch: Any) -> None:
        self.into[0] += len(batch)


class CountSink(sl.Sink):
    """Counts what reaches it (so the source's cost is what is measured)."""

    def __init__(self) -> None:
        self.count = [0]

    def open(self, context: sl.SinkContext) -> sl.ElementWriter:
        return _Count(self.count)


def run_source(dsn: str) -> int:
    topology = sl.Topology("bench-source")
    source = sl.PostgresSource(dsn, "events", by=["id"], key="key", value="value", batch_rows=BATCH_ROWS)
    sink = CountSink()
    topology.add_sink("out", sink).set_input(topology.add_source("in", source))
    sl.run(topology, batch_size=BATCH_ROWS)
    return sink.count[0]


async def _baseline_source(dsn: str) -> int:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    seen, last = 0, -1
    try:
        while True:
            rows = await connection.fetch(
                "SELECT id, key, value FROM events WHERE id > $1 ORDER BY id LIMIT $2", last, BATCH_ROWS
            )
            if not rows:
                return seen
            seen += len([(row["key"], row["value"]) for row in rows])
            last = rows[-1]["id"]
    finally:
        await connection.close()


def measure_sink(server: PostgresServer, items: list[sl.Record], mode: str, repeats: int) -> dict[str, Any]:
    """The exactly-once sink against the hand-written loop, in ``mode`` ("upsert" or "append")."""
    dsn = new_database(server, f"bench_{mode}")
    runs = {"streamlet": lambda: run_sink(dsn, items, mode), "baseline": lambda: run_baseline_sink(dsn, items, mode)}
    if mode == "append":
        runs["two_writes"] = lambda: run_two_writes(dsn, items)
    timings = alternating(repeats, runs)
    check(timings, 1000 if mode == "upsert" else len(items), f"postgres sink ({mode})")
    rates = {name: median_rate(len(items), [s for s, _ in found]) for name, found in timings.items()}
    extra = {}
    if "two_writes" in rates:
        extra = {
            "two_write_records_per_s": round(rates["two_writes"]),
            "two_write_ratio": round(rates["two_writes"] / rates["baseline"], 3),
        }
    return report(
        f"postgres-sink-{mode}", rates["streamlet"], rates["baseline"], records=len(items), repeats=repeats,
        batch_rows=BATCH_ROWS, checkpoint_interval_s=CHECKPOINT_INTERVAL, fsync="off", **extra,
    )  # fmt: skip


def measure_source(server: PostgresServer, count: int, repeats: int) -> dict[str, Any]:
    """The source against the hand-written keyset-paging loop, over a table of ``count`` rows."""
    dsn = new_database(server, "bench_source")
    execute(
        dsn, "CREATE TABLE events (id bigint PRIMARY KEY, key text, value bigint)",
        f"INSERT INTO events SELECT n, 'k' || (n % 1000), n FROM generate_series(0, {count - 1}) n",
    )  # fmt: skip
    runs = {"streamlet": lambda: run_source(dsn), "baseline": lambda: anyio.run(_baseline_source, dsn)}
    timings = alternating(repeats, runs)
    check(timings, count, "postgres source")
    rates = {name: median_rate(count, [s for s, _ in found]) for name, found in timings.items()}
    return report("postgres-source", rates["streamlet"], rates["baseline"], records=count, repeats=repeats)


def main(count: int, repeats: int) -> list[dict[str, Any]]:
    """One line per measurement: the sink in upsert and append mode, then the source."""
    items = records(count)
    with PostgresServer() as server:
        return [
            measure_sink(server, items, "upsert", repeats),
            measure_sink(server, items, "append", repeats),
            measure_source(server, count, repeats),
        ]


def check(timings: dict[str, list[tuple[float, Any]]], expected: int, what: str) -> None:
    for name, found in timings.items():
        for _seconds, rows in found:
            if rows != expected:
                raise AssertionError(f"{what}, {name}: {rows} rows, expected {expected}")
