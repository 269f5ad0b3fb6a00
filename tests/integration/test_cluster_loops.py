"""A loop on a real cluster (ZooKeeper, one master, two workers of capacity 2), through the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamlet as sl
from streamlet.backends.cluster.tree import paths
from streamlet.loading import load_topology
from tests.support.cluster import cluster_store, running_cluster, streamlet
from tests.support.loop_jobs import HALVING

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cluster for the module, two instances per worker at most; every PID it started is stopped at the end."""
    directory = Path(tmp_path_factory.mktemp("cluster"))
    with running_cluster(directory, "--workers", "2", "--capacity", "2", "--name", "loops"):
        yield directory


@pytest.fixture
def halving(tmp_path: Path) -> Path:
    """The halving loop's module, where the workers can load it."""
    path = tmp_path / "halving.py"
    path.write_text(HALVING, encoding="utf-8")
    return path


def job_nodes(cluster: Path, job: str) -> dict[str, Any]:
    """The job's assignment and its workers' reports of attempt 1, read from ZooKeeper."""

    async def read() -> dict[str, Any]:
        async with cluster_store(cluster) as zk:
            assignment = await zk.get(paths.assignment(job))
            assert assignment is not None
            done = {}
            for worker in await zk.children(paths.done(job, 1)):
                found = await zk.get(f"{paths.done(job, 1)}/{worker}")
                assert found is not None
                done[worker] = found[0]
            return {"assignment": assignment[0], "done": done}

    return anyio.run(read)


def test_a_halving_loop_on_two_workers_gives_the_in_process_output(cluster: Path, halving: Path) -> None:
    """halve.0 and halve.1 on different workers (the loop crosses TCP both ways); the job ends by itself, FINISHED,
    with exactly the in-process records, and as many records dropped at the iteration limit."""
    results = cluster / "halving.json"
    run = streamlet("submit", str(halving), "--job", "halving", "--results", str(results), cwd=cluster)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "job 'halving' FINISHED on worker-0, worker-1: every worker finished (2)",
        "  done: 2047 records",
    ]
    expected = sl.run(load_topology(f"{halving}:build_topology"))
    rows = json.loads(results.read_text())["done"]
    assert sorted(map(tuple, rows)) == sorted((r.key, r.value, r.ts) for r in expected.sink("done"))
    nodes = job_nodes(cluster, "halving")
    instances = nodes["assignment"]["instances"]
    assert instances["halve.0"] != instances["halve.1"]
    dropped = sum(report["statistics"]["dropped"] for report in nodes["done"].values())
    assert dropped == expected.statistics.dropped == 953


def test_a_loop_with_checkpoints_is_refused_at_submit(cluster: Path, halving: Path) -> None:
    """Barriers cannot align around a back edge: submit says so, naming the loop's back edge, and nothing runs."""
    run = streamlet("submit", str(halving), "--job", "halving-ck", "--checkpoint-interval", "1", cwd=cluster)
    assert run.returncode == 1
    assert run.stderr.strip() == (
        "error: TopologyError: topology 'halving': checkpoints are not supported with cycles yet "
        "(back edge from 'halve' into 'halve')"
    )
    listed = json.loads(streamlet("jobs", "--json", cwd=cluster).stdout)
    assert "halving-ck" not in [job["name"] for job in listed]
