"""Ending a loop whose instances run in several worker processes: the cluster's detector, over the control channel.

The same four-counter method as on a cluster
(``streamlet.backends.cluster.worker.termination``, whose pure functions decide),
with the parent in ZooKeeper's place: the parent asks every process for
round ``r`` (``round``) only once each has answered ``r - 1``; a process
reads its trackers' counters when it sees the round, in one step of its
event loop, and answers (``counters``); a loop whose counters are the same
in two successive rounds, balanced and idle, is quiet for good, and the
parent tells every process to close it (``quiet``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

import anyio

from streamlet.core.runtime.cycles import CycleTracker
from streamlet.core.runtime.quiescence import MAX_ROUND_PAUSE, ROUND_PAUSE, looks_quiet, loop_views, quiet

Send = Callable[[dict[str, Any]], Awaitable[None]]


class LoopAnswers:
    """A worker process's part (core's ``Quiescence``): answer rounds, close the loops found quiet."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.trackers: dict[str, CycleTracker] | None = None  # once the job has built them
        self.asked: int | None = None  # a round asked before then
        self.all_closed = anyio.Event()

    async def run(self, trackers: Sequence[CycleTracker]) -> None:
        """Answer rounds until every loop here is closed."""
        self.trackers = {tracker.name: tracker for tracker in trackers}
        if self.asked is not None:
            await self.ask(self.asked)
        await self.all_closed.wait()

    async def ask(self, round_: int) -> None:
        """The parent asks for round ``round_``: answer now, or once the trackers are there."""
        if self.trackers is None:
            self.asked = round_
            return
        # read after seeing the round, all in one step of the event loop: one consistent snapshot
        loops = {name: asdict(tracker.counters()) for name, tracker in self.trackers.items()}
        await self.send({"kind": "counters", "round": round_, "loops": loops})

    def close(self, names: list[str]) -> None:
        """The parent found the loops ``names`` quiet everywhere."""
        assert self.trackers is not None  # quiet needs every process's answers, so the trackers are there
        for name in names:
            if name in self.trackers:
                self.trackers[name].close()
        if all(tracker.closed for tracker in self.trackers.values()):
            self.all_closed.set()


class LoopRounds:
    """The parent's detector: rounds over every process until every loop is quiet."""

    def __init__(self, send_all: Send, processes: int) -> None:
        self.send_all = send_all
        self.processes = processes
        self.round = 0
        self.answers: dict[str, Any] = {}
        self.answered = asyncio.Event()

    def take(self, process: int, message: dict[str, Any]) -> None:
        """A process's ``counters`` answer."""
        if int(message["round"]) == self.round:
            self.answers[str(process)] = message
            if len(self.answers) == self.processes:
                self.answered.set()

    async def run(self) -> None:
        """Rounds until every loop is quiet: paced while a loop runs, a confirming round at once."""
        found: list[str] = []
        previous: dict[str, Any] = {}
        pause = ROUND_PAUSE
        while True:
            self.round += 1
            self.answers, self.answered = {}, asyncio.Event()
            await self.send_all({"kind": "round", "round": self.round})
            await self.answered.wait()
            views = loop_views(self.answers)
            running = {loop: view for loop, view in views.items() if loop not in found}
            newly = sorted(loop for loop, view in running.items() if quiet(previous.get(loop), view))
            if newly:
                found += newly
                await self.send_all({"kind": "quiet", "loops": newly})
            if set(found) >= set(views):
                return
            previous = views
            if any(looks_quiet(view) for loop, view in running.items() if loop not in newly):
                pause = ROUND_PAUSE  # about to end: confirm now, and look often should it go on
                continue
            await asyncio.sleep(pause)
            pause = min(2 * pause, MAX_ROUND_PAUSE)
