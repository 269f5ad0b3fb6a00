"""In-process channel: hands the batch object itself to the receiver's inbox."""

from __future__ import annotations

from streamlet.core.model.record import Item
from streamlet.core.runtime.channel import Inbox


class LocalChannel:
    """A :class:`~streamlet.core.runtime.channel.Channel` to an instance in this process.

    No copy and no serialisation: the receiver gets the very list that was
    sent, so batches are read-only once sent.
    """

    __slots__ = ("_inbox", "_port")

    def __init__(self, inbox: Inbox, port: int) -> None:
        self._inbox = inbox
        self._port = port

    async def send(self, item: Item) -> None:
        """Put ``item`` into the receiver's inbox, waiting while it is full."""
        await self._inbox.put(self._port, item)

    async def aclose(self) -> None:
        """Nothing to release in memory."""
