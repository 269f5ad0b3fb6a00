"""Master election and fencing, and worker registration, against a real ZooKeeper."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer
from streamlet.backends.cluster.tree.election import EpochFence, LeaderElection, candidates, leader
from streamlet.backends.cluster.tree.lifecycle import LocalState, WorkerState
from streamlet.backends.cluster.tree.registry import WorkerRegistration, workers
from streamlet.backends.cluster.tree.zk import ZkStore
from tests.integration.conftest import TEST_SECRET

pytestmark = pytest.mark.integration


async def test_first_candidate_leads_and_the_next_takes_over_with_a_higher_epoch(
    zookeeper: ZooKeeperServer, cluster_name: str, zk: ZkStore
) -> None:
    """When the leader's session ends, the waiting candidate leads within session timeout + 1 s."""
    first = ZkStore(zookeeper.address, cluster_name, session_timeout=2.0, secret=TEST_SECRET)
    await first.start()
    second = ZkStore(zookeeper.address, cluster_name, session_timeout=2.0, secret=TEST_SECRET)
    await second.start()
    try:
        first_epoch = await LeaderElection(first, {"name": "m1"}).campaign()
        runner_up = LeaderElection(second, {"name": "m2"})
        registered = await zk.watch_children("/candidates")
        waiting = asyncio.ensure_future(runner_up.campaign())
        while len(await zk.children("/candidates")) < 2:  # the runner-up has registered and now waits
            await asyncio.wait_for(registered.wait(), timeout=10)
            registered.clear()
        assert not waiting.done()
        assert [c["name"] for c in await candidates(zk)] == ["m1", "m2"]
        assert await leader(zk) == {"name": "m1", "epoch": first_epoch}
        began = time.monotonic()
        await first.aclose()
        second_epoch = await asyncio.wait_for(waiting, timeout=3.0)
        assert time.monotonic() - began < 2.0 + 1.0
        assert second_epoch > first_epoch
        assert await leader(zk) == {"name": "m2", "epoch": second_epoch}
        assert await runner_up.still_leading() is True
    finally:
        await first.aclose()
        await second.aclose()


async def test_resign_hands_leadership_on(zookeeper: ZooKeeperServer, cluster_name: str, zk: ZkStore) -> None:
    """A leader that resigns deletes /leader and the next candidate wins at once."""
    election = LeaderElection(zk, {"name": "m1"})
    epoch = await election.campaign()
    await election.resign()
    assert await leader(zk) is None
    again = await LeaderElection(zk, {"name": "m2"}).campaign()
    assert again == epoch + 1


def test_fence_refuses_commands_from_an_older_epoch() -> None:
    """A worker obeys the newest leader only, and counts what it refused."""
    fence = EpochFence()
    assert [fence.accept(epoch) for epoch in (1, 3, 2, 3, 4)] == [True, True, False, True, True]
    assert (fence.highest, fence.refused) == (4, 1)


async def test_workers_register_with_state_and_heartbeat(zk: ZkStore) -> None:
    """A registered worker is listed with its state model and a fresh heartbeat."""
    registration = WorkerRegistration(zk, "w1", {"host": "127.0.0.1", "data_port": 7001, "capacity": 4}, heartbeat=0.1)
    await registration.register()
    await registration.beat()
    [view] = await workers(zk)
    assert view.worker_id == "w1"
    assert view.info == {
        "host": "127.0.0.1",
        "data_port": 7001,
        "capacity": 4,
        "zk_state": "STANDBY",
        "local_state": "waiting",
        "boot": registration.boot,  # this process of the worker: a restart registers another
    }
    assert len(registration.boot) == 12
    assert view.load is not None
    assert view.load["beat"] == 0
    assert view.stale(time.time(), after=5.0) is False
    await registration.set_state(WorkerState.LIVE, LocalState.RUNNING)
    [view] = await workers(zk)
    assert (view.info["zk_state"], view.info["local_state"]) == ("LIVE", "running")


async def test_stale_heartbeat_is_detected(zk: ZkStore) -> None:
    """A worker whose load was written long ago counts as stale."""
    registration = WorkerRegistration(zk, "w2", {"host": "127.0.0.1"}, load=lambda: {"cpu_seconds": 0.0})
    await registration.register()
    await registration.beat()
    [view] = await workers(zk)
    assert view.stale(time.time() + 10.0, after=5.0) is True


async def expire(zookeeper: ZooKeeperServer, victim: ZkStore) -> None:
    """Expire ``victim``'s session the ZooKeeper way: open the same session elsewhere and close it."""
    from kazoo.client import KazooClient

    session_id, password = victim._client.client_id

    def hijack() -> None:
        other = KazooClient(hosts=zookeeper.address, client_id=(session_id, password), timeout=2.0)
        other.start(timeout=10)
        other.stop()
        other.close()

    await asyncio.to_thread(hijack)


async def test_lost_session_is_reported_and_the_worker_registers_again(
    zookeeper: ZooKeeperServer, cluster_name: str, zk: ZkStore
) -> None:
    """After LOST the worker's ephemeral node is gone; once reconnected it is registered again."""
    worker_zk = ZkStore(zookeeper.address, cluster_name, session_timeout=2.0, secret=TEST_SECRET)
    await worker_zk.start()
    states: list[str] = []
    worker_zk.on_state(states.append)
    registration = WorkerRegistration(worker_zk, "w3", {"host": "127.0.0.1"}, heartbeat=0.1)
    await registration.register()
    beating = asyncio.ensure_future(registration.run())
    try:
        await expire(zookeeper, worker_zk)
        await asyncio.wait_for(zk.wait_gone("/workers/w3"), timeout=10)  # the expired session took it
        await asyncio.wait_for(zk.wait_changed("/workers/w3", None), timeout=10)  # registered again
        assert "lost" in states
        assert states[-1] == "connected"
        assert [view.worker_id for view in await workers(zk)] == ["w3"]
    finally:
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        await worker_zk.aclose()
