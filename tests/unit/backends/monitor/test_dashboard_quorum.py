"""The dashboard says when the coordination service has no quorum: the cluster source refuses to read through
an ensemble a majority of whose members do not serve (naming each member's mode), and the dashboard keeps its
last views marked with why they are not fresh."""

from __future__ import annotations

from contextlib import aclosing

import anyio
import pytest

from streamlet.backends.cluster.local.zookeeper_server import free_port
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree
from streamlet.backends.monitor.cluster_source import ClusterSource
from streamlet.backends.monitor.server import Dashboard
from streamlet.backends.monitor.views import Reading
from streamlet.errors import NoQuorum
from tests.unit.backends.monitor.test_views_and_metrics import reading


async def test_the_cluster_source_refuses_to_read_without_a_quorum_naming_each_member() -> None:
    """Three members nobody serves on: NoQuorum, each address with its mode; nothing read from the store."""
    ports = [free_port() for _ in range(3)]
    connect = ",".join(f"127.0.0.1:{port}" for port in ports)
    source = ClusterSource(MemoryClusterStore(MemoryTree(), "c"), b"secret", zookeepers=connect)
    with pytest.raises(NoQuorum) as refused:
        await source.read()
    members = ", ".join(f"127.0.0.1:{port} down" for port in ports)
    assert str(refused.value) == (f"the coordination service has no quorum: 0 of 3 ZooKeeper members serve ({members})")


class QuorumLostAfterFirst:
    """A source that reads once, then finds the ensemble without a quorum."""

    def __init__(self) -> None:
        self.reads = 0

    async def read(self) -> Reading:
        self.reads += 1
        if self.reads > 1:
            raise NoQuorum("the coordination service has no quorum: 1 of 3 ZooKeeper members serve (...)")
        return reading(1.0, 10, [0.01])


async def test_a_reading_that_fails_keeps_the_last_views_marked_with_why() -> None:
    """The first reading is shown as it is; the next one fails on the lost quorum: the live view gets the same
    views again, with the reason they are not fresh."""
    dashboard = Dashboard(QuorumLostAfterFirst(), interval=0.01)
    async with anyio.create_task_group() as group:
        group.start_soon(dashboard.run)
        with anyio.fail_after(10):
            async with aclosing(dashboard.updates()) as updates:
                first = await anext(updates)
                marked = await anext(updates)
        group.cancel_scope.cancel()
    assert first["cluster"]["problem"] is None
    assert marked["cluster"]["problem"] == (
        "the coordination service has no quorum: 1 of 3 ZooKeeper members serve (...)"
    )
    assert {**marked["cluster"], "problem": None} == first["cluster"]
    assert marked["jobs"] == first["jobs"]
