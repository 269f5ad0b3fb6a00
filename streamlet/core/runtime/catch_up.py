"""Which of a receiver's inputs have caught up with their sources (``CAUGHT_UP`` markers).

A source instance sends ``CAUGHT_UP`` once its reader has read what its source held when it started
(``SourceReader.caught_up``); a receiver passes it on once every channel it reads has delivered it or ended,
so it reaches each node once everything upstream has caught up, after every record read before. A
``table_join(bootstrap=True)`` holds its left records until its ``RIGHT`` port has caught up.

Back edges of loops do not count (a loop's own records must not hold its head back), as for watermarks.
"""

from __future__ import annotations


class InputCatchUp:
    """Per incoming channel whether it has caught up (or ended); per port whether all of its channels have."""

    __slots__ = ("forwarded", "pending", "ports")

    def __init__(self, ports: list[int], back_channels: set[int]) -> None:
        self.ports = list(ports)  # the input port of each channel
        self.pending = [channel not in back_channels for channel in range(len(ports))]
        self.forwarded = False  # this receiver passed CAUGHT_UP on

    def add_channel(self, port: int) -> None:
        """A channel wired in while running: its sender says ``CAUGHT_UP`` first if its own inputs had."""
        self.ports.append(port)
        self.pending.append(True)

    def arrived(self, channel: int) -> tuple[int | None, bool]:
        """``channel`` caught up or ended: the port that has thereby caught up whole (if one did), and whether
        every input now has, for the first time (pass ``CAUGHT_UP`` on)."""
        if not self.pending[channel]:
            return None, False
        self.pending[channel] = False
        port = self.ports[channel]
        whole = not any(waiting and p == port for waiting, p in zip(self.pending, self.ports, strict=True))
        first = not self.forwarded and not any(self.pending)
        if first:
            self.forwarded = True
        return (port if whole else None), first

    def port_caught_up(self, port: int) -> bool:
        """Every channel into ``port`` has caught up or ended."""
        return not any(waiting and p == port for waiting, p in zip(self.pending, self.ports, strict=True))
