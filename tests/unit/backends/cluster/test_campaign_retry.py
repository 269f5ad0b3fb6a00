"""A master whose store session fails while it campaigns campaigns again; it does not exit.

Found by the nemesis (seed 105): a standby master cut from ZooKeeper past its session died on
``SessionExpiredError`` raised out of its campaign, and the cluster ran on with one master less.
"""

from __future__ import annotations

import anyio

from streamlet.backends.cluster.local.run import campaign_and_lead
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree
from tests.unit.backends.cluster.conftest import SECRET


async def test_a_candidate_whose_session_fails_mid_campaign_campaigns_again_and_leads() -> None:
    tree = MemoryTree()
    first, second = MemoryClusterStore(tree), MemoryClusterStore(tree)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            with anyio.CancelScope() as first_master:
                group.start_soon(campaign_and_lead, first, "c", "master-0", SECRET, None, {"name": "master-0"})
                await first.wait_changed(paths.LEADER, None)  # master-0 leads
                group.start_soon(campaign_and_lead, second, "c", "master-1", SECRET, None, {"name": "master-1"})
                changed = await second.watch_children(paths.CANDIDATES)
                while len(await second.children(paths.CANDIDATES)) < 2:  # master-1 is a candidate, waiting
                    changed.clear()
                    await changed.wait()
                second.suspend()  # master-1 cut off from the store...
                first_master.cancel()
            await first.aclose()  # ...as the leader goes: its wait wakes into a store that does not answer
            await anyio.wait_all_tasks_blocked()  # master-1 met the store's failure (and waits to campaign again)
            second.resume()
            leader, version = await second.wait_changed(paths.LEADER, None)
            while leader is None or leader["name"] != "master-1":
                leader, version = await second.wait_changed(paths.LEADER, version)
            assert leader["name"] == "master-1"
            group.cancel_scope.cancel()
