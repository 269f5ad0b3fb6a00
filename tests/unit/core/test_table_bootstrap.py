"""``table_join(bootstrap=True)``: left records wait until every source feeding the table side has caught up
(a bounded source ended, or its reader says ``caught_up``), then meet the table as it is; the wait is in the
checkpoints, bounded (backpressure), and passes through tasks, ``map_async`` and parallel instances."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from tests.support.held_calls import until_true

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

USERS = {f"u{i}": f"name{i}" for i in range(10)}
CLICKS = [(f"u{i % 10}", i) for i in range(50)]


class Table(sl.Source):
    """``rows`` at once, then caught up (the reader says so); then rows put on ``later`` until ``None``."""

    def __init__(self, rows: dict[str, str], later: asyncio.Queue[Any]) -> None:
        self.rows = list(rows.items())
        self.later = later

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return TableReader(self.rows, self.later)


class TableReader(sl.SourceReader):
    def __init__(self, rows: list[tuple[str, str]], later: asyncio.Queue[Any]) -> None:
        self.rows, self.later, self.sent = rows, later, 0

    async def read(self, max_records: int) -> list[sl.Record] | None:
        if self.sent < len(self.rows):
            batch = self.rows[self.sent : self.sent + max_records]
            self.sent += len(batch)
            return [sl.Record(key, value, 0.0) for key, value in batch]
        item = await self.later.get()
        return None if item is None else [sl.Record(item[0], item[1], 0.0)]

    def caught_up(self) -> bool:
        return self.sent >= len(self.rows)

    def position(self) -> int:  # the rows given so far (the rows from ``later`` are not replayed)
        return self.sent

    async def seek(self, position: int) -> None:
        self.sent = position


def enriched(
    right: sl.Source, *, bootstrap: bool = True, gate: asyncio.Event | None = None, **join: Any
) -> sl.Topology:
    """Clicks (a queue: 'clicks') joined with user rows from ``right``; with ``gate``, each row waits in a
    ``map_async`` until the gate opens (a slow table side), passed through a plain map first."""
    topology = sl.Topology("enriched")
    clicks = topology.add_source("clicks", sl.QueueSource())
    users = topology.add_source("users", right)
    rows: Any = topology.map("rows", lambda r: (r.key, r.value)).set_input(users)
    if gate is not None:

        async def slow(record: sl.Record) -> tuple[str, str]:
            await gate.wait()
            return (record.key, str(record.value))

        rows = topology.map_async("slow", slow, concurrency=4).set_input(rows)
    fn = lambda key, click, name: [click, name]  # noqa: E731
    join = topology.table_join("j", fn=fn, bootstrap=bootstrap, **join)
    join.set_input(clicks, in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(rows, in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    return topology


def joined(records: list[sl.Record]) -> list[tuple[str, Any]]:
    return sorted((r.key, tuple(r.value)) for r in records)


EXPECTED = sorted((key, (click, USERS[key])) for key, click in CLICKS)


async def send_clicks(job: sl.Job, clicks: list[tuple[str, int]] = CLICKS) -> None:
    for key, click in clicks:
        await job.send("clicks", key, click, 0.0)


@pytest.mark.parametrize("parallelism", [1, 3])
async def test_clicks_sent_before_the_table_loads_wait_for_it_and_each_meets_its_row(parallelism: int) -> None:
    """The rows are held in a map_async until every click is in: without bootstrap no click meets a row; with
    it each waits (counted as held), then meets its row once the table side caught up, before it ended."""
    assert await clicks_then_rows(parallelism, bootstrap=False) == [("u0", (99, "renamed"))]
    assert await clicks_then_rows(parallelism, bootstrap=True) == sorted([*EXPECTED, ("u0", (99, "renamed"))])


async def clicks_then_rows(parallelism: int, bootstrap: bool) -> list[tuple[str, Any]]:
    """Every click, then the table's rows; once all are in, a row changes and one more click comes."""
    later: asyncio.Queue[Any] = asyncio.Queue()
    gate = asyncio.Event()
    waiting = len(CLICKS) if bootstrap else 0
    topology = enriched(Table(USERS, later), bootstrap=bootstrap, gate=gate, parallelism=parallelism)
    async with sl.start(topology) as job:
        await send_clicks(job)
        await until_true(lambda: job.statistics().nodes["j"].records_in == len(CLICKS))
        assert job.statistics().nodes["j"].held == waiting
        gate.set()
        # every row in (settle() waits for sources other than queues to end: the table's never does)
        await until_true(lambda: job.statistics().nodes["j"].records_in == len(CLICKS) + len(USERS))
        await until_true(lambda: job.statistics().nodes["out"].records_in == waiting)
        assert joined(job._result().sink("out")) == (EXPECTED if bootstrap else [])
        assert job.statistics().nodes["j"].held == 0
        later.put_nowait(("u0", "renamed"))  # after catching up, the table changes as it always did
        await until_true(lambda: job.statistics().nodes["j"].records_in == len(CLICKS) + len(USERS) + 1)
        await job.send("clicks", "u0", 99, 0.0)
        await job.close_source("clicks")
        later.put_nowait(None)
        result = await job.wait()
    return joined(result.sink("out"))


