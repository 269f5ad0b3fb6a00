"""Only holders of the cluster secret change the cluster: digest ACLs on every node (real ZooKeeper)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from streamlet.backends.cluster.zk import ZkStore
from streamlet.backends.cluster.zookeeper import ZooKeeperServer
from streamlet.errors import CoordinationError, NotAuthorized
from tests.integration.conftest import TEST_SECRET

pytestmark = pytest.mark.integration


@pytest.fixture
def anonymous(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain kazoo client that knows no secret."""
    client = KazooClient(hosts=zookeeper.address)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def walk(client: KazooClient, path: str) -> list[str]:
    """``path`` and every node below it."""
    found = [path]
    for child in client.get_children(path):
        found.extend(walk(client, f"{path}/{child}"))
    return found


async def test_an_anonymous_client_can_read_but_not_change_any_node(zk: ZkStore, anonymous: KazooClient) -> None:
    """create, set and delete are refused with NoAuthError on every node of the cluster, ephemerals included."""
    await zk.create("/jobs/wc/spec", {"target": "x:y"})
    await zk.create("/jobs/wc/assignment", {"attempt": 1})
    await zk.create("/workers/w0", {"host": "h"}, ephemeral=True)
    nodes = walk(anonymous, zk.root)
    assert len(nodes) == 7  # root, /jobs, /jobs/wc, spec, assignment, /workers, /workers/w0
    refused = 0
    for node in nodes:
        assert anonymous.get(node) is not None  # reading is open: 'jobs' and 'cluster status' need no secret
        with pytest.raises(NoAuthError):
            anonymous.create(f"{node}/intruder", b"x")
        with pytest.raises(NoAuthError):
            anonymous.set(node, b"x")
        with pytest.raises(NoAuthError):
            anonymous.delete(node)
        refused += 3
    assert refused == 3 * len(nodes)
    assert await zk.get("/jobs/wc/assignment") == ({"attempt": 1}, 0)


async def test_a_store_without_the_secret_gets_a_clear_error_on_writes(zookeeper: ZooKeeperServer, zk: ZkStore) -> None:
    """The store translates NoAuthError into NotAuthorized, naming the cluster root."""
    await zk.create("/jobs/wc/state", {"state": "RUNNING"})
    async with ZkStore(zookeeper.address, zk.cluster) as reader:
        assert await reader.get("/jobs/wc/state") == ({"state": "RUNNING"}, 0)
        with pytest.raises(NotAuthorized, match=r"^ZooKeeper refused a change under /streamlet/\w+: this client"):
            await reader.set("/jobs/wc/state", {"state": "KILLED"})


async def test_a_root_made_with_another_secret_is_refused(zookeeper: ZooKeeperServer, zk: ZkStore) -> None:
    """A store with a different secret will not use a cluster root that carries another owner's ACL."""
    other = ZkStore(zookeeper.address, zk.cluster, session_timeout=2.0, secret=b"not " + TEST_SECRET)
    with pytest.raises(CoordinationError, match=r"^the cluster root /streamlet/\w+ carries another owner's ACL"):
        await other.start()
    await other.aclose()
