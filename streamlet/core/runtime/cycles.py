"""Ending a loop: a cycle's own inputs never end by themselves.

Inside a strongly connected part of the graph no instance sends
end-of-stream to another (each waits for the other). Instead a tracker
counts end-of-stream still expected from outside the loop and batches in
flight towards loop members; when both reach zero the loop is quiet for good,
and the tracker ends every in-loop channel with a ``CycleEnd`` marker.

That decision needs every counter of the loop. In one process the tracker
has them all and decides alone, at once. When the loop's instances run in
several processes each tracker sees only its own process's share, so the
job is given a :class:`Quiescence` (a distributed termination detector, such
as the cluster's in ``backends/cluster/worker/termination.py``): the trackers then
only count and report :class:`LoopCounters`, and the quiescence closes each
one when its loop is quiet everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from streamlet.core.model.record import CYCLE_END
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.routing import FlowCounter
from streamlet.errors import TopologyError

if TYPE_CHECKING:
    from streamlet.core.model.topology import Topology


@dataclass(frozen=True, slots=True)
class LoopCounters:
    """One process's share of a loop, as a termination detector reads it.

    ``sent`` counts batches this process's senders put on channels into the
    loop's members (from inside the loop and from outside it); ``received``
    counts batches this process's members have processed, with what they
    produced already sent. Both only grow. ``external_open`` is the number of
    end-of-stream markers this process's members still expect from senders
    outside the loop (it only falls); ``busy`` says input waits in a member's
    inbox here.
    """

    sent: int
    received: int
    external_open: int
    busy: bool


class Quiescence(Protocol):
    """Decides when loops whose instances run in several processes are quiet for good."""

    async def run(self, trackers: Sequence[CycleTracker]) -> None:
        """Close each tracker (:meth:`CycleTracker.close`) once its loop is quiet everywhere; return when all are."""
        ...


class CycleTracker:
    """Quiescence detection for one strongly connected part of the topology.

    With a ``quiescence`` the tracker never decides by itself: other
    processes may still send into the loop, and only the quiescence, which
    sees every process's counters, closes it.
    """

    def __init__(self, members: set[str], quiescence: Quiescence | None = None) -> None:
        self.members = members
        self.quiescence = quiescence
        self.flow = FlowCounter()  # routes into members count batches here
        self.external_open = 0  # end-of-stream markers still expected from outside
        self.received = 0  # batches members here have finished (so batches sent = pending + received)
        self._in_loop_channels: list[tuple[Inbox, int]] = []
        self._inboxes: list[Inbox] = []  # of the members in this process

    @property
    def name(self) -> str:
        """The loop's name in every process: its first member by name (loops never share a member)."""
        return min(self.members)

    @property
    def closed(self) -> bool:
        """The loop has ended: its in-loop channels are ended and late sends are dropped."""
        return self.flow.closed

    def add_in_loop_channel(self, inbox: Inbox, channel: int) -> None:
        """``channel`` of ``inbox`` comes from a sender inside the loop: the tracker ends it."""
        self._in_loop_channels.append((inbox, channel))
        if not any(inbox is known for known in self._inboxes):
            self._inboxes.append(inbox)

    def external_ended(self) -> None:
        """A sender outside the loop ended."""
        self.external_open -= 1
        self.check()

    def batches_done(self, count: int) -> None:
        """A member finished ``count`` batches and flushed what they produced."""
        self.flow.pending -= count
        self.received += count
        self.check()

    def check(self) -> None:
        """End the loop's inputs when nothing can arrive any more."""
        if self.quiescence is not None:
            return  # another process may still send into the loop: the quiescence decides
        flow = self.flow
        if not flow.closed and flow.pending == 0 and self.external_open == 0:
            self.close()

    def close(self) -> None:
        """The loop is quiet for good: end every in-loop channel of this process's members."""
        if self.flow.closed:
            return
        self.flow.closed = True
        for inbox, channel in self._in_loop_channels:
            inbox.put_nowait(channel, CYCLE_END)

    def counters(self) -> LoopCounters:
        """This process's counters now (read in one step of the event loop, so they agree with each other)."""
        busy = any(inbox.depth() > 0 for inbox in self._inboxes)
        return LoopCounters(self.flow.pending + self.received, self.received, self.external_open, busy)


def refuse_cycles(topology: Topology, reason: str) -> None:
    """Raise a :class:`TopologyError` naming the edge that closes a loop, when ``topology`` has one."""
    back = sorted(topology.back_edges())
    if back:
        raise TopologyError(f"topology '{topology.name}': {reason} (back edge from '{back[0][0]}' into '{back[0][1]}')")


def refuse_checkpoints_with_cycles(topology: Topology) -> None:
    """Checkpoint barriers cannot align around a back edge: a loop and checkpoints do not go together yet."""
    refuse_cycles(topology, "checkpoints are not supported with cycles yet")
