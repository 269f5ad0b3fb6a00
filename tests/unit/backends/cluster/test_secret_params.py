"""``submit --secret-param``: a credential sealed with the cluster secret in the spec, opened where the topology is
built (the leader's build, a worker), never in the tree in clear; refused without the secret, or moved."""

from __future__ import annotations

import json

import pytest

from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.client.api import describe_listed
from streamlet.backends.cluster.tree import jobs
from streamlet.backends.cluster.tree.sealed import opened, seal
from streamlet.errors import SpecError
from tests.unit.backends.cluster.conftest import SECRET, MemoryCluster

DSN = "postgresql://app:S3cret-9f1b@db:5432/shop"

USES_A_DSN = """
import streamlet as sl

def build_topology(dsn: str, width: int):
    if not dsn.startswith("postgresql://app:"):
        raise ValueError("not the DSN")  # the build saw the value in clear, or fails
    topology = sl.Topology("enrich")
    numbers = topology.add_source("numbers", list(range(10)))
    spread = topology.map("spread", lambda r: (r.key, r.value), parallelism=width).set_input(numbers)
    topology.add_sink("out", sl.CollectSink()).set_input(spread)
    return topology
"""


def sealed_spec(cluster: MemoryCluster) -> dict[str, object]:
    spec = dict(job_commands.new_spec(cluster.module(USES_A_DSN), {}, None, params={"width": "2"}))
    spec["sealed"] = seal({"dsn": DSN}, SECRET, str(spec["uid"]))
    return spec


async def test_the_leader_builds_with_the_secret_opened_and_the_tree_never_holds_it(cluster: MemoryCluster) -> None:
    await cluster.add_worker("w0", capacity=16)
    await job_commands.submit(cluster.client, "enrich", sealed_spec(cluster), SECRET)  # type: ignore[arg-type]
    await cluster.leader.round()
    assert sorted(i for i in (await cluster.assignment("enrich"))["instances"] if i.startswith("spread."))  == [  # type: ignore[union-attr]
        "spread.0", "spread.1",
    ]  # fmt: skip
    everything = json.dumps({path: repr(node) for path, node in cluster.tree.nodes.items()})
    assert "S3cret-9f1b" not in everything
    assert "dsn" in everything  # the name is there (sealed value beside it)
    status = await jobs.job_status(cluster.client, "enrich")
    assert status["secret_params"] == ["dsn"]
    assert " secret params: dsn=(sealed)" in describe_listed(status)
    assert "S3cret" not in describe_listed(status) + json.dumps(jobs.public(status))


def test_without_the_secret_or_with_another_or_moved_a_sealed_param_does_not_open(cluster: MemoryCluster) -> None:
    spec = sealed_spec(cluster)
    assert opened(spec, SECRET) == {"dsn": DSN}
    with pytest.raises(SpecError, match=r"^the job's secret parameters \(dsn\) open with the cluster secret only$"):
        jobs.topology_of(spec)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^secret parameter 'dsn' does not open: sealed with another cluster secret"):
        opened(spec, b"another secret")
    with pytest.raises(SpecError, match=r"^secret parameter 'dsn' does not open"):
        opened({**spec, "uid": "another submission"}, SECRET)
    with pytest.raises(SpecError, match=r"^secret parameter 'password' does not open"):
        opened({**spec, "sealed": {"password": spec["sealed"]["dsn"]}}, SECRET)  # type: ignore[index]
    assert jobs.topology_of(spec, SECRET).nodes["spread"].parallelism == 2  # type: ignore[arg-type]
