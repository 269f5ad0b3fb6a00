"""A worker process restarted under the same id, on the in-memory store: it takes its registration over from
the old session (which may expire later without unregistering it), comes back through STANDBY after losing its
node, and the leader starts another attempt when a worker of the running one is live under another boot.
Also the checkpoint trigger's ``since``: the first epoch of the attempt, carried by every later trigger."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from streamlet.backends.cluster.leader import live_changes
from streamlet.backends.cluster.leader.leader import JobView, Leader
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.lifecycle import LocalState, WorkerState
from streamlet.backends.cluster.tree.paths import Assignment, JobStateNode, WorkerInfo
from streamlet.backends.cluster.tree.registry import WorkerRegistration, workers
from streamlet.backends.cluster.tree.store import Found, MemoryClusterStore, MemoryTree, Version
from tests.unit.backends.cluster.conftest import SECRET, MemoryCluster

INFO: WorkerInfo = {"host": "127.0.0.1", "data_port": 1, "capacity": 8, "labels": []}


@dataclass
class RecordingTree(MemoryTree):
    """A tree that records every write: ``(path, version, data)`` as it stands after the write (``None`` for
    both once the node is gone)."""

    writes: list[tuple[str, int | None, Any]] = field(default_factory=list)

    def touched(self, path: str) -> None:
        node = self.nodes.get(path)
        if node is None:
            self.writes.append((path, None, None))
        else:
            self.writes.append((path, node.version, json.loads(node.raw) if node.raw else None))
        super().touched(path)

    def of(self, path: str) -> list[tuple[int | None, Any]]:
        """The writes of ``path``, in order."""
        return [(version, data) for written, version, data in self.writes if written == path]


def described(registration: WorkerRegistration, zk_state: str, local_state: str) -> dict[str, Any]:
    """What a worker node holds for ``registration`` in those states."""
    return {**INFO, "zk_state": zk_state, "local_state": local_state, "boot": registration.boot}


async def registered(cluster: MemoryCluster, worker_id: str, capacity: int = 8) -> WorkerRegistration:
    """A worker process registered on a session of its own, with a fresh heartbeat (a second call for the same
    id is that worker restarted: a new session and a new boot, the old session not expired yet)."""
    session = cluster.workers[worker_id] = MemoryClusterStore(cluster.tree)
    registration = WorkerRegistration(session, worker_id, {**INFO, "capacity": capacity})
    await registration.register()
    await registration.beat()
    return registration


# -- the registration ------------------------------------------------------------------


async def test_a_restarted_worker_stays_registered_when_its_old_session_expires() -> None:
    """Session A registers w and beats; the restarted process registers w on session B before A expired: the
    node and the load node become B's, so A expiring leaves w registered under B's boot; B closing removes it."""
    tree = MemoryTree()
    old, new, reader = MemoryClusterStore(tree), MemoryClusterStore(tree), MemoryClusterStore(tree)
    first = WorkerRegistration(old, "w", INFO, load=lambda: {"pid": 1})
    await first.register()
    await first.beat()
    assert tree.nodes[paths.worker("w")].owner is old
    assert tree.nodes[paths.load("w")].owner is old

    second = WorkerRegistration(new, "w", INFO, load=lambda: {"pid": 2})
    await second.register()
    assert second.boot != first.boot
    node = await reader.get(paths.worker("w"))
    assert node is not None
    assert node.data == described(second, "STANDBY", "waiting")
    assert tree.nodes[paths.worker("w")].owner is new
    assert await reader.get(paths.load("w")) is None  # the old process's load went: the next beat makes ours
    await second.beat()
    assert tree.nodes[paths.load("w")].owner is new

    old.expire()
    assert tree.nodes[paths.worker("w")].owner is new
    seen = [(view.worker_id, view.info["boot"], (view.load or {}).get("pid")) for view in await workers(reader)]
    assert seen == [("w", second.boot, 2)]

    await new.aclose()
    assert paths.worker("w") not in tree.nodes
    assert paths.load("w") not in tree.nodes
    assert await workers(reader) == []


async def test_a_lost_node_comes_back_through_standby_then_the_state_asked_for() -> None:
    """The node vanished while the session lives on (the registration heard of no lost session): set_state(LIVE)
    creates it as STANDBY, then sets it LIVE; set_state(STANDBY) after another loss creates it only."""
    tree = RecordingTree()
    session, other = MemoryClusterStore(tree), MemoryClusterStore(tree)
    registration = WorkerRegistration(session, "w", INFO)
    await registration.register()
    node = paths.worker("w")
    assert tree.of(node) == [(0, described(registration, "STANDBY", "waiting"))]

    await other.delete(node)  # gone, and nobody told the registration
    tree.writes.clear()
    await registration.set_state(WorkerState.LIVE, LocalState.RUNNING)
    assert tree.of(node) == [
        (0, described(registration, "STANDBY", "running")),
        (1, described(registration, "LIVE", "running")),
    ]
    assert tree.nodes[node].owner is session  # ephemeral, this session's
    assert registration.zk_state is WorkerState.LIVE

    await other.delete(node)
    tree.writes.clear()
    await registration.set_state(WorkerState.STANDBY, LocalState.WAITING)
    assert tree.of(node) == [(0, described(registration, "STANDBY", "waiting"))]

    tree.writes.clear()  # with the node there, set_state is one write of it
    await registration.set_state(WorkerState.LIVE, LocalState.RUNNING)
    assert tree.of(node) == [(1, described(registration, "LIVE", "running"))]


async def test_after_an_expired_session_set_state_registers_again_through_standby() -> None:
    """The session expired (the registration heard "lost": VOID) and the node went with it: set_state(LIVE)
    creates it as STANDBY, then sets it LIVE, instead of refusing VOID -> LIVE."""
    tree = RecordingTree()
    session = MemoryClusterStore(tree)
    registration = WorkerRegistration(session, "w", INFO)
    await registration.register()
    await registration.set_state(WorkerState.LIVE, LocalState.RUNNING)
    node = paths.worker("w")
    session.expire()  # its ephemeral nodes go; the listener hears "lost", then "connected"
    assert registration.zk_state is WorkerState.VOID
    assert node not in tree.nodes
    tree.writes.clear()
    await registration.set_state(WorkerState.LIVE, LocalState.RUNNING)
    assert tree.of(node) == [
        (0, described(registration, "STANDBY", "running")),
        (1, described(registration, "LIVE", "running")),
    ]
    assert registration.zk_state is WorkerState.LIVE


# -- the checkpoint trigger's since ------------------------------------------------------


def test_the_first_trigger_of_an_attempt_starts_its_since_and_later_ones_carry_it() -> None:
    """since is the attempt's first epoch, whatever the later triggers ask (final, pause, export)."""
    first = paths.next_trigger(None, 5, final=False, pause=False, at=1.0)
    assert first == {"epoch": 5, "final": False, "pause": False, "at": 1.0, "since": 5}
    second = paths.next_trigger(first, 6, final=False, pause=True, at=2.0, export="/exports/a")
    assert second == {"epoch": 6, "final": False, "pause": True, "at": 2.0, "export": "/exports/a", "since": 5}
    third = paths.next_trigger(second, 7, final=True, pause=False, at=3.0)
    assert third == {"epoch": 7, "final": True, "pause": False, "at": 3.0, "since": 5}


