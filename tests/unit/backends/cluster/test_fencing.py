"""Fencing on the leader's term: a leader stopped between its read and its write, deposed meanwhile, writes
nothing when it goes on (on the in-memory store, no sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio

import streamlet as sl
from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.leader.adaptation import AdaptationLoop
from streamlet.backends.cluster.leader.leader import Leader
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import LeaderElection, LeaderFence, leader
from streamlet.backends.cluster.tree.layouts import request_node
from streamlet.backends.cluster.tree.registry import WorkerRegistration
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree, Op
from streamlet.backends.cluster.worker.job_parts import WorkerJobs
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient
from tests.unit.backends.cluster.conftest import SECRET, MemoryCluster

T = TypeVar("T")


class StopsBeforeWriting(MemoryClusterStore):
    """A master's session that, once armed, holds its next write under the path ``armed`` until the test lets it
    go: the master stopped (SIGSTOP, a long pause) between what it read and what it writes."""

    def __init__(self, tree: MemoryTree) -> None:
        super().__init__(tree)
        self.armed: str | None = None
        self.writing, self.go_on = asyncio.Event(), asyncio.Event()

    async def _stopped_here(self, *paths: str) -> None:
        if self.armed is not None and any(path.startswith(self.armed) for path in paths):
            self.armed = None
            self.writing.set()
            await self.go_on.wait()

    async def create(self, path: str, data: Any, *, ephemeral: bool = False, sequence: bool = False) -> str:
        await self._stopped_here(path)
        return await super().create(path, data, ephemeral=ephemeral, sequence=sequence)

    async def set(self, path: str, data: Any, version: int = -1) -> Any:
        await self._stopped_here(path)
        return await super().set(path, data, version)

    async def delete(self, path: str, *, recursive: bool = False) -> None:
        await self._stopped_here(path)
        await super().delete(path, recursive=recursive)

    async def ensure(self, path: str) -> None:
        await self._stopped_here(path)
        await super().ensure(path)

    async def commit(self, ops: Sequence[Op]) -> bool:
        await self._stopped_here(*(op.path for op in ops))
        return await super().commit(ops)


async def elected(cluster: MemoryCluster, name: str) -> tuple[Leader, StopsBeforeWriting]:
    """A master elected on a session of its own, leading with the epoch it won, and that session."""
    session = StopsBeforeWriting(cluster.tree)
    epoch = await LeaderElection(session, {"name": name}).campaign()
    return Leader(session, epoch, SECRET), session


async def deposed_while_writing(
    cluster: MemoryCluster, session: StopsBeforeWriting, decide: Callable[[], Awaitable[T]]
) -> tuple[T, Leader]:
    """Run ``decide`` on the old leader's ``session`` up to its first write; meanwhile that session expires (its
    ``/leader`` goes) and another master is elected; then let the write go. What ``decide`` returned, and the
    new leader."""
    outcome: list[T] = []

    async def run() -> None:
        outcome.append(await decide())
        session.writing.set()  # it wrote nothing at all: nothing to hold

    session.armed = "/"  # any write
    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await session.writing.wait()
        session.expire()
        new, _ = await elected(cluster, "m1")
        session.go_on.set()
    return outcome[0], new


async def test_a_deposed_leaders_schedule_is_refused(cluster: MemoryCluster) -> None:
    """The old leader read a SUBMITTED job and stopped before scheduling it: its attempt 1 never lands; the new one's
    does, with the new epoch."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    old, session = await elected(cluster, "m0")
    decisions, new = await deposed_while_writing(cluster, session, old.round)
    assert decisions == []
    assert await cluster.client.get(paths.assignment("p")) is None
    assert await cluster.state("p") == ("SUBMITTED", "waiting for the leader to schedule it")
    assert await new.round() == ["p: SCHEDULED: assigned to w0"]
    assert ((await cluster.assignment("p"))["epoch"], new.epoch) == (2, 2)


