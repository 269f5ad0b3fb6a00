"""Ending a loop whose instances run on several workers: a distributed termination detector.

A loop ends when nothing outside feeds it any more and no batch is in
flight inside it. In one process its ``CycleTracker`` sees that at once. On
the cluster each worker's tracker counts only its own share (see
``core.cycles.LoopCounters``): batches its senders sent into the loop,
batches its members received (processed, with what they produced already
sent), end-of-stream markers still expected from outside, input waiting.
No worker sees a batch on the wire between two others, so an empty inbox
proves nothing. Instead the workers of an attempt answer rounds through
ZooKeeper (the four-counter method: two waves of counters)::

    /jobs/<job>/loops/attempt-<n>/round            {"round": r}                 the detector asks
    /jobs/<job>/loops/attempt-<n>/counters/<id>    {"round": r, "loops": {...}} each worker answers
    /jobs/<job>/loops/attempt-<n>/quiet            {"loops": [...], "round": r} the loops found quiet

The attempt's first worker runs the detector. It asks for round r only once
every worker has answered r - 1, and a worker reads its counters only when it
sees round r, so every snapshot of a round is taken after every snapshot of
the round before. A loop is quiet when two such rounds show every worker's
counters unchanged, the sent total equal to the received total, no
end-of-stream still expected and nothing busy. That suffices: counters only
move one way, so a worker whose counters are the same in both snapshots sent
and received nothing between them; at any moment between the two rounds the
totals were the ones read, so every batch ever sent had been processed, and
with no outside sender left nothing can start the loop again. A batch on the
wire shows as sent and not received, and keeps the loop running. There is
no timeout: a loop busy for an hour runs for an hour.

Then every worker closes its tracker of that loop (``CycleTracker.close``):
the loop's channels end and its members finish and end downstream; what a
member's ``finish`` still sends round the loop is dropped and counted, as in
one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import anyio

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.paths import LoopAnswer, LoopQuiet, LoopRound
from streamlet.backends.cluster.tree.store import ClusterStore, Found, riding_out
from streamlet.core.runtime.cycles import CycleTracker
from streamlet.core.runtime.quiescence import MAX_ROUND_PAUSE, ROUND_PAUSE, LoopView, looks_quiet, loop_views, quiet
from streamlet.errors import NodeExists


@dataclass(frozen=True, slots=True)
class LoopAttempt:
    """The attempt whose loops are watched, and this worker's place in it."""

    job: str
    attempt: int
    worker: str
    workers: list[str]  # every worker of the attempt, sorted: the first runs the detector


class LoopDetector:
    """The rounds, run by the attempt's first worker: ask, collect every answer, decide, publish."""

    def __init__(self, store: ClusterStore, attempt: LoopAttempt) -> None:
        self.store = store
        self.attempt = attempt
        self.round = 0
        self.quiet_loops: list[str] = []  # loops found quiet, in the order they were
        self._published: list[str] = []  # ... of which the workers have been told
        self._previous: dict[str, LoopView] = {}
        self._looked_quiet = False
        self._asking = _OwnNode(store, paths.loop_round(attempt.job, attempt.attempt))
        self._deciding = _OwnNode(store, paths.loop_quiet(attempt.job, attempt.attempt))

    async def run(self) -> None:
        """Rounds until every loop is quiet: paced while a loop runs, a confirming round at once."""
        pause = ROUND_PAUSE
        while not await riding_out(self.next_round):
            if self._looked_quiet:
                pause = ROUND_PAUSE  # about to end: confirm now, and look often should it go on
                continue
            await anyio.sleep(pause)
            pause = min(2 * pause, MAX_ROUND_PAUSE)

    async def next_round(self) -> bool:
        """Run one round; ``True`` once every loop is quiet and published so."""
        self.round += 1
        # a round interrupted by a lost session is simply skipped: the next one still follows the last complete one
        round_: LoopRound = {"round": self.round}
        await self._asking.write(round_)
        answers = {worker: await self._answer_of(worker) for worker in self.attempt.workers}
        views = loop_views(answers)
        running = {loop: view for loop, view in views.items() if loop not in self.quiet_loops}
        self.quiet_loops += sorted(loop for loop, view in running.items() if quiet(self._previous.get(loop), view))
        self._looked_quiet = any(looks_quiet(view) for view in running.values())
        self._previous = views
        if self._published != self.quiet_loops:  # also a decision whose publishing a lost session cut short
            decision: LoopQuiet = {"loops": list(self.quiet_loops), "round": self.round}
            await self._deciding.write(decision)
            self._published = list(self.quiet_loops)
        return set(self._published) >= set(views)

    async def _answer_of(self, worker: str) -> LoopAnswer:
        """``worker``'s answer to this round, once it is there (a watch, no polling)."""
        path = paths.loop_counters(self.attempt.job, self.attempt.attempt, worker)
        found = await self.store.get(path)
        while found is None or int(found.data["round"]) < self.round:
            data, version = await self.store.wait_changed(path, None if found is None else found.version)
            found = None if version is None else Found(data, version)
        answer: LoopAnswer = found.data
        return answer


