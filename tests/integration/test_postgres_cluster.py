"""PostgresSink on a real 2-worker cluster: the keyed count of ``postgres_jobs.CLUSTER_JOB`` writes every
(key, n) appended and each key's latest n upserted; the first sink instance to commit staged rows hits a
fault inside that commit (the checkpoint is complete, its rows are not in the tables): its worker is SIGKILLed,
or SIGSTOPped past its ZooKeeper session and woken after the job finished (a zombie that then commits).
Either way the tables are exact, and the zombie's commit is refused by the epoch fence and counted. A row its
table refuses fails the job with the SinkError as reason."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from tests.support import postgres_jobs
from tests.support.cluster import running_cluster, stop_submitter, streamlet, wait_for_node, wait_for_state
from tests.support.postgres import refusals, sql

pytestmark = pytest.mark.integration
STREAMLET = [sys.executable, "-m", "streamlet.cli"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """ZooKeeper, a master and two workers of capacity 4; every PID is stopped (and un-stopped) afterwards."""
    with running_cluster(tmp_path, "--workers", "2", "--capacity", "4", "--name", "pg") as state:
        yield state


def submit(cluster: dict[str, Any], dsn: str, fault: str) -> tuple[subprocess.Popen[str], Path]:
    """Write the job file, submit it with checkpoints every 0.3 s in the background; the submitter and MARK."""
    directory = cluster["dir"]
    postgres_jobs.create_tables(dsn)
    mark = directory / "faulted"
    job_file = directory / "pg_job.py"
    constants = f"DSN = {dsn!r}\nMARK = {str(mark)!r}\nFAULT = {fault!r}\n"
    job_file.write_text(constants + postgres_jobs.CLUSTER_JOB, encoding="utf-8")
    command = [*STREAMLET, "submit", str(job_file), "--job", "pg", "--checkpoint-interval", "0.3"]
    process = subprocess.Popen(command, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, mark


def faulted_worker(cluster: dict[str, Any], mark: Path) -> str:
    """The worker whose sink hit the fault (by the PID it wrote in MARK, once its process left it)."""
    pid = int(mark.read_text())
    [worker] = [name for name, known in cluster["pids"].items() if known == pid]
    return str(worker)


def first_exit(pids: list[int], seconds: float) -> int | None:
    """The first of ``pids`` to exit (waiting on their pidfds), ``None`` if none does within ``seconds``."""
    descriptors = {os.pidfd_open(pid): pid for pid in pids}
    try:
        readable, _, _ = select.select(list(descriptors), [], [], seconds)
        return descriptors[readable[0]] if readable else None
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


NOTIFY_REFUSED = """
CREATE FUNCTION notify_refused() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.refused > OLD.refused THEN PERFORM pg_notify('refused', NEW.sink); END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refused AFTER UPDATE ON streamlet_sink_epochs FOR EACH ROW EXECUTE FUNCTION notify_refused();
"""


async def wake_and_wait_for_refusal(dsn: str, zombie: int) -> None:
    """SIGCONT the zombie and wait (LISTEN, a trigger's NOTIFY) until a fence refuses a commit."""
    listener = await asyncpg.connect(dsn)
    refused = anyio.Event()
    try:
        await listener.execute(NOTIFY_REFUSED)
        await listener.add_listener("refused", lambda *_: refused.set())
        os.kill(zombie, signal.SIGCONT)
        with anyio.fail_after(30):
            await refused.wait()
    finally:
        await listener.close()


def assert_exact(dsn: str) -> None:
    appended, latest = postgres_jobs.cluster_expected()
    assert postgres_jobs.appended_rows(dsn) == appended
    assert postgres_jobs.latest_rows(dsn) == latest


def test_a_worker_killed_inside_its_sink_commit_leaves_the_tables_exact(
    cluster: dict[str, Any], postgres_dsn: str
) -> None:
    """SIGKILL inside the first commit of staged rows: attempt 2 restores the checkpoint and moves what attempt
    1 staged for it (once), replays the rest: append and upsert tables exact, nothing left staged."""
    process, mark = submit(cluster, postgres_dsn, "kill")
    try:
        wait_for_state(cluster["dir"], "pg", {"RUNNING"})
        workers = [pid for name, pid in cluster["pids"].items() if name.startswith("worker")]
        assert first_exit(workers, seconds=60) == int(mark.read_text())  # it died in its commit
        out, err = process.communicate(timeout=120)
    finally:
        stop_submitter(process)
    assert process.returncode == 0, err
    assert out.splitlines()[0].startswith("job 'pg' FINISHED"), out
    assert_exact(postgres_dsn)
    assert sql(postgres_dsn, "SELECT count(*) FROM streamlet_sink_staging") == [(0,)]


def test_a_zombie_sink_woken_after_the_job_moved_on_commits_nothing_and_is_counted(
    cluster: dict[str, Any], postgres_dsn: str
) -> None:
    """SIGSTOP inside the first commit of staged rows, past the worker's session: attempt 2 finishes the job
    without it; woken, the zombie goes on with its commit, which the fence refuses (counted in
    streamlet_sink_epochs.refused): the tables stay exact."""
    process, mark = submit(cluster, postgres_dsn, "stop")
    zombie = None
    try:
        wait_for_state(cluster["dir"], "pg", {"RUNNING"})
        moved = wait_for_state(cluster["dir"], "pg", {"RECOVERING", "STALLED"}, seconds=60)
        zombie = int(mark.read_text())
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        assert out.splitlines()[0].startswith("job 'pg' FINISHED"), out
        assert moved["attempt"] == 2
        assert_exact(postgres_dsn)
        assert refusals(postgres_dsn) == 0
        anyio.run(wake_and_wait_for_refusal, postgres_dsn, zombie)
        # it registers again and drops its attempt 1 (the job has ended): then it can stop at once
        worker = faulted_worker(cluster, mark)
        wait_for_node(cluster["dir"], f"/workers/{worker}", lambda data: data["local_state"] == "waiting")
    finally:
        if zombie is not None:
            os.kill(zombie, signal.SIGCONT)
        stop_submitter(process)
    # one refusal per sink instance of the zombie that had staged rows when it stopped (placement decides how
    # many of the four are there): each counted, none moved a row
    assert 1 <= refusals(postgres_dsn) <= 4
    assert_exact(postgres_dsn)


REFUSED = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("refused")
    source = topology.add_source("in", [("a", 1), ("b", "two"), ("c", 3)])
    sink = sl.PostgresSink(DSN, "numbers", row=lambda r: {"name": r.key, "n": r.value}, on_error="fail")
    topology.add_sink("out", sink).set_input(source)
    return topology
"""


def test_a_row_its_table_refuses_fails_the_checkpointed_job_with_the_sink_error_as_reason(
    cluster: dict[str, Any], postgres_dsn: str
) -> None:
    """A str into an integer column, on a checkpointed cluster job: FAILED, and the reason (the state node and
    submit's output) is the SinkError naming sink, key, table and column, as in process; not the exception
    group the worker's task group raised it in."""
    directory = cluster["dir"]
    sql(postgres_dsn, "CREATE TABLE numbers (name text, n integer)")
    job_file = directory / "refused_job.py"
    job_file.write_text(f"DSN = {postgres_dsn!r}\n" + REFUSED, encoding="utf-8")
    run = streamlet("submit", str(job_file), "--job", "refused", "--checkpoint-interval", "0.3", cwd=directory)
    failed = wait_for_state(directory, "refused", {"FAILED"}, seconds=5)  # submit returned: it has ended
    assert run.returncode == 1, run.stderr
    reason = (
        r"SinkError: sink 'out' instance 0 failed writing the record with key 'b' to table numbers: column 'n' "
        r"refused its value: TypeError: 'str' object cannot be interpreted as an integer \(on (worker-[01])\)"
    )
    found = re.fullmatch(reason, failed["reason"])
    assert found is not None, failed
    assert "ExceptionGroup" not in failed["reason"]
    assert "TaskGroup" not in failed["reason"]
    assert failed["attempt"] == 1  # a refused value is no fault of a worker: the job is not tried again
    assert run.stdout.splitlines()[:2] == [
        f"job 'refused' FAILED on {found[1]}: {failed['reason']}",
        f"  error: {failed['reason']}",
    ]
    assert sql(postgres_dsn, "SELECT count(*) FROM numbers") == [(0,)]  # its one epoch never committed