async def test_a_deposed_leaders_recovery_is_refused(cluster: MemoryCluster) -> None:
    """The old leader saw w1 lost and stopped before writing attempt 2: attempt 1 stays; the new leader's attempt 2
    lands."""
    await cluster.add_worker("w0", capacity=2)
    await cluster.add_worker("w1", capacity=2)
    await cluster.submit("p")
    old, session = await elected(cluster, "m0")
    assert await old.round() == ["p: SCHEDULED: assigned to w0, w1"]
    cluster.workers["w1"].expire()
    decisions, new = await deposed_while_writing(cluster, session, old.round)
    assert decisions == []
    assert (await cluster.assignment("p"))["attempt"] == 1
    assert await cluster.state("p") == ("SCHEDULED", "assigned to w0, w1")
    assert await new.round() == ["p: RECOVERING: attempt 2: lost w1"]
    assignment = await cluster.assignment("p")
    assert (assignment["attempt"], assignment["epoch"], set(assignment["instances"].values())) == (2, 2, {"w0"})  # type: ignore[attr-defined]


async def test_a_deposed_leaders_live_change_is_refused(cluster: MemoryCluster) -> None:
    """The old leader planned a rescale and stopped before writing it: no change, the request waits, the job stays
    RUNNING; the new leader plans it, with its epoch."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    old, session = await elected(cluster, "m0")
    await old.round()
    await cluster.report("p", 1, "w0", "started", {"at": 0})
    assert await old.round() == ["p: RUNNING: running on w0"]
    await cluster.client.create(paths.reconfigure_request("p"), request_node("double", instances=3))
    decisions, new = await deposed_while_writing(cluster, session, old.round)
    assert decisions == []
    assert await cluster.client.children(paths.reconfigurations("p")) == []
    assert await cluster.client.get(paths.reconfigure_request("p")) is not None
    assert await cluster.state("p") == ("RUNNING", "running on w0")
    assert await new.round() == ["p: RECONFIGURING: change 1 (double: 128 segments over 3 instances)"]
    change = await cluster.client.get(paths.reconfiguration("p", 1))
    assert change is not None
    assert change[0]["epoch"] == 2


def shedding_job() -> tuple[sl.Topology, sl.QoS]:
    """feed -> out, under a QoS that lets it shed half its input."""
    topology = sl.Topology("shedding").set_qos(sl.QoS(max_latency=5.0, max_shed_ratio=0.5))
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("feed", [1]))
    assert topology.qos is not None
    return topology, topology.qos


def source_blocked(seconds: float) -> dict[str, dict[str, Any]]:
    """feed.0's statistics once it was held back ``seconds`` in all."""
    return {"feed.0": {"node": "feed", "index": 0, "kind": "source", "blocked": seconds, "latency": [0] * 40}}


async def test_a_deposed_leaders_shed_decision_is_refused(cluster: MemoryCluster) -> None:
    """The old leader's shed policy decided 10 % (the source held back 60 % of a 1 s window) and stopped before writing
    it: no ratio is set, no decision recorded; the new leader's lands."""
    await cluster.submit("p")
    topology, qos = shedding_job()
    before, after = {"w0": (0.0, source_blocked(0.0))}, {"w0": (1.0, source_blocked(0.6))}
    old, session = await elected(cluster, "m0")
    adaptation = AdaptationLoop(session, SECRET, old.fence)
    decision, new = await deposed_while_writing(
        cluster, session, lambda: adaptation._shed("p", topology, qos, before, after)
    )
    assert decision is None
    assert await cluster.client.get(paths.shedding("p")) is None
    assert await cluster.client.children(paths.decisions("p")) == []
    decided = await AdaptationLoop(new.store, SECRET, new.fence)._shed("p", topology, qos, before, after)
    assert decided is not None
    assert (decided["policy"], decided["action"], decided["reason"]) == (
        "shed", "shed 10% at the sources", "sources held back 60% and no capacity to add: shed 10%",
    )  # fmt: skip
    shedding = await cluster.client.get(paths.shedding("p"))
    assert shedding is not None
    assert shedding[0]["ratio"] == 0.1


