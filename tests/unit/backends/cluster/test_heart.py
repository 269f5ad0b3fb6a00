"""A worker's heartbeat from a thread of its own: it keeps coming while user code holds the event loop, says
how far the loop lags and which task holds it, and the leader reports such a worker BUSY, never lost."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

import streamlet as sl
from streamlet.backends.cluster.client.status import format_status
from streamlet.backends.cluster.leader.leader import Leader
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.loads import STALE_AFTER, busy, heartbeat_word, live
from streamlet.backends.cluster.tree.paths import WorkerInfo
from streamlet.backends.cluster.tree.registry import WorkerRegistration, workers
from streamlet.backends.cluster.tree.status import read_status
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree
from streamlet.backends.cluster.worker.heart import HeartThread
from streamlet.core.model import world

INFO: WorkerInfo = {"host": "127.0.0.1", "data_port": 1, "capacity": 8, "labels": []}
HELD = 10.0  # seconds the task holds the loop


class Recorded(MemoryClusterStore):
    """A memory store that also keeps every heartbeat written from a thread (what the leader could read)."""

    def __init__(self, tree: MemoryTree) -> None:
        super().__init__(tree)
        self.beats: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def write_from_thread(self, path: str, data: Any) -> None:
        super().write_from_thread(path, data)
        with self.lock:
            self.beats.append(data)


class HoldsTheLoop(sl.Task):
    """A plain def execute that computes (sleeps) for HELD seconds: the loop is held all that time."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        time.sleep(HELD)
        outputs.emit_batch(inputs.get())


@pytest.mark.timeout(120)
async def test_heartbeats_keep_coming_while_a_task_holds_the_loop_for_ten_seconds() -> None:
    tree = MemoryTree()
    store = Recorded(tree)
    registration = WorkerRegistration(store, "w1", INFO, load=lambda: {"pid": 1})
    await registration.register()
    await registration.beat()
    registration.beats_from_thread = True
    heart = HeartThread(registration, period=0.5)
    heart.start()
    topology = sl.Topology("heart-held")
    node = topology.add_task("slow", HoldsTheLoop).set_input(topology.add_source("src", [("a", 1)]))
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    try:
        began = world.wall_time()
        async with sl.start(topology) as job:
            result = await job.wait()
        ended = world.wall_time()
    finally:
        heart.stop()
    assert [(r.key, r.value) for r in result.sink("out")] == [("a", 1)]
    with store.lock:
        during = [beat for beat in store.beats if began <= beat["ts"] <= ended]
    assert ended - began >= HELD
    # one beat every 0.5 s of the 10 s: however busy the machine, never a gap a leader would call lost
    stamps = [began, *(beat["ts"] for beat in during), ended]
    assert max(later - earlier for earlier, later in itertools.pairwise(stamps)) < STALE_AFTER
    assert len(during) >= 5
    held = [beat for beat in during if beat["holding"] is not None and beat["holding"]["seconds"] is not None]
    assert held, "no beat named the call holding the loop"
    assert {beat["holding"]["task"] for beat in held} == {"slow"}
    assert max(beat["loop_lag"] for beat in during) >= HELD / 2
    assert max(beat["holding"]["seconds"] for beat in held) >= HELD / 2
    assert max(beat["loop_held_share"] for beat in during) >= 0.9
    assert tree.nodes[paths.load("w1")].version >= len(during)  # each beat went into the tree itself


def test_busy_is_a_lagging_loop_with_fresh_beats() -> None:
    fresh = {"ts": 100.0, "loop_lag": 3.25, "holding": {"task": "slow", "instance": 0, "seconds": 3.2}}
    assert busy(fresh) == {"lag": 3.25, "share": 0.0, "task": "slow", "instance": 0, "seconds": 3.2}
    # calls held the loop 95 % of the time, each short enough that the loop never lags a second
    shared = {
        "ts": 100.0,
        "loop_lag": 0.06,
        "loop_held_share": 0.95,
        "holding": {"task": "slow", "instance": 1, "seconds": None},
    }
    assert busy(shared) == {"lag": 0.06, "share": 0.95, "task": "slow", "instance": 1, "seconds": None}
    assert heartbeat_word(False, shared) == "BUSY 95% in 'slow' #1"
    assert busy({"ts": 100.0, "loop_lag": 0.06, "loop_held_share": 0.5}) is None
    assert busy({"ts": 100.0, "loop_lag": 0.02}) is None
    assert busy({"ts": 100.0}) is None  # a heartbeat from before the heart thread (no lag reported)
    assert heartbeat_word(False, fresh) == "BUSY 3.2s in 'slow' #0"
    assert heartbeat_word(False, {"loop_lag": 2.0, "holding": None}) == "BUSY 2.0s"
    assert heartbeat_word(True, fresh) == "stale"
    assert heartbeat_word(False, {"loop_lag": 0.0}) == "ok"


async def test_the_leader_reports_a_busy_worker_and_keeps_it_live() -> None:
    """A worker whose heartbeat is fresh but whose loop lags 3 s: live for the leader (nothing restarted), its
    status row BUSY naming the task, and the leader logs it BUSY once, then no longer BUSY once it keeps up."""
    tree = MemoryTree()
    worker, leader_session = MemoryClusterStore(tree), MemoryClusterStore(tree)
    registration = WorkerRegistration(worker, "w1", INFO, load=lambda: {"pid": 1})
    await registration.register()
    await registration.beat()
    now = world.wall_time()
    held = {"task": "slow", "instance": 2, "seconds": 3.0}
    await worker.set(paths.load("w1"), {"pid": 1, "ts": now, "beat": 9, "loop_lag": 3.0, "holding": held})
    assert [view.worker_id for view in live(await workers(leader_session), now + 1.0)] == ["w1"]
    status = await read_status(leader_session)
    row = status["workers"][0]
    assert row["busy"] == {"lag": 3.0, "share": 0.0, "task": "slow", "instance": 2, "seconds": 3.0}
    assert row["heartbeat"] == "BUSY 3.0s in 'slow' #2"
    assert "BUSY 3.0s in 'slow' #2" in format_status(status)
    leader = Leader(leader_session, 1, secret=b"s" * 32)
    with capture_logs() as logs:
        await leader.round()
        await leader.round()  # still busy: not logged again
        await worker.set(paths.load("w1"), {"pid": 1, "ts": world.wall_time(), "beat": 10, "loop_lag": 0.0})
        await leader.round()
    told = [(line["event"], line.get("task")) for line in logs if "BUSY" in line["event"]]
    assert told == [("worker BUSY", "slow"), ("worker no longer BUSY", None)]
