"""PostgresSource against a real PostgreSQL: keyset pages in order, a position that resumes exactly after the
last row read, following that never skips a row committed late, and Arrow batches for columnar operators."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

import streamlet as sl
from tests.support import postgres_jobs
from tests.support.exactly_once import RECORDS, Bomb, items
from tests.support.postgres import sql

pytestmark = pytest.mark.integration


class GatedClock:
    """A clock whose ``sleep`` (a poll's wait) says it was reached, then waits until the test lets it go."""

    def __init__(self) -> None:
        self.polled = anyio.Event()
        self.go = anyio.Event()

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.polled.set()
        await self.go.wait()
        self.polled, self.go = anyio.Event(), anyio.Event()

    def call_at(self, when: float, callback: Any) -> Any:
        raise AssertionError("the source reads the clock and sleeps on it; it sets no timers")


def reader(source: sl.PostgresSource, clock: Any = None) -> Any:
    context = sl.SourceContext("rows", 0, 1, clock or sl.ManualClock(), None)  # type: ignore[arg-type]
    return source.open(context)


async def read_all(opened: Any) -> list[Any]:
    rows: list[Any] = []
    while (batch := await opened.read(1000)) is not None:
        rows.extend(batch)
    await opened.aclose()
    return rows


@pytest.fixture
def events(postgres_dsn: str) -> str:
    """A table of 25 events whose times repeat (two per second): paged by (at, id)."""
    sql(postgres_dsn, "CREATE TABLE events (id serial PRIMARY KEY, at timestamptz NOT NULL, who text, amount int)")
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    for n in range(25):
        sql(postgres_dsn, "INSERT INTO events (at, who, amount) VALUES ($1, $2, $3)",
            start + datetime.timedelta(seconds=n // 2), f"u{n % 3}", n)  # fmt: skip
    return postgres_dsn


async def test_rows_come_in_order_of_by_in_pages(events: str) -> None:
    """Pages of 4 rows, ordered by (at, id): every row once, key/value/ts from the named columns."""
    source = sl.PostgresSource(events, "events", by=["at", "id"], key="who", value="amount", ts="at", batch_rows=4)
    rows = await read_all(reader(source))
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp()
    assert rows == [(f"u{n % 3}", n, start + n // 2) for n in range(25)]


async def test_a_position_resumes_exactly_after_the_last_row_read(events: str) -> None:
    """Read 3 pages, take the position (a datetime and an id, msgpack-able), seek a new reader to it: it
    reads exactly the rows after it."""
    source = sl.PostgresSource(events, "SELECT id, at, amount FROM events", by=["at", "id"], value="amount")
    first = reader(source)
    seen = [value for _ in range(3) for _, value, _ in await first.read(4)]
    position = first.position()
    await first.aclose()
    assert seen == list(range(12))
    assert sl.core.model.encoding.unpackb(sl.core.model.encoding.packb(position)) == position
    second = reader(source)
    await second.seek(position)
    assert [value for _, value, _ in await read_all(second)] == list(range(12, 25))


def test_a_restored_job_reads_on_after_its_checkpoint_and_writes_exactly_once(
    postgres_dsn: str, armed_bomb: Path
) -> None:
    """Table in, exactly-once sinks out: a crash after two checkpoints, a rerun that resumes from the
    checkpointed position (it reads fewer rows than the table holds) and exact tables."""
    postgres_jobs.create_tables(postgres_dsn)
    sql(postgres_dsn, "CREATE TABLE words (id bigint PRIMARY KEY, word text NOT NULL)")
    sql(postgres_dsn, "INSERT INTO words SELECT n, 'k' || (n % 40) FROM generate_series(0, $1::int - 1) n", RECORDS)
    assert [(f"k{i % 40}", i) for i in range(RECORDS)] == items()

    def source() -> sl.PostgresSource:
        return sl.PostgresSource(postgres_dsn, "words", by=["id"], key="word", value="id", batch_rows=10)

    with pytest.raises(sl.TaskError):
        postgres_jobs.run(postgres_dsn, armed_bomb, source=source())
    assert not Bomb.armed
    result = postgres_jobs.run(postgres_dsn, armed_bomb, source=source())
    assert 0 < result.statistics.nodes["in"].records_out < RECORDS
    postgres_jobs.assert_exact(postgres_dsn)


@pytest.fixture
async def open_transaction(postgres_dsn: str) -> AsyncIterator[Any]:
    """A table ``queue`` (serial id) and a connection whose open transaction inserted id 1 (not committed)."""
    holder = await asyncpg.connect(postgres_dsn)
    await holder.execute("CREATE TABLE queue (id serial PRIMARY KEY, note text)")
    transaction = holder.transaction()
    await transaction.start()
    await holder.execute("INSERT INTO queue (note) VALUES ('late')")
    try:
        yield transaction
    finally:
        await holder.close()


async def test_following_never_skips_a_row_committed_late(postgres_dsn: str, open_transaction: Any) -> None:
    """id 1 is taken by a transaction still open when id 2 commits: a plain read sees only 2 (and a reader
    keeping its position after it would skip 1 for ever); following reads nothing until the holder commits,
    then 1 and 2, in order."""
    other = await asyncpg.connect(postgres_dsn)
    await other.execute("INSERT INTO queue (note) VALUES ('early')")
    await other.close()
    plain = sl.PostgresSource(postgres_dsn, "queue", by=["id"], value="note")
    assert await read_all(reader(plain)) == [(None, "early", 0.0)]

    clock = GatedClock()
    following = reader(sl.PostgresSource(postgres_dsn, "queue", by=["id"], value="note", follow=True), clock)
    async with anyio.create_task_group() as group:
        got: list[Any] = []

        async def read_once() -> None:
            while not got:  # an empty read first: the reader says it caught up (then it polls)
                got.extend(await following.read(100))

        group.start_soon(read_once)
        await clock.polled.wait()  # the first poll found nothing it may read
        assert following.caught_up()
        assert got == []
        await open_transaction.commit()
        clock.go.set()
    assert got == [(None, "late", 0.0), (None, "early", 0.0)]
    await following.aclose()


def test_columnar_mode_hands_arrow_batches_to_columnar_operators(events: str) -> None:
    """columnar=True: Arrow batches into ``aggregate``, whose per-key sums equal Python's."""
    topology = sl.Topology("columnar")
    source = sl.PostgresSource(
        events, "SELECT id, who, amount FROM events", by=["id"], key="who", value="amount", columnar=True, batch_rows=7
    )
    rows = topology.add_source("rows", source)
    sums = topology.aggregate("sum", "sum", emit="end").set_input(rows)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    result = sl.run(topology)
    expected: dict[str, int] = {}
    for n in range(25):
        expected[f"u{n % 3}"] = expected.get(f"u{n % 3}", 0) + n
    assert {r.key: r.value for r in result.sink("out")} == expected


def test_a_bootstrapping_table_join_enriches_every_click_sent_before_the_table_was_read(postgres_dsn: str) -> None:
    """The new user's service: clicks arrive before a following PostgresSource has read its table. Without
    bootstrap most clicks meet no row; with ``bootstrap=True`` each waits until the source has read the rows
    the table held at start (its snapshot: a short page), then meets its row, while the source goes on
    following."""
    sql(postgres_dsn, "CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL)")
    for n in range(200):
        sql(postgres_dsn, "INSERT INTO users (id, name) VALUES ($1, $2)", n, f"name{n}")
    clicks = [(n % 200, n) for n in range(1000)]
    without = anyio.run(enrich_clicks, postgres_dsn, clicks, False)
    assert sum(1 for _, (_, name) in without if name is not None) < len(clicks)  # some clicks outran the table
    assert sorted(anyio.run(enrich_clicks, postgres_dsn, clicks, True)) == sorted(
        (key, (click, f"name{key}")) for key, click in clicks
    )


async def enrich_clicks(dsn: str, clicks: list[tuple[int, int]], bootstrap: bool) -> list[tuple[Any, Any]]:
    """Send every click at once, then join them (``how="left"``) with the users table as a following source
    reads it; once every click came out, stop."""
    enriched: list[tuple[Any, Any]] = []
    done = anyio.Event()

    def collect(record: sl.Record) -> None:
        enriched.append((record.key, tuple(record.value)))
        if len(enriched) == len(clicks):
            done.set()

    topology = sl.Topology("clicks")
    users = sl.PostgresSource(dsn, "users", by=["id"], key="id", value="name", follow=True, batch_rows=50)
    join = topology.table_join("j", how="left", bootstrap=bootstrap)
    join.set_input(topology.add_source("clicks", sl.QueueSource()), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("users", users), in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CallbackSink(collect)).set_input(join)
    async with sl.start(topology) as job:
        for key, click in clicks:
            await job.send("clicks", key, click, 0.0)
        with anyio.fail_after(60):
            await done.wait()
        await job.stop()
        await job.wait()
    return enriched
