"""Only holders of the cluster secret change the cluster or read job data: digest ACLs on every node (real
ZooKeeper, and a real cluster that ran a job)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from streamlet.backends.cluster.local.local_cluster import SECRET_ENV
from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.store import Create
from streamlet.backends.cluster.tree.zk import ZkStore, cluster_acl, credentials
from streamlet.errors import CoordinationError, NotAuthorized
from tests.integration.conftest import TEST_SECRET
from tests.support.cluster import running_cluster, secret_of, streamlet, wait_for_node

pytestmark = pytest.mark.integration

MARKER = "carried-by-a-record-5f1c"  # a value only job data holds: no world-readable node may show it

PRIVATE_JOB = f"""
import streamlet as sl

def check(record):
    if record.key == "poison-{MARKER}":
        raise ValueError("refused")
    return record.key, record.value

def build_topology():
    topology = sl.Topology("privacy")
    rows = [sl.Record("k", "value-{MARKER}", 0.0), sl.Record("poison-{MARKER}", 1, 0.0)]
    checked = topology.map("check", check, on_error="skip").set_input(topology.add_source("rows", rows))
    topology.add_sink("out", sl.CollectSink()).set_input(checked)
    return topology
"""


def refused(message_path: str) -> str:
    """The exact message of a read of job data without the secret, as a ``match`` pattern."""
    return (
        rf"^ZooKeeper refused to let this client read {message_path}: job data is readable only with the cluster "
        r"secret \(set STREAMLET_SECRET \(hex\), or run the command with the --state-dir where 'streamlet cluster "
        r"up' wrote it\)$"
    )


def kazoo_client(address: str, secret: bytes | None = None) -> KazooClient:
    """A plain kazoo client, started; with ``secret``, authenticated as the cluster's digest identity."""
    auth = {} if secret is None else {"auth_data": [("digest", credentials(secret))]}
    client = KazooClient(hosts=address, **auth)
    client.start(timeout=10)
    return client


def closed(client: KazooClient) -> None:
    """Stop and close ``client``."""
    client.stop()
    client.close()


