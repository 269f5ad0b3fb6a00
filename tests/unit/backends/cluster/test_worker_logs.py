"""A worker's log lines carry the job and attempt of its part, and a failed task's name and instance; its
report counts the part's dead letters and describes the first few."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from streamlet.backends.cluster.tree import jobs
from streamlet.backends.cluster.tree.reports import dead_letters_of
from streamlet.logs import LogSettings, configure_logging
from tests.support.faults import POISON_EVERY_THIRD
from tests.support.logging_state import restored_logging
from tests.unit.backends.cluster.conftest import MemoryCluster
from tests.unit.backends.cluster.test_worker import running_worker, until_done

FAILING = """
import streamlet as sl

def parse(record):
    raise ValueError(f"poison {record.value}")

def build_topology():
    topology = sl.Topology("failing")
    parsed = topology.map("parse", parse).set_input(topology.add_source("numbers", [7]))
    topology.add_sink("out", sl.CollectSink()).set_input(parsed)
    return topology
"""


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """Logging as ``streamlet --log-level info --log-format json worker`` sets it up, then as before."""
    with restored_logging():
        configure_logging(LogSettings("info", "json"))
        yield capsys


async def test_a_failed_task_is_logged_with_job_attempt_task_and_instance(
    cluster: MemoryCluster, json_logs: pytest.CaptureFixture[str]
) -> None:
    """'task failed' names the job, attempt, worker, task and instance; 'job part starting' the job and attempt."""
    async with running_worker(cluster, "w0"):
        await cluster.submit("fails", source=FAILING)
        await cluster.leader.round()
        await until_done(cluster, "fails", 1, "w0")
    entries = [json.loads(line) for line in json_logs.readouterr().err.splitlines()]
    [starting] = [entry for entry in entries if entry["event"] == "job part starting"]
    [failed] = [entry for entry in entries if entry["event"] == "task failed"]
    assert {key: starting[key] for key in ("job", "attempt", "worker", "level")} == {
        "job": "fails", "attempt": 1, "worker": "w0", "level": "info",
    }  # fmt: skip
    assert {key: failed[key] for key in ("job", "attempt", "worker", "task", "instance", "level", "error")} == {
        "job": "fails", "attempt": 1, "worker": "w0", "task": "parse", "instance": 0, "level": "error",
        "error": "task 'parse' instance 0 failed on record with key None: ValueError: poison 7",
    }  # fmt: skip


async def test_an_instance_line_carries_the_cluster_job_name_and_the_attempt(
    cluster: MemoryCluster, json_logs: pytest.CaptureFixture[str]
) -> None:
    """A dead-lettered record's line inside a worker's part: job 'renamed' (not the topology's name), attempt 1,
    task and instance; the part's end is logged with its dead-letter count."""
    async with running_worker(cluster, "w0"):
        await cluster.submit("renamed", source=POISON_EVERY_THIRD)
        await cluster.leader.round()
        await until_done(cluster, "renamed", 1, "w0")
    entries = [json.loads(line) for line in json_logs.readouterr().err.splitlines()]
    lettered = [entry for entry in entries if entry["event"] == "record dead-lettered"]
    [finished] = [entry for entry in entries if entry["event"] == "job part finished"]
    assert [(e["job"], e["attempt"], e["task"], e["instance"], e["key"]) for e in lettered] == [
        ("renamed", 1, "parse", 0, f"k{n}") for n in (3, 6, 9, 12, 15, 18, 21)
    ]
    assert (finished["job"], finished["attempt"], finished["dead_letters"]) == ("renamed", 1, 7)


async def test_a_report_counts_dead_letters_and_describes_the_first_five(cluster: MemoryCluster) -> None:
    """7 records set aside: the report says 7 and describes 3, 6, 9, 12 and 15; the job's status adds it up."""
    async with running_worker(cluster, "w0"):
        await cluster.submit("skips", source=POISON_EVERY_THIRD)
        await cluster.leader.round()
        report = await until_done(cluster, "skips", 1, "w0")
    first = [f"parse.0 key='k{n}' value={n}: ValueError: poison {n}" for n in (3, 6, 9, 12, 15)]
    assert report["dead_letters"] == {"count": 7, "first": first}
    await cluster.leader.round()
    await cluster.leader.round()
    status = await jobs.job_status(cluster.client, "skips")
    assert (status["state"], dead_letters_of(status["done"]).count, dead_letters_of(status["done"]).first) == (
        "FINISHED", 7, first,
    )  # fmt: skip
