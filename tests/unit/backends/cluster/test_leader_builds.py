"""The leader never runs job code on its event loop: topologies are built elsewhere, and a slow one holds up
no other job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.leader.leader import Leader
from streamlet.backends.cluster.tree import jobs, paths
from streamlet.backends.cluster.tree.lifecycle import submitted
from streamlet.backends.cluster.tree.outline import Outlines
from streamlet.backends.cluster.tree.signing import sign
from streamlet.backends.cluster.tree.store import Create, MemoryClusterStore
from tests.unit.backends.cluster.conftest import PIPELINE, SECRET, MemoryCluster

SLOW = PIPELINE.replace("def build_topology():", "def build_topology():\n    import time\n    time.sleep(5)")
LOOPING = "def build_topology():\n    while True:\n        pass\n"


async def wait_for_state(cluster: MemoryCluster, job: str, states: set[str]) -> dict[str, object]:
    """The job's state node once it holds one of ``states`` (a watch on it)."""
    version: int | None = -2
    while True:
        data, version = await cluster.client.wait_changed(paths.state(job), version)
        if data is not None and data["state"] in states:
            return dict(data)


async def submit(cluster: MemoryCluster, job: str, source: str) -> None:
    """Record a signed job as ``submit`` does, without loading it here first (a client would run the slow
    build_topology itself): the leader is the one to build it."""
    target = cluster.module(source, name=f"{job}.py")  # each job its own file: the signed bytes are built
    await cluster.client.ensure(paths.JOBS)
    spec = sign(job_commands.new_spec(target, {}, None), SECRET)
    steps = [
        Create(paths.job(job), {"uid": spec["uid"]}),
        Create(paths.spec(job), spec),
        Create(paths.state(job), submitted()),
    ]
    assert await cluster.client.commit(steps)


@asynccontextmanager
async def leading(cluster: MemoryCluster, outlines: Outlines | None = None) -> AsyncIterator[None]:
    """A leader running its rounds (and its builds) on the cluster, with one registered worker."""
    await cluster.add_worker("w0")
    leader = Leader(MemoryClusterStore(cluster.tree), epoch=1, secret=SECRET, outlines=outlines)
    async with anyio.create_task_group() as group:
        group.start_soon(leader.run)
        with anyio.fail_after(60):
            yield
        group.cancel_scope.cancel()


async def test_a_slow_build_topology_does_not_hold_up_another_jobs_rounds(cluster: MemoryCluster) -> None:
    """Job 'a_slow' (looked at first each round) sleeps 5 s in build_topology; 'b_quick' is scheduled while
    'a_slow' still waits for its build, and 'a_slow' is placed once its build is in."""
    async with leading(cluster):
        await submit(cluster, "a_slow", SLOW)
        await submit(cluster, "b_quick", PIPELINE)
        quick = await wait_for_state(cluster, "b_quick", {"SCHEDULED"})
        slow_then = (await jobs.job_status(cluster.client, "a_slow"))["state"]
        # decided once its build is in: scheduled, or stalled should w0's one heartbeat be stale by then
        slow = await wait_for_state(cluster, "a_slow", {"SCHEDULED", "STALLED", "FAILED"})
    assert quick["state"] == "SCHEDULED"
    assert slow_then == "SUBMITTED"  # its build was still under way: the leader went on without it
    assert slow["state"] in ("SCHEDULED", "STALLED")  # placed from its outline, not failed


async def test_a_build_past_the_limit_fails_its_job_and_only_it(cluster: MemoryCluster) -> None:
    """A build_topology that never returns is killed at the limit: its job FAILED with that reason."""
    async with leading(cluster, Outlines(build_seconds=8.0)):
        await submit(cluster, "a_forever", LOOPING)
        await submit(cluster, "b_quick", PIPELINE)
        quick = await wait_for_state(cluster, "b_quick", {"SCHEDULED"})
        failed = await wait_for_state(cluster, "a_forever", {"FAILED"})
    assert quick["state"] == "SCHEDULED"
    assert failed["reason"] == "cannot load the job: building its topology took longer than 8 s (killed)"
