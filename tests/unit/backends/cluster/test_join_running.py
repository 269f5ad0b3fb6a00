"""A worker that joins the cluster while a job runs gets a share of it without a new attempt: a live change
puts an instance on it, it builds its part of the running attempt where the job stands, and from then on
takes part in checkpoints, later changes, failover and the job's end. Every running count exactly once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from streamlet.backends.cluster.client import live_changes as client_changes
from streamlet.backends.cluster.tree import paths, rebalancing
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.testing import SimulatedCluster
from tests.unit.backends.cluster.test_live_rescale import (
    RUNNING_COUNTS,
    count_records_on,
    from_a_savepoint,
    gate,
    gated_words_of,
    migrate,
    pairs,
    rescale,
    rescaled,
)

__all__ = ["gate"]  # the fixture, used by name


async def checkpoint_with(store: ClusterStore, job: str, worker: str) -> dict[str, Any]:
    """Wait (on the node's watch) for a completed checkpoint that holds ``worker``'s part."""
    version: int | None = None
    while True:
        data, version = await store.wait_changed(paths.completed(job), version)
        if data is not None and worker in data["workers"]:
            return dict(data)


async def test_an_added_worker_takes_a_migrated_instance_and_joins_the_running_attempt(gate: asyncio.Event) -> None:
    """worker-2 joins after the job started; count.0 moves to it with its state, then count grows to 3
    instances: attempt 1 throughout, a later checkpoint holds worker-2's part, worker-2 reports its end."""
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        job = await cluster.submit(rescaled, checkpoint_interval=0.05)
        await job.wait_for("RUNNING")
        assert "worker-2" not in (await job.instances()).values()
        added = await cluster.add_worker()
        moved = await migrate(cluster, "rescaled", 0, added)
        grown = await rescale(cluster, "rescaled", 3)
        checkpoint = await asyncio.wait_for(checkpoint_with(cluster.store, "rescaled", added), 30)
        layout = await cluster.store.get(paths.layout("rescaled"))
        gate.set()
        outcome = await job.outcome()
    assert added == "worker-2"
    assert (moved["reason"], moved["attempt"]) == ("change 1 done: count.0 runs on worker-2", 1)
    assert (grown["reconfigurations"], grown["attempt"]) == (2, 1)
    assert layout is not None
    assert layout[0]["placed"]["count.0"] == "worker-2"
    assert layout[0]["incarnations"]["count.0"] == 1
    assert int(checkpoint["attempt"]) == 1
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert "worker-2" in outcome.attempts[0].reports  # its part ended with the job, reported like the others
    # count.0 runs there: it took (at least) the gated words of its segments (0..42 of 128 at 3 instances)
    assert count_records_on(outcome, 1, "worker-2") >= gated_words_of(3, {0}) > 0
    assert pairs(outcome.committed["totals"]) == pairs(outcome.collected["seen"]) == RUNNING_COUNTS


async def test_a_joined_worker_lost_after_a_checkpoint_recovers_exactly_once(gate: asyncio.Event) -> None:
    """The joined worker dies after a checkpoint that holds its part: the next attempt restores from it
    (worker-2's part included) with the layout the change left, reads on from there (a seekable source),
    and every running count is there once."""
    async with SimulatedCluster(workers=2, capacity=8) as cluster:
        job = await cluster.submit(from_a_savepoint, checkpoint_interval=0.05)
        await job.wait_for("RUNNING")
        added = await cluster.add_worker()
        await migrate(cluster, "counted", 1, added)
        await asyncio.wait_for(checkpoint_with(cluster.store, "counted", added), 30)
        await cluster.kill_worker(added)
        await job.wait_for("RECOVERING")
        gate.set()
        outcome = await job.outcome()
    assert (outcome.state, outcome.attempt) == ("FINISHED", 2)
    assert "worker-2" not in outcome.attempts[1].workers
    assert outcome.attempts[1].restored_from is not None
    assert pairs(outcome.committed["totals"]) == RUNNING_COUNTS


async def test_rebalance_spreads_a_running_job_over_the_workers_added_since_it_started(gate: asyncio.Event) -> None:
    """All 7 instances run on worker-0; two workers join; the rebalance moves the movable ones (pass and
    count: sources and sinks stay) over them, one live migration each, fullest to emptiest, until even
    (then it has nothing left to move); attempt 1 throughout, exact counts, the new workers did the work."""
    async with SimulatedCluster(workers=1, capacity=8) as cluster:
        job = await cluster.submit(rescaled, checkpoint_interval=0.05)
        await job.wait_for("RUNNING")
        await cluster.add_worker()
        await cluster.add_worker()
        moves = await rebalancing.planned_moves(cluster.store, "rescaled", time.time())
        await client_changes.carry_out(cluster.store, "rescaled", moves, 30)
        again = await rebalancing.planned_moves(cluster.store, "rescaled", time.time())
        status = await job.state()
        gate.set()
        outcome = await job.outcome()
    assert [(move.instance, move.source, move.target) for move in moves] == [
        ("count.1", "worker-0", "worker-1"),
        ("pass.1", "worker-0", "worker-2"),
        ("count.0", "worker-0", "worker-1"),
        ("pass.0", "worker-0", "worker-2"),
    ]
    assert again == []
    assert status == ("RUNNING", "change 4 done: pass.0 runs on worker-2")
    assert (outcome.state, outcome.attempt) == ("FINISHED", 1)
    assert pairs(outcome.committed["totals"]) == pairs(outcome.collected["seen"]) == RUNNING_COUNTS
    assert count_records_on(outcome, 1, "worker-1") >= gated_words_of(2, {0, 1}) > 0  # every gated word
