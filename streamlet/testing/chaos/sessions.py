"""Store sessions of a simulation: each call travels to the store and back, and a session outlives a cut
only for its timeout.

:class:`SimSession` is a :class:`~streamlet.backends.cluster.tree.store.MemoryClusterStore`
session of one party whose every call first takes the network's seeded delay
(a transaction is one call: its steps apply together, as ZooKeeper's multi).
:meth:`SimSession.cut` is the party losing the store (a partition, a paused or
killed process): calls fail and listeners hear ``"suspended"``; the harness
expires the session after its timeout (:meth:`SimSession.expire_unseen`: the
server drops its ephemeral nodes; the party learns it only when it reaches the
store again, :meth:`SimSession.reconnect`, as a ZooKeeper client does).

:class:`TracingTree` is the tree they share, adding every write to the run's
trace.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamlet.backends.cluster.tree.store import Found, MemoryClusterStore, MemoryTree, Op, Version
from streamlet.testing.chaos.network import STORE, Network

_IN_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("streamlet_chaos_store_call", default=False)


SIGNATURE = re.compile(r'("export_signature": )"[0-9a-f]+"')


@dataclass
class Trace:
    """What happened, in order, as text lines; its hash names the run."""

    clock: Any  # a callable giving virtual time
    lines: list[str] = field(default_factory=list)
    digest: Any = field(default_factory=hashlib.sha256)
    keep: int = 400  # the last lines kept in full for a report; every line goes into the hash
    folder: str | None = None  # the run's temporary folder: shown as <run>, its name is no event

    def add(self, line: str) -> None:
        if self.folder is not None and self.folder in line:  # a savepoint's folder, and the signature over it
            line = SIGNATURE.sub(r'\1"<signed>"', line.replace(self.folder, "<run>"))
        entry = f"{self.clock():.6f} {line}"
        self.digest.update(entry.encode())
        self.digest.update(b"\n")
        self.lines.append(entry)
        if len(self.lines) > 2 * self.keep:
            del self.lines[: len(self.lines) - self.keep]

    def hash(self) -> str:
        """The hash of every line so far."""
        return str(self.digest.hexdigest())[:16]


@dataclass
class TracingTree(MemoryTree):
    """The shared tree, writing each change (path and what it now holds) to the trace, and telling a
    listener (the checker) about it."""

    trace: Trace | None = None
    listener: Any = None

    def touched(self, path: str) -> None:
        super().touched(path)
        node = self.nodes.get(path)
        if self.trace is not None:
            self.trace.add(f"zk {path} {node.raw.decode() if node is not None else '-'}")
        if self.listener is not None:
            self.listener(path, node.raw if node is not None else None)


class SimSession(MemoryClusterStore):
    """One party's session: delayed calls, cut and expired as the harness says (see the module)."""

    def __init__(self, tree: MemoryTree, cluster: str, network: Network, party: str) -> None:
        super().__init__(tree, cluster)
        self.network = network
        self.party = party
        self.expired_unseen = False
        self.hold_next_commit: Callable[[], None] | None = None  # a fault: stop the party mid-commit

    # -- faults -------------------------------------------------------------------------------------

    def cut(self) -> None:
        """The party cannot reach the store: calls fail; its listeners hear "suspended"."""
        if self.state == "connected":
            self.suspend()

    def expire_unseen(self) -> None:
        """The store gives up on the session: its ephemeral nodes go now; the party hears at reconnect."""
        if not self.expired_unseen and self.state != "closed":
            self.expired_unseen = True
            self._drop_ephemerals()

    def reconnect(self) -> None:
        """The party reaches the store again: the same session, or (expired meanwhile) a new one."""
        if self.state != "suspended":
            return
        if self.expired_unseen:
            self.expired_unseen = False
            self._changed("lost")
        self._changed("connected")

    # -- every call travels ------------------------------------------------------------------------

    async def _travel(self) -> contextvars.Token[bool] | None:
        if _IN_CALL.get():
            return None  # a step of a call under way (a transaction's, a create's parents)
        await asyncio.sleep(self.network.chunk_delay(self.party, STORE))
        return _IN_CALL.set(True)

    @staticmethod
    def _arrived(token: contextvars.Token[bool] | None) -> None:
        if token is not None:
            _IN_CALL.reset(token)

    async def get(self, path: str) -> Found[Any] | None:
        token = await self._travel()
        try:
            return await super().get(path)
        finally:
            self._arrived(token)

    async def create(self, path: str, data: Any, *, ephemeral: bool = False, sequence: bool = False) -> str:
        token = await self._travel()
        try:
            return await super().create(path, data, ephemeral=ephemeral, sequence=sequence)
        finally:
            self._arrived(token)

    async def set(self, path: str, data: Any, version: int = -1) -> Version:
        token = await self._travel()
        try:
            return await super().set(path, data, version)
        finally:
            self._arrived(token)

    async def delete(self, path: str, *, recursive: bool = False) -> None:
        token = await self._travel()
        try:
            await super().delete(path, recursive=recursive)
        finally:
            self._arrived(token)

    async def children(self, path: str) -> list[str]:
        token = await self._travel()
        try:
            return await super().children(path)
        finally:
            self._arrived(token)

    async def ensure(self, path: str) -> None:
        token = await self._travel()
        try:
            await super().ensure(path)
        finally:
            self._arrived(token)

    async def commit(self, ops: Sequence[Op]) -> bool:
        token = await self._travel()
        try:
            if self.hold_next_commit is not None and token is not None:  # the request is on its way: the
                hold, self.hold_next_commit = self.hold_next_commit, None  # process stops (a long GC pause)
                hold()  # and its request reaches the store only when it goes on, maybe in a new session
                await asyncio.sleep(0)
            return await super().commit(ops)
        finally:
            self._arrived(token)
