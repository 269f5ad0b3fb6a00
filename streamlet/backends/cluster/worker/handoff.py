"""State handed between workers during a live reconfiguration, over the authenticated data plane.

The core's reconfiguration sends each importer a part (a task snapshot of the
keys moving to it) from every exporter (``core.runtime.reconfiguration``).
Between instances of one worker the part is passed in memory; to an instance
on another worker it goes as a channel of its own, ``<run>/handoff/<id>/<from>/<to>``:
the part packed exactly (tuples stay tuples, never pickle), sent as a blob
(``transport.blobs``: chunks under the frame limit, then end-of-stream;
once, whole and in order, across reconnects). The receiving worker
registers the channel while it wires its part, before any worker starts
sending.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.runtime.channel import UNBOUNDED, Inbox
from streamlet.core.runtime.reconfiguration import LocalHandoff, ReconfigurationPlan
from streamlet.errors import ReconfigurationError
from streamlet.transport.blobs import receive_blob, send_blob
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient


class ClusterHandoff:
    """Parts between instances of one task spread over workers (the core's ``StateHandoff``)."""

    def __init__(
        self,
        run: str,
        plan: ReconfigurationPlan,
        me: str,
        worker_of: Callable[[int], str],
        addresses: dict[str, tuple[str, int]],
        server: DataServer,
        client: TcpClient,
        source_of: Callable[[int], str] | None = None,
    ) -> None:
        self.run = run
        self.plan = plan
        self.me = me
        self.worker_of = worker_of  # the worker of each instance index of the task, in the new layout
        # ... and in the old one (they differ for a relocated instance: its old incarnation exports)
        self.source_of = source_of or worker_of
        self.addresses = addresses
        self.server = server
        self.client = client
        self.local = LocalHandoff()
        self._inlets: dict[tuple[int, int], tuple[Inbox, int]] = {}

    def channel_name(self, source: int, target: int) -> str:
        """The channel a part from instance ``source`` to instance ``target`` travels on."""
        return f"{self.run}/handoff/{self.plan.id}/{source}/{target}"

    def register(self) -> None:
        """Serve a channel for every part coming to a local importer from another worker (before any is sent)."""
        for target in self.plan.importers:
            if self.worker_of(target) != self.me:
                continue
            for source in self.plan.sources_of(target):
                if self.source_of(source) != self.me:
                    inbox = Inbox(UNBOUNDED)
                    channel = inbox.add_channel(0, sender=(self.plan.task, source))
                    self.server.register(self.channel_name(source, target), inbox, channel)
                    self._inlets[source, target] = (inbox, channel)

    async def send(self, source: int, target: int, part: Any) -> None:
        """``part`` to ``target``: in memory on this worker, else over TCP in chunks, then the end."""
        worker = self.worker_of(target)
        if worker == self.me:
            await self.local.send(source, target, part)
            return
        data = pack_exact(part, f"the state task '{self.plan.task}' instance {source} hands over")
        channel = self.client.channel(self.addresses[worker], self.channel_name(source, target), peer=worker)
        await send_blob(channel, data)

    async def receive(self, target: int, sources: list[int]) -> list[Any]:
        """Every part for ``target``, from this worker's exporters and the others'."""
        here = [source for source in sources if self.source_of(source) == self.me]
        parts = dict(zip(here, await self.local.receive(target, here), strict=True))
        for source in sources:
            if source not in parts:
                parts[source] = await self._remote_part(source, target)
        return [parts[source] for source in sources]

    async def _remote_part(self, source: int, target: int) -> Any:
        try:
            inbox, channel = self._inlets[source, target]
        except KeyError:
            raise ReconfigurationError(
                f"task '{self.plan.task}' instance {target} expects state from instance {source}, "
                "but no channel for it was registered here"
            ) from None
        return unpackb(await receive_blob(inbox, channel))
