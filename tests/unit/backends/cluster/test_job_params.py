"""``submit --param NAME=VALUE``: in the signed spec, given (typed by the function's annotations) to every build of
the topology on the cluster, listed by ``jobs``; changing one after signing is refused."""

from __future__ import annotations

import pytest

from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.client.api import describe_listed
from streamlet.backends.cluster.tree import jobs, paths
from streamlet.backends.cluster.tree.signing import sign, verify
from streamlet.errors import SpecError, StreamletError
from tests.unit.backends.cluster.conftest import SECRET, MemoryCluster

WIDE = """
import streamlet as sl

def build_topology(width: int, label: str = "plain"):
    topology = sl.Topology(f"wide-{label}")
    numbers = topology.add_source("numbers", list(range(10)))
    spread = topology.map("spread", lambda r: (r.key, r.value), parallelism=width).set_input(numbers)
    topology.add_sink("out", sl.CollectSink()).set_input(spread)
    return topology
"""


async def test_the_leader_builds_the_topology_with_the_params_and_jobs_lists_them(cluster: MemoryCluster) -> None:
    await cluster.add_worker("w0", capacity=16)
    spec = job_commands.new_spec(cluster.module(WIDE), {}, None, params={"width": "3", "label": "eu"})
    await job_commands.submit(cluster.client, "wide", spec, SECRET)
    await cluster.leader.round()
    instances = sorted((await cluster.assignment("wide"))["instances"])  # type: ignore[arg-type]
    assert [i for i in instances if i.startswith("spread.")] == ["spread.0", "spread.1", "spread.2"]  # int("3")
    status = await jobs.job_status(cluster.client, "wide")
    assert status["params"] == {"width": "3", "label": "eu"}
    assert jobs.public(status)["params"] == {"width": "3", "label": "eu"}
    assert describe_listed(status).splitlines()[2] == " " * 24 + " params: label=eu, width=3"


def test_a_param_changed_after_signing_is_refused(cluster: MemoryCluster) -> None:
    signed = sign(job_commands.new_spec(cluster.module(WIDE), {}, None, params={"width": "3"}), SECRET)
    assert jobs.topology_of(verify("wide", dict(signed), SECRET)).nodes["spread"].parallelism == 3
    with pytest.raises(SpecError, match="its spec is not signed with this cluster's secret"):
        verify("wide", {**signed, "params": {"width": "30"}}, SECRET)


async def test_without_params_a_function_that_needs_one_is_refused_naming_it(cluster: MemoryCluster) -> None:
    """The client builds the topology (to name the job) before writing anything: a missing one is said at once."""
    missing = r":build_topology\(width: int, label: str = 'plain'\) needs a value for 'width'$"
    with pytest.raises(StreamletError, match=missing):
        jobs.topology_of(job_commands.new_spec(cluster.module(WIDE), {}, None))
    assert await cluster.client.get(paths.spec("wide")) is None


async def placed(cluster: MemoryCluster, job: str, spread: bool) -> dict[str, set[str]]:
    """Node -> the workers its instances went to, for ``job`` (WIDE at width 3) submitted with or without spread."""
    spec = job_commands.new_spec(cluster.module(WIDE), {}, None, params={"width": "3"}, spread=spread)
    await job_commands.submit(cluster.client, job, spec, SECRET)
    await cluster.leader.round()
    found: dict[str, set[str]] = {}
    for instance, worker in (await cluster.assignment(job))["instances"].items():  # type: ignore[attr-defined]
        found.setdefault(paths.task_of(instance), set()).add(worker)
    return found


async def test_spread_puts_each_nodes_instances_on_different_workers_from_the_start(cluster: MemoryCluster) -> None:
    """Three workers with room for everything: co-located by default (one worker), spread with --spread."""
    for worker in ("w0", "w1", "w2"):
        await cluster.add_worker(worker, capacity=16)
    assert [len(workers) for workers in (await placed(cluster, "together", spread=False)).values()] == [1, 1, 1]
    apart = await placed(cluster, "apart", spread=True)
    assert (len(apart["spread"]), apart["spread"] <= {"w0", "w1", "w2"}) == (3, True)
    state, reason = await cluster.state("apart")
    assert (state, reason.endswith("(every node's instances spread: --spread)")) == ("SCHEDULED", True)
