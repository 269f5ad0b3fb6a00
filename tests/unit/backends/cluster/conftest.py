"""A cluster in memory: one shared tree, sessions for the leader, workers and clients, and job modules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.leader.leader import Leader
from streamlet.backends.cluster.tree import jobs, paths
from streamlet.backends.cluster.tree.registry import WorkerRegistration
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree

SECRET = b"unit-test-secret"

PIPELINE = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("pipeline")
    source = topology.add_source("numbers", list(range(10)))
    doubled = topology.map("double", lambda record: (None, record.value * 2), parallelism=2).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(doubled)
    return topology
"""


class MemoryCluster:
    """A leader, workers and a client, each on its own session of one tree."""

    def __init__(self, tmp_path: Path) -> None:
        self.tree = MemoryTree()
        self.client = MemoryClusterStore(self.tree)
        self.leader = Leader(MemoryClusterStore(self.tree), epoch=1, secret=SECRET)
        self.workers: dict[str, MemoryClusterStore] = {}
        self.tmp_path = tmp_path

    async def add_worker(self, worker_id: str, capacity: int = 8, labels: list[str] | None = None) -> None:
        """Register a worker with a fresh heartbeat."""
        session = self.workers[worker_id] = MemoryClusterStore(self.tree)
        info = {"host": "127.0.0.1", "data_port": 1, "capacity": capacity, "labels": labels or []}
        registration = WorkerRegistration(session, worker_id, info)
        await registration.register()
        await registration.beat()

    def module(self, source: str = PIPELINE, name: str = "job_module.py") -> str:
        """Write a job module and return its target."""
        path = self.tmp_path / name
        path.write_text(source, encoding="utf-8")
        return f"{path}:build_topology"

    async def submit(self, job: str, source: str = PIPELINE, secret: bytes = SECRET) -> None:
        """Submit ``source``'s topology as ``job``."""
        await job_commands.submit(self.client, job, job_commands.new_spec(self.module(source), {}, None), secret)

    async def state(self, job: str) -> tuple[str, str]:
        """The job's (state, reason)."""
        status = await jobs.job_status(self.client, job)
        return status["state"], status["reason"]

    async def assignment(self, job: str) -> dict[str, object]:
        """The job's current assignment."""
        found = await self.client.get(paths.assignment(job))
        assert found is not None
        return dict(found[0])

    async def report(self, job: str, attempt: int, worker: str, kind: str, payload: dict[str, object]) -> None:
        """Write what a worker would: started or done for ``attempt``."""
        directory = paths.started(job, attempt) if kind == "started" else paths.done(job, attempt)
        await self.workers[worker].create(f"{directory}/{worker}", payload)


@pytest.fixture
def cluster(tmp_path: Path) -> MemoryCluster:
    """An empty in-memory cluster."""
    return MemoryCluster(tmp_path)


Factory = Callable[[], MemoryCluster]