async def test_a_bounded_table_side_counts_as_caught_up_when_it_ends() -> None:
    """A list source says nothing: its end is what lets the waiting clicks through (a left join: no row is
    ``None``, and a click whose key the table lacks is not lost)."""
    clicks = [*CLICKS, ("nobody", 7)]
    async with sl.start(enriched(sl.IterableSource(list(USERS.items())), how="left")) as job:
        await send_clicks(job, clicks)
        await job.close_source("clicks")
        result = await job.wait()
    assert joined(result.sink("out")) == sorted([*EXPECTED, ("nobody", (7, None))])


async def test_past_the_buffer_the_left_input_is_held_back_and_nothing_is_lost() -> None:
    """bootstrap_buffer=8: at most 8 plus one batch wait in the join; the rest stays upstream until the table
    caught up, then every click meets its row."""
    gate = asyncio.Event()
    later: asyncio.Queue[Any] = asyncio.Queue()
    many = [(f"u{i % 10}", i) for i in range(400)]
    topology = enriched(Table(USERS, later), gate=gate, bootstrap_buffer=8)
    async with sl.start(topology, batch_size=4) as job:
        sending = asyncio.create_task(send_clicks(job, many))
        await until_true(lambda: job.statistics().nodes["j"].held >= 8)
        for _ in range(50):  # the join takes no more clicks while the gate is shut
            await asyncio.sleep(0)
        assert 8 <= job.statistics().nodes["j"].held <= 8 + 4
        assert job.statistics().nodes["j"].records_in < len(many)
        gate.set()
        await sending
        await job.close_source("clicks")
        later.put_nowait(None)
        result = await job.wait()
    assert joined(result.sink("out")) == sorted((key, (click, USERS[key])) for key, click in many)
    assert 8 <= result.statistics.nodes["j"].held_peak <= 8 + 4


class Crash(Exception):
    """Stops a job the hard way."""


async def thirty_clicks_a_checkpoint_then_crash(later: asyncio.Queue[Any], checkpoints: Path) -> None:
    async with sl.start(enriched(Table(USERS, later), gate=asyncio.Event()), checkpoint_dir=checkpoints) as job:
        await send_clicks(job, CLICKS[:30])
        await until_true(lambda: job.statistics().nodes["j"].held == 30)
        await job.checkpoint()
        raise Crash


async def test_clicks_waiting_at_a_checkpoint_come_back_with_it_and_each_is_joined_once(tmp_path: Path) -> None:
    """A checkpoint while clicks wait, a crash; the restored job waits again (its table side catches up
    again, the rows restored meanwhile) and joins every click exactly once."""
    later: asyncio.Queue[Any] = asyncio.Queue()
    with pytest.raises(Crash):
        await thirty_clicks_a_checkpoint_then_crash(later, tmp_path)
    gate = asyncio.Event()
    async with sl.start(enriched(Table(USERS, later), gate=gate), checkpoint_dir=tmp_path) as job:
        await until_true(lambda: job.statistics().nodes["j"].held == 30)  # restored, waiting again
        await send_clicks(job, CLICKS[30:])
        gate.set()
        await job.close_source("clicks")
        later.put_nowait(None)
        result = await job.wait()
    assert joined(result.sink("out")) == EXPECTED