class ClusterQuiescence:
    """A worker's part in ending its attempt's loops (core's ``Quiescence``).

    It answers every round with its trackers' counters, closes each tracker
    once the detector finds its loop quiet, and on the attempt's first
    worker (or with ``detect=True``) runs the detector too.
    """

    def __init__(self, store: ClusterStore, attempt: LoopAttempt, *, detect: bool | None = None) -> None:
        self.store = store
        self.attempt = attempt
        self.detect = attempt.worker == attempt.workers[0] if detect is None else detect
        self._answering = _OwnNode(store, paths.loop_counters(attempt.job, attempt.attempt, attempt.worker))

    async def run(self, trackers: Sequence[CycleTracker]) -> None:
        """Answer rounds until every loop here is closed."""
        by_name = {tracker.name: tracker for tracker in trackers}
        async with anyio.create_task_group() as group:
            group.start_soon(self._answer_rounds, by_name)
            if self.detect:
                group.start_soon(LoopDetector(self.store, self.attempt).run)
            await self._close_when_quiet(by_name)
            group.cancel_scope.cancel()  # every loop is quiet: the detector has nothing left to decide

    async def _answer_rounds(self, trackers: Mapping[str, CycleTracker]) -> None:
        path = paths.loop_round(self.attempt.job, self.attempt.attempt)
        version: int | None = None
        while True:
            data, version = await riding_out(self.store.wait_changed, path, version)
            if data is not None:  # a watch may fold several rounds into one: answering the last is enough
                await riding_out(self._answer, int(data["round"]), trackers)

    async def _answer(self, round_: int, trackers: Mapping[str, CycleTracker]) -> None:
        # read after seeing the round, all in one step of the event loop: one consistent snapshot of this worker
        loops = {name: asdict(tracker.counters()) for name, tracker in trackers.items()}
        answer: LoopAnswer = {"round": round_, "loops": loops}
        await self._answering.write(answer)

    async def _close_when_quiet(self, trackers: Mapping[str, CycleTracker]) -> None:
        path = paths.loop_quiet(self.attempt.job, self.attempt.attempt)
        version: int | None = None
        while not all(tracker.closed for tracker in trackers.values()):
            data, version = await riding_out(self.store.wait_changed, path, version)
            for name in [] if data is None else data["loops"]:
                if name in trackers:
                    trackers[name].close()


class _OwnNode:
    """A node only this process writes: created by the first write, set by the others."""

    def __init__(self, store: ClusterStore, path: str) -> None:
        self.store = store
        self.path = path
        self._exists = False

    async def write(self, data: Any) -> None:
        """Hold ``data``."""
        if not self._exists:
            try:
                await self.store.create(self.path, data)
                self._exists = True
                return
            except NodeExists:
                self._exists = True  # an earlier write got through before its session dropped
        await self.store.set(self.path, data)
