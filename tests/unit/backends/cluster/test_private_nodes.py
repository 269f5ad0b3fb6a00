"""Which nodes anyone may read: the cluster's own; every node of job data is private to the secret's identity."""

from __future__ import annotations

import pytest

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.zk import DIGEST_USER, ZkStore

JOB_DATA = [
    paths.JOBS, paths.job("wc"), paths.spec("wc"), paths.state("wc"), paths.assignment("wc"), paths.started("wc", 1),
    f"{paths.done('wc', 1)}/w0", paths.kill("wc"), paths.failures("wc", "count.0"), paths.channel("wc", "count.0", 0),
    paths.completed("wc"), f"{paths.checkpoints('wc')}/attempt-1/trigger", paths.backups("wc"), paths.unusable("wc"),
    paths.reconfigure_request("wc"), paths.reconfigure_refused("wc"), paths.reconfiguration("wc", 1),
    paths.layout("wc"), paths.shedding("wc"), paths.decisions("wc"), paths.loop_quiet("wc", 1), paths.LOADS,
    paths.load("w0"), "/savepoints", "/anything-added-later",
]  # fmt: skip
CLUSTER = ["", paths.leader(), paths.epoch(), paths.CANDIDATES, paths.candidate_prefix(), paths.WORKERS,
           paths.worker("w0"), paths.DASHBOARD]  # fmt: skip


@pytest.mark.parametrize("path", JOB_DATA)
def test_job_data_is_created_readable_by_the_secret_identity_only(path: str) -> None:
    """A node of job data (or one nobody listed as the cluster's) gets one ACL entry: every permission for the
    digest identity."""
    assert not paths.world_readable(path)
    [acl] = ZkStore("localhost:2181", "c", secret=b"s").acl(path)
    assert (acl.id.scheme, acl.id.id.split(":")[0], acl.perms) == ("digest", DIGEST_USER, 31)


@pytest.mark.parametrize("path", CLUSTER)
def test_the_cluster_nodes_are_readable_by_anyone(path: str) -> None:
    """The root, leader, epoch, candidates, workers and the dashboard's URL: the digest identity, and read for
    anyone."""
    assert paths.world_readable(path)
    acls = ZkStore("localhost:2181", "c", secret=b"s").acl(path)
    assert [(acl.id.scheme, acl.perms) for acl in acls] == [("digest", 31), ("world", 1)]


def test_a_path_that_only_starts_like_a_cluster_node_is_private() -> None:
    """'/workersX' and '/leaders' are not '/workers' and '/leader'."""
    assert [paths.world_readable(path) for path in ("/workersX", "/leaders", "/dashboard2")] == [False] * 3
