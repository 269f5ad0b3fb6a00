"""A worker's part of a job, on the in-memory store with real loopback TCP: run, report, stop, refuse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.client.api import collected
from streamlet.backends.cluster.tree import jobs, paths
from streamlet.backends.cluster.tree.registry import WorkerRegistration
from streamlet.backends.cluster.tree.store import MemoryClusterStore
from streamlet.backends.cluster.worker.job_parts import MAX_REPORT_BYTES, WorkerJobs, fitting_report
from streamlet.core.runtime.channel import LocalChannel
from streamlet.core.runtime.job import Job
from streamlet.loading import load_topology
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient
from tests.support.loop_jobs import HALVING
from tests.unit.backends.cluster.conftest import SECRET, MemoryCluster

FOREVER = """
import anyio
import streamlet as sl

class Forever(sl.Task):
    async def execute(self, inputs, outputs):
        await anyio.sleep_forever()

def build_topology():
    topology = sl.Topology("forever")
    source = topology.add_source("numbers", [1])
    forever = topology.add_task("forever", Forever).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(forever)
    return topology
"""


@asynccontextmanager
async def running_worker(
    cluster: MemoryCluster, worker_id: str, secret: bytes = SECRET, capacity: int = 8
) -> AsyncIterator[WorkerJobs]:
    """A registered worker polling for assignments, with its own data server, until the block ends."""
    session = cluster.workers[worker_id] = MemoryClusterStore(cluster.tree)
    async with DataServer(secret) as server, TcpClient(secret) as client:
        info = {"host": server.host, "data_port": server.port, "capacity": capacity, "labels": []}
        registration = WorkerRegistration(session, worker_id, info)
        await registration.register()
        await registration.beat()
        worker = WorkerJobs(session, registration, server, client, secret, cluster.tmp_path / worker_id)
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run)
            yield worker
            group.cancel_scope.cancel()


async def until_done(cluster: MemoryCluster, job: str, attempt: int, worker: str) -> dict[str, object]:
    """Wait (on a watch) for the worker's outcome of ``attempt``."""
    with anyio.fail_after(10):
        data, _ = await cluster.client.wait_changed(f"{paths.done(job, attempt)}/{worker}", None)
    return dict(data)


async def test_a_worker_runs_its_part_and_the_leader_finishes_the_job(cluster: MemoryCluster) -> None:
    """The worker's report carries the sink's records; the next round makes the job FINISHED."""
    async with running_worker(cluster, "w0"):
        await cluster.submit("p")
        await cluster.leader.round()
        await until_done(cluster, "p", 1, "w0")
    await cluster.leader.round()
    assert (await cluster.state("p"))[0] == "RUNNING"  # it started before it finished, even if no round saw it run
    await cluster.leader.round()
    status = await jobs.job_status(cluster.client, "p")
    assert status["state"] == "FINISHED"
    assert sorted(row[1] for row in collected(status)["out"]) == [2 * n for n in range(10)]
    assert await cluster.client.children(paths.started("p", 1)) == ["w0"]


async def test_a_killed_job_stops_on_the_worker_without_a_report(cluster: MemoryCluster) -> None:
    """KILLED is read by the worker, which cancels its part and goes back to STANDBY."""
    async with running_worker(cluster, "w0") as worker:
        await cluster.submit("f", source=FOREVER)
        await cluster.leader.round()
        with anyio.fail_after(10):
            await cluster.client.wait_changed(f"{paths.started('f', 1)}/w0", None)
        await job_commands.kill(cluster.client, "f")
        await cluster.leader.round()
        with anyio.fail_after(10):
            while worker.running:
                found = await cluster.client.get(paths.worker("w0"))
                await cluster.client.wait_changed(paths.worker("w0"), None if found is None else found[1])
        node = await cluster.client.get(paths.worker("w0"))
    assert node is not None
    assert (node[0]["zk_state"], node[0]["local_state"]) == ("STANDBY", "waiting")
    assert await cluster.client.children(paths.done("f", 1)) == []
    assert (await jobs.job_status(cluster.client, "f"))["state"] == "KILLED"


async def test_a_worker_refuses_a_spec_its_secret_does_not_verify(cluster: MemoryCluster) -> None:
    """The worker reports a SpecError instead of running the job, and the job fails with it."""
    async with running_worker(cluster, "w0", secret=b"another cluster"):
        await cluster.submit("p")
        await cluster.leader.round()
        report = await until_done(cluster, "p", 1, "w0")
    assert report == {
        "error": "SpecError: job 'p': its spec is not signed with this cluster's secret; refusing to run it"
    }
    await cluster.leader.round()
    assert (await cluster.state("p"))[0] == "FAILED"


async def test_a_record_json_cannot_hold_fails_the_report_naming_sink_and_key(cluster: MemoryCluster) -> None:
    """A CollectSink record that is not JSON fails that job with a clear error; the worker keeps running."""
    source = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("bytes")
    source = topology.add_source("numbers", [1])
    raw = topology.map("raw", lambda record: (None, b"\\x00")).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(raw)
    return topology
"""
    async with running_worker(cluster, "w0") as worker:
        await cluster.submit("b", source=source)
        await cluster.leader.round()
        report = await until_done(cluster, "b", 1, "w0")
        await cluster.submit("p")
        await cluster.leader.round()
        assert "error" not in await until_done(cluster, "p", 1, "w0")
        assert not worker.running
    assert report == {
        "error": "JobError: sink 'out' collected a record (key None) that cannot be reported as JSON: "
        "Object of type bytes is not JSON serializable"
    }


async def test_a_loop_spread_over_two_workers_ends_by_itself_with_the_in_process_records(
    cluster: MemoryCluster,
) -> None:
    """halve.0 and halve.1 on different workers: their detector ends the loop, each worker reports its part,
    and the job finishes with the in-process records and as many records dropped at the limit."""
    async with running_worker(cluster, "w0", capacity=2), running_worker(cluster, "w1", capacity=2):
        await cluster.submit("halving", source=HALVING)
        await cluster.leader.round()
        instances = (await cluster.assignment("halving"))["instances"]
        reports = [await until_done(cluster, "halving", 1, worker) for worker in ("w0", "w1")]
    await cluster.leader.round()
    await cluster.leader.round()
    status = await jobs.job_status(cluster.client, "halving")
    expected = await Job(load_topology(cluster.module(HALVING)), channel_factory=LocalChannel).run()
    rows = sorted(map(tuple, collected(status)["done"]))
    assert status["state"] == "FINISHED"
    assert rows == sorted((r.key, r.value, r.ts) for r in expected.sink("done"))
    assert instances["halve.0"] != instances["halve.1"]  # type: ignore[index]
    dropped = sum(report["statistics"]["dropped"] for report in reports)  # type: ignore[index]
    assert dropped == expected.statistics.dropped == 953


def test_a_report_too_big_for_a_zookeeper_node_becomes_an_error_naming_the_sinks() -> None:
    """100 000 collected rows are ~2 MB: ZooKeeper would drop the connection at every retry; the report says
    why instead (a small report goes through unchanged)."""
    small = {"sinks": {"totals": [["a", 1, None]]}, "restored_from": None}
    assert fitting_report(small) == small
    big = {"sinks": {"totals": [[f"key-{i}", i, None] for i in range(100_000)]}, "restored_from": None}
    [error] = fitting_report(big).values()
    assert error.startswith("JobError: this worker's report is ")
    assert (
        f"bytes, over the {MAX_REPORT_BYTES} a ZooKeeper node holds (records collected by sinks: 'totals' 100000)"
        in error
    )
