"""PostgresSink's error paths against a real server: a staging commit whose answer was lost (it went
through, it did not, or it lands late; with the lookup after it cut off too), an open staging transaction
lost with rows copied before its barrier, and the server crashing and coming back mid-job. In each, both
tables of the exactly-once job (``tests/support/postgres_jobs.py``) end exact: no row twice (``counts_log``
refuses a double by its unique key), none missing, and nothing left in staging. The faults are in
``tests/support/postgres_faults.py``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamlet as sl
import streamlet.connectors.postgres.links as links
from streamlet.testing.postgres_server import PostgresServer
from tests.support import postgres_jobs
from tests.support.exactly_once import RECORDS
from tests.support.postgres import fresh_database, sql
from tests.support.postgres_faults import DID_NOT, LATE, WENT_THROUGH, LoseOneAnswer, Restarter

pytestmark = pytest.mark.integration


@pytest.fixture
def losing_answers(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[LoseOneAnswer]]:
    """The sinks connect through :class:`LoseOneAnswer` (armed by the test); a late commit is awaited."""
    real_connect = links.connect

    async def connect(dsn: str, name: str) -> Any:
        return LoseOneAnswer(await real_connect(dsn, name), name)

    monkeypatch.setattr(links, "connect", connect)
    yield LoseOneAnswer
    LoseOneAnswer.armed, LoseOneAnswer.cut_lookups = False, 0


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    """A fresh database holding the job's two empty tables."""
    postgres_jobs.create_tables(postgres_dsn)
    return postgres_dsn


def run_holding_each_epoch(dsn: str, checkpoints: Path, batch_rows: int) -> sl.JobResult:
    """The exactly-once job with its sinks holding ``batch_rows`` rows before they copy."""
    topology = postgres_jobs.build(dsn, batch_rows=batch_rows)
    return sl.run(topology, checkpoint_dir=checkpoints, checkpoint_interval=0.02, batch_size=10)


@pytest.mark.parametrize(
    ("mode", "cut_lookups"),
    [(WENT_THROUGH, 0), (DID_NOT, 0), (WENT_THROUGH, 1), (DID_NOT, 1), (LATE, 0)],
    ids=[WENT_THROUGH, DID_NOT, f"{WENT_THROUGH}, its lookup cut off", f"{DID_NOT}, its lookup cut off", LATE],
)
def test_a_staging_commit_whose_answer_was_lost_is_looked_up_so_nothing_is_staged_twice_or_lost(
    dsn: str, tmp_path: Path, losing_answers: type[LoseOneAnswer], mode: str, cut_lookups: int
) -> None:
    """The epoch's rows were held in memory (no copy before the barrier): the retry asks the server whether
    the batch went in, once the transaction that staged it has ended (a late commit is waited for); if it
    did, nothing is copied again, if not, the held rows are staged again. A lookup cut off is asked again.
    One run ends exact."""
    losing_answers.arm(dsn, mode, cut_lookups)
    result = run_holding_each_epoch(dsn, tmp_path / "checkpoints", batch_rows=10_000)
    assert (losing_answers.lost, losing_answers.cut_lookups) == (1, 0)
    assert losing_answers.looked_up.is_set()
    if mode == LATE:  # it ran in the job's loop, which has ended: it is done, and it committed
        assert losing_answers.late is not None
        assert losing_answers.late.done()
        assert losing_answers.late.exception() is None
    assert result.statistics.checkpoints >= 2
    postgres_jobs.assert_exact(dsn)


def test_a_lost_answer_of_a_commit_that_went_through_with_rows_copied_before_the_barrier_is_found(
    dsn: str, tmp_path: Path, losing_answers: type[LoseOneAnswer]
) -> None:
    """Rows copied before the barrier (batch_rows=5) are not held any more, but the commit went through: the
    lookup finds the batch and the one run ends exact."""
    losing_answers.arm(dsn, WENT_THROUGH)
    run_holding_each_epoch(dsn, tmp_path / "checkpoints", batch_rows=5)
    assert losing_answers.lost == 1
    postgres_jobs.assert_exact(dsn)


