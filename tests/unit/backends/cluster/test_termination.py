"""The distributed termination detector of loops, on the in-memory store: rounds, decisions, split jobs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import pytest

import streamlet as sl
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree
from streamlet.backends.cluster.worker.termination import (
    ClusterQuiescence,
    LoopAttempt,
    LoopDetector,
    looks_quiet,
    quiet,
)
from streamlet.core.model.record import CYCLE_END
from streamlet.core.runtime.channel import Inbox, LocalChannel
from streamlet.core.runtime.cycles import CycleTracker, LoopCounters
from streamlet.core.runtime.job import Job, JobResult
from streamlet.core.runtime.plan import Placement
from streamlet.errors import CoordinationError
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient
from tests.conftest import pairs
from tests.unit.core.test_cycles import Relay, halving_loop

WORKERS = ["w0", "w1"]
SECRET = b"termination"


@dataclass
class LoopWorker:
    """One worker's share of the loop 'halve': its tracker, an inbox channel the tracker ends, and its part's end."""

    tracker: CycleTracker
    inbox: Inbox
    channel: int
    returned: anyio.Event  # set when the worker's quiescence has closed every loop here and returned

    def ended(self) -> bool:
        """The tracker closed the loop here: its in-loop channel got the loop's end."""
        return self.tracker.closed and self.inbox.head(self.channel) is CYCLE_END


def loop_worker(quiescence: ClusterQuiescence) -> LoopWorker:
    """A tracker of the loop through 'halve' with one in-loop channel and no outside sender still open."""
    tracker = CycleTracker({"halve"}, quiescence)
    inbox = Inbox(2)
    channel = inbox.add_channel(0)
    tracker.add_in_loop_channel(inbox, channel)
    return LoopWorker(tracker, inbox, channel, anyio.Event())


async def follow(quiescence: ClusterQuiescence, worker: LoopWorker) -> None:
    """Run the worker's side of the detection; say when it returns."""
    await quiescence.run([worker.tracker])
    worker.returned.set()


@asynccontextmanager
async def two_workers(
    detector_session: type[MemoryClusterStore] = MemoryClusterStore,
) -> AsyncIterator[tuple[LoopDetector, dict[str, LoopWorker]]]:
    """Two workers answering rounds on their own sessions of one tree, and a detector the test drives by hand."""
    tree = MemoryTree()
    workers: dict[str, LoopWorker] = {}
    async with anyio.create_task_group() as group:
        for name in WORKERS:
            attempt = LoopAttempt("job", 1, name, WORKERS)
            quiescence = ClusterQuiescence(MemoryClusterStore(tree), attempt, detect=False)
            workers[name] = loop_worker(quiescence)
            group.start_soon(follow, quiescence, workers[name])
        yield LoopDetector(detector_session(tree), LoopAttempt("job", 1, "w0", WORKERS)), workers
        group.cancel_scope.cancel()


def send(worker: LoopWorker, batches: int) -> None:
    """A sender of this worker put ``batches`` on channels into the loop (what a route counts)."""
    worker.tracker.flow.pending += batches


async def both_ended(workers: dict[str, LoopWorker]) -> None:
    """Wait until each worker has seen the decision and ended its loop."""
    with anyio.fail_after(5):
        for worker in workers.values():
            await worker.returned.wait()
    assert [worker.ended() for worker in workers.values()] == [True, True]


def test_one_round_that_looks_quiet_is_not_enough() -> None:
    """Balanced counters in a single round (no earlier round to compare with) do not end the loop."""
    view = {"w0": LoopCounters(3, 1, 0, False), "w1": LoopCounters(0, 2, 0, False)}
    assert looks_quiet(view)
    assert not quiet(None, view)
    assert quiet(dict(view), view)


def test_a_busy_worker_or_an_open_outside_sender_keeps_a_loop_running() -> None:
    """Input waiting in an inbox, or an end-of-stream still expected from outside, is not quiet, even balanced."""
    busy = {"w0": LoopCounters(1, 1, 0, True)}
    fed = {"w0": LoopCounters(1, 1, 1, False)}
    assert (quiet(busy, busy), quiet(fed, fed)) == (False, False)


async def test_quiet_only_after_two_equal_rounds() -> None:
    """w0 sent two batches, w1 processed both: round 1 decides nothing, round 2 ends the loop on both workers."""
    async with two_workers() as (detector, workers):
        send(workers["w0"], 2)
        workers["w1"].tracker.batches_done(2)
        assert await detector.next_round() is False
        assert await detector.store.get(paths.loop_quiet("job", 1)) is None
        assert not any(worker.tracker.closed for worker in workers.values())
        assert await detector.next_round() is True
        await both_ended(workers)
        found = await detector.store.get(paths.loop_quiet("job", 1))
    assert found is not None
    assert found[0] == {"loops": ["halve"], "round": 2}


async def test_a_batch_on_the_wire_keeps_the_loop_running() -> None:
    """Sent by w0, not yet processed by w1: unchanged rounds do not end the loop; once processed, two rounds do."""
    async with two_workers() as (detector, workers):
        send(workers["w0"], 1)
        assert [await detector.next_round() for _ in range(3)] == [False, False, False]
        assert not any(worker.tracker.closed for worker in workers.values())
        workers["w1"].tracker.batches_done(1)
        assert [await detector.next_round(), await detector.next_round()] == [False, True]
        await both_ended(workers)