@pytest.fixture
def anonymous(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain kazoo client that knows no secret."""
    client = kazoo_client(zookeeper.address)
    try:
        yield client
    finally:
        closed(client)


@pytest.fixture
async def secretless(zookeeper: ZooKeeperServer, zk: ZkStore) -> AsyncIterator[ZkStore]:
    """A store on ``zk``'s cluster without the secret."""
    async with ZkStore(zookeeper.address, zk.cluster, session_timeout=2.0) as store:
        yield store


def walk(client: KazooClient, path: str) -> list[str]:
    """``path`` and every node below it (``client`` must be allowed to list them)."""
    found = [path]
    for child in sorted(client.get_children(path)):
        found.extend(walk(client, f"{path}/{child}"))
    return found


def read_as_anyone(client: KazooClient, node: str) -> bytes | None:
    """The node's data as ``client`` reads it, ``None`` when ZooKeeper refuses (its children are refused too)."""
    try:
        data, _ = client.get(node)
    except NoAuthError:
        with pytest.raises(NoAuthError):
            client.get_children(node)
        return None
    client.get_children(node)
    return bytes(data)


@pytest.fixture(scope="module")
def ran(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 2-worker cluster on the session's ZooKeeper that ran a job collecting a record and dead-lettering one."""
    directory = Path(tmp_path_factory.mktemp("privacy"))
    (directory / "private_job.py").write_text(PRIVATE_JOB, encoding="utf-8")
    with running_cluster(directory, "--workers", "2", "--name", "privacy", "--zk", zookeeper.address) as state:
        submit = streamlet("submit", "private_job.py", "--job", "secrets", cwd=directory)
        assert submit.returncode == 0, submit.stderr
        assert submit.stdout.startswith("job 'secrets' FINISHED on "), submit.stdout
        wait_for_node(directory, paths.DASHBOARD, lambda data: "url" in data)  # the leader serves it by now
        yield state


def test_an_anonymous_client_reads_no_job_data_after_a_real_job_ran(ran: dict[str, Any]) -> None:
    """Every node under /jobs and /loads is refused to an anonymous client; the rest is readable and holds no
    record of the job (a secret holder sees the collected value and the dead letter's key in the reports)."""
    root = "/streamlet/privacy"
    owner, anyone = kazoo_client(ran["zk"], secret_of(ran["dir"])), kazoo_client(ran["zk"])
    try:
        nodes = walk(owner, root)
        seen = {node: read_as_anyone(anyone, node) for node in nodes}
        with_secret = {node: bytes(owner.get(node)[0]) for node in nodes}
        [candidate] = owner.get_children(f"{root}/candidates")
    finally:
        closed(owner)
        closed(anyone)
    readable = {node[len(root) :] for node, data in seen.items() if data is not None}
    assert readable == {
        "", "/leader", "/epoch", "/candidates", f"/candidates/{candidate}", "/workers", "/workers/worker-0",
        "/workers/worker-1", "/dashboard",
    }  # fmt: skip
    job_data = [node for node in nodes if node.startswith((f"{root}/jobs", f"{root}/loads"))]
    assert {node for node, data in seen.items() if data is None} == set(job_data)
    assert {f"{root}/jobs", f"{root}/jobs/secrets/spec", f"{root}/loads/worker-0"} <= set(job_data)
    reports = {node: data for node, data in with_secret.items() if node.startswith(f"{root}/jobs/secrets/done/1/")}
    holding = [node for node, data in reports.items() if f"value-{MARKER}".encode() in data]
    letters = [node for node, data in reports.items() if f"poison-{MARKER}".encode() in data]
    assert (len(holding), len(letters)) == (1, 1)  # the record the sink collected, the dead letter's key
    assert not [node for node, data in seen.items() if data is not None and MARKER.encode() in data]


def test_read_only_commands_without_the_secret_name_what_they_may_not_read(
    ran: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'jobs', 'cluster status' and 'top --once' with no secret at hand fail naming /jobs; with the state dir
    'cluster up' wrote they read the job."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    where = ("--zk", ran["zk"], "--name", "privacy")
    message = (
        "error: NotAuthorized: ZooKeeper refused to let this client read /streamlet/privacy/jobs: job data is "
        "readable only with the cluster secret (set STREAMLET_SECRET (hex), or run the command with the "
        "--state-dir where 'streamlet cluster up' wrote it)\n"
    )
    for command in (("jobs", *where), ("cluster", "status", *where), ("top", "--once", *where)):
        outcome = streamlet(*command, cwd=tmp_path)  # no .streamlet here: no secret to find
        assert (outcome.returncode, outcome.stdout, outcome.stderr) == (1, "", message), command
    listing = streamlet("jobs", "--json", cwd=ran["dir"])
    assert listing.returncode == 0, listing.stderr
    assert [(job["name"], job["state"]) for job in json.loads(listing.stdout)] == [("secrets", "FINISHED")]
    status = streamlet("cluster", "status", "--json", cwd=ran["dir"])
    assert status.returncode == 0, status.stderr
    assert [job["name"] for job in json.loads(status.stdout)["jobs"]] == ["secrets"]


async def test_an_anonymous_client_can_change_no_node(zk: ZkStore, anonymous: KazooClient) -> None:
    """create, set and delete are refused with NoAuthError on every node, ephemerals and readable ones included."""
    await zk.create("/jobs/wc/spec", {"target": "x:y"})
    await zk.commit([Create("/jobs/wc/assignment", {"attempt": 1})])
    await zk.create("/workers/w0", {"host": "h"}, ephemeral=True)
    await zk.create("/loads/w0", {"ts": 1.0}, ephemeral=True)
    nodes = [zk.root, *(zk.path(node) for node in ("/jobs", "/jobs/wc", "/jobs/wc/spec", "/jobs/wc/assignment"))]
    nodes += [zk.path(node) for node in ("/workers", "/workers/w0", "/loads", "/loads/w0")]
    for node in nodes:
        with pytest.raises(NoAuthError):
            anonymous.create(f"{node}/intruder", b"x")
        with pytest.raises(NoAuthError):
            anonymous.set(node, b"x")
        with pytest.raises(NoAuthError):
            anonymous.delete(node)
    readable = [node for node in nodes if read_as_anyone(anonymous, node) is not None]
    assert readable == [zk.root, zk.path("/workers"), zk.path("/workers/w0")]
    assert await zk.get("/jobs/wc/assignment") == ({"attempt": 1}, 0)


async def test_a_store_without_the_secret_is_told_which_job_node_it_may_not_read(
    zk: ZkStore, secretless: ZkStore
) -> None:
    """get, children, wait_changed and watch_children of job data raise NotAuthorized naming the node; the
    cluster's own nodes stay readable."""
    await zk.create("/jobs/wc/state", {"state": "RUNNING"})
    await zk.create("/workers/w0", {"host": "h"}, ephemeral=True)
    root = zk.root
    with pytest.raises(NotAuthorized, match=refused(f"{root}/jobs/wc/state")):
        await secretless.get("/jobs/wc/state")
    with pytest.raises(NotAuthorized, match=refused(f"{root}/jobs")):
        await secretless.children("/jobs")
    with pytest.raises(NotAuthorized, match=refused(f"{root}/jobs/wc/state")):
        await secretless.wait_changed("/jobs/wc/state", None)
    with pytest.raises(NotAuthorized, match=refused(f"{root}/jobs/wc")):
        await secretless.watch_children("/jobs/wc")
    assert await secretless.get("/workers/w0") == ({"host": "h"}, 0)
    assert await secretless.children("/workers") == ["w0"]


async def test_a_store_without_the_secret_gets_a_clear_error_on_writes(zk: ZkStore, secretless: ZkStore) -> None:
    """A refused set, and a refused transaction (not a failed check), raise NotAuthorized naming the root."""
    await zk.create("/jobs/wc/state", {"state": "RUNNING"})
    change = rf"^ZooKeeper refused a change under {zk.root}: this client does not hold the cluster secret$"
    with pytest.raises(NotAuthorized, match=change):
        await secretless.set("/jobs/wc/state", {"state": "KILLED"})
    with pytest.raises(NotAuthorized, match=change):
        await secretless.commit([Create("/jobs/other", {})])
    assert await zk.get("/jobs/wc/state") == ({"state": "RUNNING"}, 0)


async def test_job_data_an_earlier_version_left_readable_is_made_private_at_start(
    zookeeper: ZooKeeperServer, zk: ZkStore, anonymous: KazooClient
) -> None:
    """Nodes made world-readable before (ZooKeeper's data outlives 'cluster down') are private once a store with
    the secret starts; the cluster's own nodes keep their read access."""
    earlier = KazooClient(
        hosts=zookeeper.address, auth_data=[("digest", credentials(TEST_SECRET))], default_acl=cluster_acl(TEST_SECRET)
    )
    earlier.start(timeout=10)
    try:
        for node in ("/jobs/old/spec", "/jobs/old/done/1/w0", "/loads/w9", "/workers/w9"):
            earlier.create(zk.path(node), b"{}", makepath=True)
    finally:
        closed(earlier)
    private = [zk.path(node) for node in ("/jobs", "/jobs/old", "/jobs/old/spec", "/jobs/old/done/1/w0", "/loads")]
    assert all(read_as_anyone(anonymous, node) == b"{}" for node in private[-3:-1])  # readable, as before
    async with ZkStore(zookeeper.address, zk.cluster, session_timeout=2.0, secret=TEST_SECRET):
        pass
    assert [node for node in private if read_as_anyone(anonymous, node) is not None] == []
    assert read_as_anyone(anonymous, zk.path("/workers/w9")) == b"{}"


async def test_a_root_made_with_another_secret_is_refused(zookeeper: ZooKeeperServer, zk: ZkStore) -> None:
    """A store with a different secret will not use a cluster root that carries another owner's ACL."""
    other = ZkStore(zookeeper.address, zk.cluster, session_timeout=2.0, secret=b"not " + TEST_SECRET)
    with pytest.raises(CoordinationError, match=r"^the cluster root /streamlet/\w+ carries another owner's ACL"):
        await other.start()
    await other.aclose()