def test_a_trigger_held_by_the_leader_before_any_checkpoint_gets_its_since_from_the_first_real_epoch() -> None:
    """The leader holds the trigger of an attempt that has none yet at epoch 0, without since; once released
    (hold dropped, as the leader does), the first epoch triggered is the since. A held trigger of an attempt
    that had begun keeps the since it had."""
    held = live_changes.held(None, 3)
    assert (held["epoch"], held["hold"], "since" in held) == (0, 3, False)
    released = {key: value for key, value in held.items() if key != "hold"}
    after = paths.next_trigger(released, 4, final=False, pause=False, at=9.0)
    assert after == {"epoch": 4, "final": False, "pause": False, "at": 9.0, "since": 4}

    begun = paths.next_trigger(None, 2, final=False, pause=False, at=1.0)
    held_again = live_changes.held(begun, 8)
    assert (held_again["epoch"], held_again["since"]) == (2, 2)
    resumed = paths.next_trigger({k: v for k, v in held_again.items() if k != "hold"}, 3, final=False, at=2.0)
    assert resumed == {"epoch": 3, "final": False, "at": 2.0, "since": 2}


# -- the leader -----------------------------------------------------------------------


async def test_a_worker_live_under_a_new_boot_makes_the_leader_start_the_next_attempt(
    cluster: MemoryCluster,
) -> None:
    """Attempt 1 is given to w0's first process (its boot in the assignment and in its started node); w0
    restarts and registers again: the next round starts attempt 2 for the new boot, the round after decides
    nothing more, and the old session expiring later changes nothing."""
    first = await registered(cluster, "w0")
    old_session = cluster.workers["w0"]
    await cluster.submit("p")
    assert await cluster.leader.round() == ["p: SCHEDULED: assigned to w0"]
    assignment = await cluster.assignment("p")
    assert (assignment["attempt"], assignment["boots"]) == (1, {"w0": first.boot})
    await cluster.report("p", 1, "w0", "started", {"at": 0, "boot": first.boot})
    assert await cluster.leader.round() == ["p: RUNNING: running on w0"]
    assert await cluster.leader.round() == []  # the same process: nothing to decide

    second = await registered(cluster, "w0")
    assert second.boot != first.boot
    assert await cluster.leader.round() == ["p: RECOVERING: attempt 2: lost w0"]
    assert await cluster.state("p") == ("RECOVERING", "attempt 2: lost w0")
    assignment = await cluster.assignment("p")
    assert assignment["attempt"] == 2
    assert set(assignment["instances"].values()) == {"w0"}  # type: ignore[attr-defined]
    assert assignment["boots"] == {"w0": second.boot}

    assert await cluster.leader.round() == []  # attempt 2 is the new process's: no attempt 3
    old_session.expire()
    assert await cluster.leader.round() == []
    assert (await cluster.assignment("p"))["attempt"] == 2
    await cluster.report("p", 2, "w0", "started", {"at": 1, "boot": second.boot})
    assert await cluster.leader.round() == ["p: RUNNING: running on w0"]


