"""A topology split between two jobs ('workers') joined by TCP gives the same result as one job."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import streamlet as sl
from examples.wordcount import build_topology, word_counts
from streamlet.core.runtime.channel import LocalChannel
from streamlet.core.runtime.job import Job
from streamlet.core.runtime.plan import Placement
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient
from tests.conftest import self_loop

SECRET = b"placement"


async def run_split(where: dict[tuple[str, int], str]) -> dict[str, sl.JobResult]:
    """Run build_topology() as two partial jobs, 'a' and 'b', each with its own data server."""
    results: dict[str, sl.JobResult] = {}
    async with DataServer(SECRET) as server_a, DataServer(SECRET) as server_b, TcpClient(SECRET) as client:
        servers = {"a": server_a, "b": server_b}

        def placement(me: str) -> Placement:
            return Placement(
                job="wc",
                local=lambda node, index: where[node, index] == me,
                remote=lambda name, node, index: client.channel(servers[where[node, index]].address, name),
                expose=servers[me].register,
            )

        async def run(me: str) -> None:
            results[me] = await Job(build_topology(), channel_factory=LocalChannel, placement=placement(me)).run()

        async with anyio.create_task_group() as group:
            group.start_soon(run, "a")
            group.start_soon(run, "b")
    return results


@pytest.mark.parametrize(
    "split",
    [
        {"lines": "a", "split": "a", "count": "b", "totals": "b"},
        {"lines": "a", "split": "b", "count": "a", "totals": "b"},
    ],
    ids=["count-remote", "alternating"],
)
async def test_split_job_equals_the_whole(split: dict[str, str]) -> None:
    """Every edge that crosses between the parts goes over TCP; the totals are exactly the in-process ones."""
    topology = build_topology()
    where: dict[tuple[str, int], str] = {}
    for name, node in topology.nodes.items():
        for index in range(node.parallelism):
            where[name, index] = split[name] if name != "count" or index == 0 else ("a" if split[name] == "b" else "b")
    results = await run_split(where)
    sink_part = split["totals"]
    expected = word_counts(await Job(build_topology(), channel_factory=LocalChannel).run())
    assert word_counts(results[sink_part]) == expected
    other = "a" if sink_part == "b" else "b"
    assert results[other].collected() == {}


def test_a_loop_split_without_a_quiescence_is_refused() -> None:
    """No process sees all of a split loop's counters: without a detector to end it, the job is refused."""
    topology = self_loop()
    placement: Any = Placement("j", lambda n, i: True, lambda *a: None, lambda *a: None)  # type: ignore[arg-type,return-value]
    message = (
        r"^topology 'loop': a loop split between processes needs a quiescence detector \(quiescence=\.\.\.\) "
        r"\(back edge from 'step' into 'step'\)$"
    )
    with pytest.raises(sl.TopologyError, match=message):
        Job(topology, channel_factory=LocalChannel, placement=placement)