def test_bootstrap_refuses_a_state_ttl_and_a_bad_buffer() -> None:
    topology = sl.Topology("t")
    with pytest.raises(sl.TopologyError, match=r"task 'j': state_ttl is refused with bootstrap=True"):
        topology.table_join("j", bootstrap=True, state_ttl=5.0)
    with pytest.raises(sl.TopologyError, match=r"task 'j': bootstrap_buffer must be a whole number"):
        topology.table_join("j", bootstrap=True, bootstrap_buffer=0)
    with pytest.raises(sl.TopologyError, match=r"task 'j': bootstrap must be True or False, got 'yes'"):
        topology.table_join("j", bootstrap="yes")


def bounded(rows: list[tuple[str, str | None]], how: str, parallelism: int = 2) -> sl.Topology:
    """Clicks (a queue) joined with a bounded table side (its end is its catching up), ``how`` as given."""
    topology = sl.Topology("bounded")
    clicks = topology.add_source("clicks", sl.QueueSource())
    users = topology.add_source("users", [sl.Record(key, value, 0.0) for key, value in rows])
    join = topology.table_join("j", how=how, fn=lambda key, click, name: [click, name], bootstrap=True,
                               parallelism=parallelism)  # fmt: skip
    join.set_input(clicks, in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(users, in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    return topology


# u1's and u4's rows deleted before the table caught up (u1 may have a click waiting by then, u4 never has)
ROWS = [("u1", "Ada"), ("u1", None), ("u2", "Grace"), ("u3", "Linus"), ("u4", "Old"), ("u4", None)]


@pytest.mark.parametrize(("how", "expected"), [
    ("left", [("nobody", (3, None)), ("u1", (1, None)), ("u2", (2, "Grace"))]),
    ("inner", [("u2", (2, "Grace"))]),
])  # fmt: skip
async def test_waiting_clicks_meet_the_table_as_it_is_once_loaded_tombstones_included(
    how: str, expected: list[tuple[str, Any]]
) -> None:
    """A row deleted before the table caught up is no row; a key the table lacks meets none (an inner join
    drops the click); after the release a click for a key the table lacks is dropped too."""
    async with sl.start(bounded(ROWS, how)) as job:
        for key, click in [("u1", 1), ("u2", 2), ("nobody", 3)]:
            await job.send("clicks", key, click, 0.0)
        await until_true(lambda: job.statistics().nodes["out"].records_in == len(expected))
        await job.send("clicks", "stranger", 4, 0.0)  # after the release: no entry at all for its key
        await job.send("clicks", "u4", 5, 0.0)  # its row was deleted: none
        await job.close_source("clicks")
        result = await job.wait()
    after = [("stranger", (4, None)), ("u4", (5, None))] if how == "left" else []
    assert joined(result.sink("out")) == sorted([*expected, *after])


async def test_a_rescale_after_the_release_joins_no_click_twice() -> None:
    """Released entries keep nothing waiting: moving their keys (2 -> 3 instances, then 1) joins each click once."""
    async with sl.start(bounded(ROWS, "left")) as job:
        for n in range(30):
            await job.send("clicks", f"u{n % 4}", n, 0.0)
        await until_true(lambda: job.statistics().nodes["out"].records_in == 30)
        await job.rescale("j", 3)
        await job.send("clicks", "u2", 30, 0.0)
        await job.rescale("j", 1)
        await job.close_source("clicks")
        result = await job.wait()
    names = {"u0": None, "u1": None, "u2": "Grace", "u3": "Linus"}  # u4 gets no click here
    assert joined(result.sink("out")) == sorted(
        [(f"u{n % 4}", (n, names[f"u{n % 4}"])) for n in range(30)] + [("u2", (30, "Grace"))]
    )