async def test_counters_that_moved_between_two_balanced_rounds_keep_the_loop_running() -> None:
    """Balanced in both rounds but different: something happened in between, so a third round must confirm."""
    async with two_workers() as (detector, workers):
        send(workers["w0"], 1)
        workers["w1"].tracker.batches_done(1)
        assert await detector.next_round() is False
        send(workers["w1"], 1)
        workers["w0"].tracker.batches_done(1)
        assert [await detector.next_round(), await detector.next_round()] == [False, True]
        await both_ended(workers)


async def test_an_open_outside_sender_keeps_the_loop_running_until_it_ends() -> None:
    """w1 still expects end-of-stream from a source: no decision until it arrives, then two rounds end the loop."""
    async with two_workers() as (detector, workers):
        workers["w1"].tracker.external_open = 1
        assert [await detector.next_round() for _ in range(2)] == [False, False]
        workers["w1"].tracker.external_ended()
        assert [await detector.next_round(), await detector.next_round()] == [False, True]
        await both_ended(workers)


class DropsTheFirstDecision(MemoryClusterStore):
    """A session that drops at the first attempt to publish a decision (as a suspended ZooKeeper session would)."""

    dropped = False

    async def create(self, path: str, data: object, *, ephemeral: bool = False, sequence: bool = False) -> str:
        if path.endswith("/quiet") and not self.dropped:
            self.dropped = True
            raise CoordinationError("the store session is suspended")
        return await super().create(path, data, ephemeral=ephemeral, sequence=sequence)


async def test_a_decision_cut_short_by_a_lost_session_is_published_in_the_next_round() -> None:
    """The round that found the loop quiet could not tell the workers; the next round does, so nobody waits forever."""
    async with two_workers(DropsTheFirstDecision) as (detector, workers):
        assert await detector.next_round() is False
        with pytest.raises(CoordinationError):
            await detector.next_round()
        assert await detector.next_round() is True
        await both_ended(workers)


# -- whole jobs split between two parts, over TCP ---------------------------------------------------------


async def run_split(build: Callable[[], sl.Topology], where: dict[tuple[str, int], str]) -> dict[str, JobResult]:
    """Run ``build()`` as two parts, 'w0' and 'w1', joined by TCP, their loops ended by the detector on w0."""
    tree = MemoryTree()
    results: dict[str, JobResult] = {}
    async with DataServer(SECRET) as server0, DataServer(SECRET) as server1, TcpClient(SECRET) as client:
        servers = {"w0": server0, "w1": server1}

        async def run(me: str) -> None:
            placement = Placement(
                job="split",
                local=lambda node, index: where[node, index] == me,
                remote=lambda name, node, index: client.channel(servers[where[node, index]].address, name),
                expose=servers[me].register,
            )
            quiescence = ClusterQuiescence(MemoryClusterStore(tree), LoopAttempt("split", 1, me, WORKERS))
            job = Job(build(), channel_factory=LocalChannel, placement=placement, quiescence=quiescence, batch_size=64)
            results[me] = await job.run()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for me in WORKERS:
                    group.start_soon(run, me)
    return results


def halving() -> sl.Topology:
    """3000 numbers halved round a loop of two instances, at most 10 rounds (numbers from 2048 up are dropped)."""
    return halving_loop(list(range(1, 3001)), limit=10, parallelism=2)


async def test_a_halving_loop_split_over_two_workers_gives_the_in_process_result() -> None:
    """halve.0 on w0, halve.1 on w1 (the loop crosses TCP both ways): the same records and the same drops."""
    where = {("numbers", 0): "w0", ("halve", 0): "w0", ("halve", 1): "w1", ("done", 0): "w1"}
    expected = await Job(halving(), channel_factory=LocalChannel).run()
    results = await run_split(halving, where)
    assert sorted(pairs(results["w1"].sink("done"))) == sorted(pairs(expected.sink("done")))
    assert len(expected.sink("done")) == 2047
    dropped = [results[me].statistics.dropped for me in WORKERS]
    assert sum(dropped) == expected.statistics.dropped == 953


def two_loops() -> sl.Topology:
    """A halving loop whose results feed a second loop, a ring 'a' -> 'b' -> 'a' going round 3 times."""
    topology = halving_loop(list(range(1, 101)), limit=10)
    first = topology.add_task("a", Relay).set_input("halve", out_port=1)
    second = topology.add_task("b", Relay).set_input(first)
    first.set_input(second)
    topology.set_max_iterations(3, at=first)
    topology.add_sink("tap", sl.CollectSink()).set_input(second)
    return topology


async def test_two_loops_in_a_row_split_over_two_workers_end_one_after_the_other() -> None:
    """The ring is fed by the halving loop, so it can only end after it: both end, with the in-process result."""
    where = {
        ("numbers", 0): "w0", ("halve", 0): "w1", ("done", 0): "w0", ("a", 0): "w0", ("b", 0): "w1", ("tap", 0): "w0",
    }  # fmt: skip
    expected = await Job(two_loops(), channel_factory=LocalChannel).run()
    results = await run_split(two_loops, where)
    assert sorted(pairs(results["w0"].sink("tap"))) == sorted(pairs(expected.sink("tap")))
    assert len(expected.sink("tap")) == 400  # 100 numbers, 4 passes through 'b' each (3 rounds back)
    assert sorted(pairs(results["w0"].sink("done"))) == sorted(pairs(expected.sink("done")))
