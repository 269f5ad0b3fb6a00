"""Ending a loop: a cycle's own inputs never end by themselves.

Inside a strongly connected part of the graph no instance sends
end-of-stream to another (each waits for the other). Instead a tracker
counts end-of-stream still expected from outside the loop and batches in
flight towards loop members; when both reach zero the loop is quiet for good,
and the tracker ends every in-loop channel with a ``CycleEnd`` marker.
"""

from __future__ import annotations

from streamlet.core.channel import Inbox
from streamlet.core.record import CYCLE_END
from streamlet.core.routing import FlowCounter


class CycleTracker:
    """Quiescence detection for one strongly connected part of the topology."""

    def __init__(self, members: set[str]) -> None:
        self.members = members
        self.flow = FlowCounter()  # routes into members count batches here
        self.external_open = 0  # end-of-stream markers still expected from outside
        self._in_loop_channels: list[tuple[Inbox, int]] = []

    def add_in_loop_channel(self, inbox: Inbox, channel: int) -> None:
        """``channel`` of ``inbox`` comes from a sender inside the loop: the tracker ends it."""
        self._in_loop_channels.append((inbox, channel))

    def external_ended(self) -> None:
        """A sender outside the loop ended."""
        self.external_open -= 1
        self.check()

    def batches_done(self, count: int) -> None:
        """A member finished ``count`` batches and flushed what they produced."""
        self.flow.pending -= count
        self.check()

    def check(self) -> None:
        """End the loop's inputs when nothing can arrive any more."""
        flow = self.flow
        if not flow.closed and flow.pending == 0 and self.external_open == 0:
            flow.closed = True
            for inbox, channel in self._in_loop_channels:
                inbox.put_nowait(channel, CYCLE_END)