async def test_a_deposed_leaders_backup_placement_is_refused(cluster: MemoryCluster) -> None:
    """The old leader placed a RUNNING job's backups and stopped before writing them: nothing is written."""
    for worker in ("w0", "w1"):
        await cluster.add_worker(worker, capacity=4)
    spec = job_commands.new_spec(cluster.module(), {}, {"interval": 1.0, "replicas": 1})
    await job_commands.submit(cluster.client, "p", spec, SECRET)
    old, session = await elected(cluster, "m0")
    await old.round()
    for worker in set((await cluster.assignment("p"))["instances"].values()):  # type: ignore[attr-defined]
        await cluster.report("p", 1, worker, "started", {})
    await old.round()
    assert (await cluster.state("p"))[0] == "RUNNING"
    await cluster.client.delete(paths.backups("p"))  # placed by that round: the next pass places them again
    old.backups.forget("p")
    old._backups_placed_at = -1e9
    decisions, _ = await deposed_while_writing(cluster, session, old.round)
    assert decisions == []
    assert await cluster.client.get(paths.backups("p")) is None


async def test_an_election_lost_in_a_race_leaves_the_epoch_to_the_winner(cluster: MemoryCluster) -> None:
    """Two candidates read /epoch before either writes it: the loser writes nothing, so /epoch holds the winner's
    epoch and the winner's fence holds (a loser's epoch there would fence the winner out for ever)."""
    first, second = StopsBeforeWriting(cluster.tree), StopsBeforeWriting(cluster.tree)
    first.armed = second.armed = paths.EPOCH
    async with anyio.create_task_group() as group:
        winning = asyncio.ensure_future(LeaderElection(first, {"name": "m0"}).campaign())
        await first.writing.wait()
        group.start_soon(LeaderElection(second, {"name": "m1"}).campaign)
        await second.writing.wait()
        first.go_on.set()
        won = await winning
        second.go_on.set()
        await anyio.wait_all_tasks_blocked()  # the runner-up waits for /leader to go
        group.cancel_scope.cancel()
    assert await leader(cluster.client) == {"name": "m0", "epoch": won}
    assert await cluster.client.get(paths.EPOCH) == ({"epoch": won}, 0)
    assert await LeaderFence(first, won).commit([]) is True


async def test_a_worker_refuses_a_live_change_from_an_older_leader_and_says_so(cluster: MemoryCluster) -> None:
    """After obeying epoch 2, a change of epoch 1 is not carried out: its done report says why (the leader then moves
    to the next attempt instead of waiting for ever); a change of epoch 2 is started."""
    session = cluster.workers["w0"] = MemoryClusterStore(cluster.tree)
    started: list[tuple[str, ...]] = []

    class Recorded:
        def start_soon(self, function: Callable[..., Awaitable[None]], *args: Any) -> None:
            started.append((function.__name__, *(str(arg) for arg in args[:2])))

    base = {"attempt": 1, "workers": ["w0"], "placed": {}, "task": "double"}
    await session.create(paths.reconfiguration("p", 1), {**base, "id": 1, "epoch": 1})
    async with DataServer(SECRET) as server, TcpClient(SECRET) as client:
        registration = WorkerRegistration(session, "w0", {"host": server.host, "data_port": server.port, "capacity": 8})
        worker = WorkerJobs(session, registration, server, client, SECRET, cluster.tmp_path / "w0")
        assert worker.fence.accept(2)
        await worker._take_up_changes("p", 1, Recorded())  # type: ignore[arg-type]
        await session.create(paths.reconfiguration("p", 2), {**base, "id": 2, "epoch": 2})
        await worker._take_up_changes("p", 1, Recorded())  # type: ignore[arg-type]
    assert await cluster.client.get(f"{paths.reconfiguration('p', 1)}/done/w0") == (
        {"error": "refused: change 1 comes from leader epoch 1, older than 2"}, 0,
    )  # fmt: skip
    assert (started, worker.fence.refused) == ([("_reconfigure", "p", "1")], 1)