async def test_only_the_restarted_worker_is_named_and_every_worker_keeps_its_boot(cluster: MemoryCluster) -> None:
    """Two workers of capacity 2 share the four instances; w1 restarts: attempt 2 names w1 alone and records
    w0's unchanged boot beside w1's new one."""
    w0 = await registered(cluster, "w0", capacity=2)
    w1 = await registered(cluster, "w1", capacity=2)
    await cluster.submit("p")
    assert await cluster.leader.round() == ["p: SCHEDULED: assigned to w0, w1"]
    assert (await cluster.assignment("p"))["boots"] == {"w0": w0.boot, "w1": w1.boot}
    w1_again = await registered(cluster, "w1", capacity=2)
    assert await cluster.leader.round() == ["p: RECOVERING: attempt 2: lost w1"]
    assignment = await cluster.assignment("p")
    assert (assignment["attempt"], assignment["boots"]) == (2, {"w0": w0.boot, "w1": w1_again.boot})
    assert set(assignment["instances"].values()) == {"w0", "w1"}  # type: ignore[attr-defined]


async def test_a_started_node_tells_the_boot_when_the_assignment_does_not(cluster: MemoryCluster) -> None:
    """An assignment without boots (written before they existed): the boot w0's started node recorded is the
    one compared, so w0 restarting still starts attempt 2."""
    first = await registered(cluster, "w0")
    await cluster.submit("p")
    await cluster.leader.round()
    found = await cluster.client.get(paths.assignment("p"))
    assert found is not None
    await cluster.client.set(paths.assignment("p"), {k: v for k, v in found.data.items() if k != "boots"})
    await cluster.report("p", 1, "w0", "started", {"at": 0, "boot": first.boot})
    assert await cluster.leader.round() == ["p: RUNNING: running on w0"]
    await registered(cluster, "w0")
    assert await cluster.leader.round() == ["p: RECOVERING: attempt 2: lost w0"]


RUNNING: JobStateNode = {
    "state": "RUNNING", "reason": "running", "at": 0.0, "attempt": 3, "started": 0.0, "ended": None,
    "reconfigurations": 0,
}  # fmt: skip


def test_restarted_compares_the_attempts_boots_with_the_live_ones() -> None:
    """Leader._restarted on a JobView: a live worker under another boot than the assignment (or, for a worker
    a live change brought in, its started node) gave is restarted; one under the same boot, one not live (the
    live check's) and one given no boot are not."""
    assignment: Found[Assignment] = Found(
        {
            "epoch": 1,
            "attempt": 3,
            "instances": {"a.0": "w0", "a.1": "w1", "a.2": "w2", "a.3": "w3"},
            "boots": {"w0": "b0", "w1": "b1", "w2": "b2"},
        },
        Version(0, mzxid=1),
    )
    view = JobView(
        name="p",
        spec={},
        state=RUNNING,
        state_version=0,
        assignment=assignment,
        started={"w0", "w1", "w4"},
        done={},
        kill=None,
        started_boots={"w4": "j4"},  # joined by a live change
    )
    leader = Leader(MemoryClusterStore(MemoryTree()), epoch=1, secret=SECRET)
    leader._boots = {"w0": "b0", "w1": "b1-again", "w3": "b3", "w4": "j4"}  # w2 is not live
    assert leader._restarted(view) == {"w1"}
    leader._boots["w4"] = "j4-again"
    assert leader._restarted(view) == {"w1", "w4"}
    leader._boots = {"w0": "b0", "w1": "b1", "w2": "b2", "w3": "", "w4": "j4"}
    assert leader._restarted(view) == set()