def test_an_open_staging_transaction_lost_with_copied_rows_fails_the_attempt_and_the_restore_replays_them(
    dsn: str, tmp_path: Path, losing_answers: type[LoseOneAnswer]
) -> None:
    """Rows copied before the barrier (batch_rows=5) are not held any more: when the staging commit is lost
    without going through, they are gone with it, so the attempt fails saying so; the rerun restores the last
    checkpoint and replays them. Both tables end exact."""
    losing_answers.arm(dsn, DID_NOT)
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(
        sl.SinkError,
        match=r"^sink 'appended' instance 0 failed staging checkpoint \d+: its open transaction was lost with its "
        r"rows$",
    ):
        run_holding_each_epoch(dsn, checkpoints, batch_rows=5)
    assert losing_answers.lost == 1
    result = run_holding_each_epoch(dsn, checkpoints, batch_rows=5)
    assert result.statistics.nodes["in"].records_out < RECORDS  # it resumed
    postgres_jobs.assert_exact(dsn)


class CrashTheServer(sl.Task):
    """After 150 batches, once, crashes the test's own server and starts it again (in a thread: the job goes
    on meanwhile, its sinks retrying against a server that is not there)."""

    restarter: Restarter | None = None
    crashed = threading.Event()

    def prepare(self, config: dict[str, object]) -> None:
        self.batches = 0

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        self.batches += 1
        restarter = type(self).restarter
        if self.batches == 150 and restarter is not None and not type(self).crashed.is_set():
            type(self).crashed.set()
            await anyio.to_thread.run_sync(restarter.crash_and_restart)
        outputs.emit_batch(inputs.get())


@pytest.fixture
def own_server() -> Iterator[Restarter]:
    """A server of this test's own (it is crashed and started again), stopped by PID at the end."""
    with PostgresServer() as server:
        restarter = Restarter(server)
        try:
            yield restarter
        finally:
            restarter.close()


def test_a_server_that_crashes_and_comes_back_within_the_bound_leaves_the_tables_exact(
    own_server: Restarter, tmp_path: Path
) -> None:
    """The server goes down mid-job (an immediate shutdown: every connection cut, staging transactions
    rolled back) and comes back: the sinks retry within ``reconnect_within``, stage the rows they still hold
    again and move what the checkpoints completed. The job ends in its first run with both tables exact."""
    dsn = fresh_database(own_server.server)
    postgres_jobs.create_tables(dsn)
    CrashTheServer.restarter = own_server
    CrashTheServer.crashed.clear()
    topology = postgres_jobs.build(dsn, batch_rows=10_000, fault=("crash", CrashTheServer))  # rows held
    try:
        sl.run(topology, checkpoint_dir=tmp_path, checkpoint_interval=0.02, batch_size=10)
    finally:
        CrashTheServer.restarter = None
    assert CrashTheServer.crashed.is_set()
    assert "database system was interrupted" in (own_server.server.socket_dir / "server.log").read_text()
    postgres_jobs.assert_exact(dsn)


async def stage_then_crash_then_commit(restarter: Restarter, dsn: str) -> None:
    """One writer: 1000 rows staged at the barrier of epoch 1 (acknowledged), the server crashed at once and
    started again, then the checkpoint's commit."""
    writer = sl.PostgresSink(dsn, "out").open(sl.SinkContext("out", 0, 1, job_id="crash", attempt="run1"))
    await writer.restore(None)
    await writer.write([(f"k{n}", n, float(n)) for n in range(1000)])
    await writer.prepare_commit(1)
    await anyio.to_thread.run_sync(restarter.crash_and_restart)
    await writer.commit(1)
    await writer.close()


def test_a_staged_epoch_the_server_acknowledged_survives_its_crash_even_with_asynchronous_commits(
    own_server: Restarter,
) -> None:
    """The server's default is ``synchronous_commit = off`` (an acknowledged commit can vanish in a crash):
    the sink's own sessions commit synchronously, so the epoch staged just before the crash is still there
    when the checkpoint's commit moves it: every row, once."""
    dsn = fresh_database(own_server.server)
    assert sql(dsn, "SELECT setting FROM pg_settings WHERE name = 'synchronous_commit'") == [("off",)]
    sql(dsn, "CREATE TABLE out (key text, value bigint, ts double precision)")
    anyio.run(stage_then_crash_then_commit, own_server, dsn)
    assert sql(dsn, "SELECT count(*), sum(value) FROM out") == [(1000, sum(range(1000)))]
    assert sql(dsn, "SELECT count(*) FROM streamlet_sink_staging") == [(0,)]
