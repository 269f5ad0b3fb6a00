"""The cluster's coordination seam: a small tree of versioned JSON nodes.

:class:`ClusterStore` is everything the leader, the workers and the clients
need from ZooKeeper: read, create, versioned set, delete, children, watches
and an all-or-nothing transaction. :class:`~streamlet.backends.cluster.tree.zk.ZkStore`
implements it with kazoo; :class:`MemoryClusterStore` implements it in one
event loop, so the cluster's logic is unit-tested without a server or a
sleep. Paths are relative to the cluster's root (see ``paths``).

Sessions follow ZooKeeper's rules. ``"suspended"``: the connection dropped
but the session may live (decide nothing). ``"lost"``: the session expired
and its ephemeral nodes are gone (register again once ``"connected"``).

Example:
    >>> import anyio
    >>> async def demo() -> object:
    ...     store = MemoryClusterStore(MemoryTree(), "demo")
    ...     await store.create("/jobs/wc/state", {"state": "SUBMITTED"})
    ...     return await store.get("/jobs/wc/state")
    >>> anyio.run(demo)
    ({'state': 'SUBMITTED'}, Version(0, mzxid=3))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, overload

import anyio

from streamlet.errors import CoordinationError, NodeExists, NotAuthorized, VersionConflict

T = TypeVar("T")
D = TypeVar("D")  # what a node holds


class NodePath(str, Generic[D]):
    """A path whose node holds a ``D`` (one of the node shapes of ``paths``): the store's :meth:`get
    <ClusterStore.get>` on it returns its data typed, so a read names its fields, never positions."""

    __slots__ = ()


class Found(NamedTuple, Generic[D]):
    """A node as read: its data and its version (what a conditional write or a wait starts from)."""

    data: D
    version: Version


class Version(int):
    """A node's data version (the token :class:`SetData` and :class:`Check` take), carrying ``mzxid``.

    It is the int ZooKeeper's ``Stat.version`` is: it compares, hashes, formats and serialises as that int.
    ``mzxid`` is the id of the write that made this version (ZooKeeper's ``Stat.mzxid``). The data version
    alone cannot tell a node deleted and created again (at version 0 again) from the one a reader saw;
    the modification id can, so :meth:`ClusterStore.wait_changed` compares it when it is given one.

    Example:
        >>> Version(0, mzxid=7) == 0, str(Version(0, mzxid=7))
        (True, '0')
    """

    mzxid: int

    def __new__(cls, version: int, mzxid: int) -> Version:
        made = super().__new__(cls, version)
        made.mzxid = mzxid
        return made

    def __getnewargs__(self) -> tuple[int, int]:  # type: ignore[override]  # pickle: keep the mzxid
        return int(self), self.mzxid

    def __repr__(self) -> str:
        return f"Version({int(self)}, mzxid={self.mzxid})"

    __str__ = int.__repr__  # in text (paths, messages) it is the plain number


def moved(held: int | None, found: int | None) -> bool:
    """Whether a node now at ``found`` changed since a reader saw it at ``held`` (``None``: absent).

    With a :class:`Version` held, any write since shows as a new ``mzxid``, a node re-created at the same
    data version included. A plain int held (no ``mzxid``) compares data versions only, as it always did.
    """
    if held is None or found is None:
        return (held is None) != (found is None)
    if isinstance(held, Version) and isinstance(found, Version):
        return held.mzxid != found.mzxid
    return int(held) != int(found)


@dataclass(frozen=True, slots=True)
class Check:
    """Transaction step: ``path`` is still at ``version``."""

    path: str
    version: int


@dataclass(frozen=True, slots=True)
class Create:
    """Transaction step: create ``path`` holding ``data`` (ephemeral: it goes with the session)."""

    path: str
    data: Any
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class SetData:
    """Transaction step: write ``data`` to ``path`` (only at ``version`` unless it is -1)."""

    path: str
    data: Any
    version: int = -1


@dataclass(frozen=True, slots=True)
class Delete:
    """Transaction step: remove ``path`` (only at ``version`` unless it is -1)."""

    path: str
    version: int = -1


Op = Check | Create | SetData | Delete


class ClusterStore(Protocol):
    """Versioned JSON nodes under one cluster's root, with watches and transactions."""

    cluster: str
    state: str

    def on_state(self, callback: Callable[[str], None]) -> None:
        """Call ``callback("suspended" | "lost" | "connected")`` on the loop when the session changes."""

    @overload
    async def get(self, path: NodePath[D]) -> Found[D] | None: ...

    @overload
    async def get(self, path: str) -> Found[Any] | None: ...

    async def get(self, path: str) -> Found[Any] | None:
        """A node's data and version, or ``None`` when it does not exist."""

    async def create(self, path: str, data: Any, *, ephemeral: bool = False, sequence: bool = False) -> str:
        """Create a node (and missing parents); returns its path. Raises :class:`NodeExists`."""

    async def set(self, path: str, data: Any, version: int = -1) -> Version:
        """Write ``data``; with ``version`` only if the node is still at it. Returns the new version."""

    async def delete(self, path: str, *, recursive: bool = False) -> None:
        """Remove a node (no error when it is already gone)."""

    async def children(self, path: str) -> list[str]:
        """Names of a node's children, sorted (empty when the node does not exist)."""

    async def ensure(self, path: str) -> None:
        """Create ``path`` and its parents if missing."""

    async def commit(self, ops: Sequence[Op]) -> bool:
        """Apply every step or none; ``False`` when a check or a version did not hold."""

    async def wait_changed(self, path: str, version: int | None) -> tuple[Any, Version | None]:
        """``(data, version)`` of ``path`` once it changed since ``version`` (``None``: absent).

        Pass the :class:`Version` the store handed out: then any write since wakes the waiter, a node
        deleted and created again at the same data version included (see :func:`moved`). Several changes
        may show as one, as with ZooKeeper's one-shot watches.
        """

    async def wait_gone(self, path: str) -> None:
        """Return once ``path`` does not exist."""

    async def watch_children(self, path: str) -> asyncio.Event:
        """An event set every time the children of ``path`` change; the caller clears it."""

    def write_from_thread(self, path: str, data: Any) -> None:
        """From a thread other than the loop's, without the loop: write ``data`` to ``path``, creating it as
        an ephemeral node of this session when missing (a worker's heartbeat, which must not wait for a
        loop that user code holds). Raises :class:`CoordinationError` when the store cannot be reached."""


async def write_fenced(store: ClusterStore, path: str, data: Any, version: int | None, fence: tuple[str, int]) -> bool:
    """Write ``data`` (create it when ``version`` is ``None``) only while ``fence`` (path, version) holds."""
    write: Op = Create(path, data) if version is None else SetData(path, data, version)
    return await store.commit([Check(*fence), write])


async def riding_out(call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``call(*args)``, retried while the session is suspended or being re-established.

    A definitive answer (the node exists, its version moved on, no permission) is raised at once: retrying
    would get the same answer forever. A worker whose session is gone for good is replaced by a newer
    attempt, which cancels this one.
    """
    while True:
        try:
            return await call(*args)
        except (NodeExists, VersionConflict, NotAuthorized):
            raise
        except CoordinationError:
            await anyio.sleep(0.2)


async def read_all(store: ClusterStore, path: str) -> dict[str, Any]:
    """Every child of ``path`` with its data (children that vanish meanwhile are left out)."""
    found = {}
    for name in await store.children(path):
        entry = await store.get(f"{path}/{name}")
        if entry is not None:
            found[name] = entry.data
    return found


# -- in memory ------------------------------------------------------------------------


@dataclass
class _Node:
    raw: bytes
    mzxid: int  # the tree's write that made this version
    version: int = 0
    owner: MemoryClusterStore | None = None  # the session of an ephemeral node
    sequence: int = 0  # next suffix for sequential children


@dataclass
class MemoryTree:
    """The shared tree behind any number of :class:`MemoryClusterStore` sessions (one event loop)."""

    nodes: dict[str, _Node] = field(default_factory=lambda: {"": _Node(b"", 0)})
    zxid: int = 0  # the last write's id, bumped per write (a transaction is one write), like ZooKeeper's
    _watchers: dict[str, list[asyncio.Event]] = field(default_factory=dict)  # one-shot, like ZooKeeper's
    _child_watchers: dict[str, list[asyncio.Event]] = field(default_factory=dict)  # kept, like ChildrenWatch
    _transaction: int | None = None  # the zxid every step of the transaction under way shares
    #: Held while a write ids itself: a heartbeat thread writes too (``write_from_thread``).
    lock: threading.RLock = field(default_factory=threading.RLock)
    loop: asyncio.AbstractEventLoop | None = None  # the loop its sessions run on (seen at their first call)

    def next_zxid(self) -> int:
        """The id of a new write (the transaction's, while one is applied)."""
        if self._transaction is not None:
            return self._transaction
        with self.lock:
            self.zxid += 1
            return self.zxid

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Every write inside is one write: one zxid for all its steps, as in ZooKeeper's multi."""
        self._transaction = self.next_zxid()
        try:
            yield
        finally:
            self._transaction = None

    def touched(self, path: str) -> None:
        """Wake whoever watches ``path`` (data) or its parent (children)."""
        for watched in (path, _parent(path) + "/*"):
            for event in self._watchers.pop(watched, []):
                event.set()
        for event in self._child_watchers.get(_parent(path), []):
            event.set()

    def watch(self, key: str) -> asyncio.Event:
        """An event set at the next change of ``key`` (a path, or ``parent/*`` for its children)."""
        event = asyncio.Event()
        self._watchers.setdefault(key, []).append(event)
        return event


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


class MemoryClusterStore:
    """One session on a :class:`MemoryTree`; ``expire()`` and ``suspend()`` simulate ZooKeeper's faults."""

    def __init__(self, tree: MemoryTree, cluster: str = "memory") -> None:
        self.tree = tree
        self.cluster = cluster
        self.state = "connected"
        self._listeners: list[Callable[[str], None]] = []

    async def __aenter__(self) -> MemoryClusterStore:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End the session: its ephemeral nodes go."""
        self._drop_ephemerals()
        self.state = "closed"

    def on_state(self, callback: Callable[[str], None]) -> None:
        """Call ``callback`` when the session state changes."""
        self._listeners.append(callback)

    def _changed(self, state: str) -> None:
        self.state = state
        for callback in list(self._listeners):
            callback(state)

    def suspend(self) -> None:
        """The connection drops: every call fails until :meth:`resume`."""
        self._changed("suspended")

    def resume(self) -> None:
        """The connection is back within the session."""
        self._changed("connected")

    def expire(self) -> None:
        """The session expires: ephemeral nodes go, listeners hear "lost", then "connected" (a new session)."""
        self._drop_ephemerals()
        self._changed("lost")
        self._changed("connected")

    def _drop_ephemerals(self) -> None:
        for path in [p for p, node in self.tree.nodes.items() if node.owner is self]:
            del self.tree.nodes[path]
            self.tree.next_zxid()
            self.tree.touched(path)

    def _usable(self) -> dict[str, _Node]:
        if self.state != "connected":
            raise CoordinationError(f"the store session is {self.state}")
        if self.tree.loop is None:
            self.tree.loop = asyncio.get_running_loop()
        return self.tree.nodes

    def write_from_thread(self, path: str, data: Any) -> None:
        """See :meth:`ClusterStore.write_from_thread`: the node's data and version changed under the tree's
        lock, the watchers woken on the loop (``call_soon_threadsafe``), a missing node made there too."""
        tree = self.tree
        if self.state != "connected" or tree.loop is None:
            raise CoordinationError(f"the store session is {self.state}")
        with tree.lock:
            node = tree.nodes.get(path)
            if node is not None:
                node.raw, node.version, node.mzxid = _dump(data), node.version + 1, tree.next_zxid()
        if node is None:
            tree.loop.call_soon_threadsafe(self._create_now, path, data)
        else:
            tree.loop.call_soon_threadsafe(tree.touched, path)

    def _create_now(self, path: str, data: Any) -> None:
        if self.state == "connected" and path not in self.tree.nodes and _parent(path) in self.tree.nodes:
            self.tree.nodes[path] = _Node(_dump(data), self.tree.next_zxid(), owner=self)
            self.tree.touched(path)

    # -- nodes ----------------------------------------------------------------------

    async def get(self, path: str) -> Found[Any] | None:
        node = self._usable().get(path)
        return None if node is None else Found(_load(node.raw), Version(node.version, node.mzxid))

    async def create(self, path: str, data: Any, *, ephemeral: bool = False, sequence: bool = False) -> str:
        nodes = self._usable()
        await self.ensure(_parent(path))
        if sequence:
            parent = nodes[_parent(path)]
            path, parent.sequence = f"{path}{parent.sequence:010d}", parent.sequence + 1
        if path in nodes:
            raise NodeExists(f"node exists: {path}")
        if nodes[_parent(path)].owner is not None:
            raise CoordinationError(f"an ephemeral node cannot have children: {path}")
        nodes[path] = _Node(_dump(data), self.tree.next_zxid(), owner=self if ephemeral else None)
        self.tree.touched(path)
        return path

    async def set(self, path: str, data: Any, version: int = -1) -> Version:
        node = self._existing(path, version)
        node.raw, node.version, node.mzxid = _dump(data), node.version + 1, self.tree.next_zxid()
        self.tree.touched(path)
        return Version(node.version, node.mzxid)

    def _existing(self, path: str, version: int) -> _Node:
        node = self._usable().get(path)
        if node is None:
            raise CoordinationError(f"no node {path}")
        if version != -1 and node.version != version:
            raise VersionConflict(f"{path} is at version {node.version}, not {version}")
        return node

    async def delete(self, path: str, *, recursive: bool = False) -> None:
        nodes = self._usable()
        below = [p for p in nodes if p.startswith(path + "/")]
        if below and not recursive:
            raise CoordinationError(f"node {path} has children")
        for gone in [*below, path]:
            if nodes.pop(gone, None) is not None:
                self.tree.next_zxid()
                self.tree.touched(gone)

    async def children(self, path: str) -> list[str]:
        prefix = path + "/"
        return sorted(p[len(prefix) :] for p in self._usable() if p.startswith(prefix) and "/" not in p[len(prefix) :])

    async def ensure(self, path: str) -> None:
        nodes = self._usable()
        parts = [part for part in path.split("/") if part]
        for depth in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:depth])
            if prefix not in nodes:
                nodes[prefix] = _Node(b"", self.tree.next_zxid())
                self.tree.touched(prefix)

    async def commit(self, ops: Sequence[Op]) -> bool:
        if not self._would_hold(ops):
            return False
        with self.tree.transaction():
            for op in ops:
                await self._apply(op)
        return True

    def _would_hold(self, ops: Sequence[Op]) -> bool:
        """Check the steps in order, each seeing the ones before it, as ZooKeeper's multi does."""
        nodes = self._usable()
        planned: dict[str, int | None] = {}  # path -> version after the steps so far (None: absent)

        def version(path: str) -> int | None:
            return planned[path] if path in planned else (nodes[path].version if path in nodes else None)

        for op in ops:
            current = version(op.path)
            if isinstance(op, Create):
                if current is not None or version(_parent(op.path)) is None:
                    return False
                planned[op.path] = 0
                continue
            if current is None or op.version not in (-1, current):
                return False
            if isinstance(op, SetData):
                planned[op.path] = current + 1
            elif isinstance(op, Delete):
                planned[op.path] = None
        return True

    async def _apply(self, op: Op) -> None:
        if isinstance(op, Create):
            await self.create(op.path, op.data, ephemeral=op.ephemeral)
        elif isinstance(op, SetData):
            await self.set(op.path, op.data)
        elif isinstance(op, Delete):
            await self.delete(op.path)

    # -- watches ----------------------------------------------------------------------

    async def wait_changed(self, path: str, version: int | None) -> tuple[Any, Version | None]:
        while True:
            changed = self.tree.watch(path)
            found = await self.get(path)
            current = None if found is None else found.version
            if moved(version, current):
                return (None if found is None else found.data), current
            await changed.wait()

    async def wait_gone(self, path: str) -> None:
        while path in self._usable():
            await self.tree.watch(path).wait()

    async def watch_children(self, path: str) -> asyncio.Event:
        await self.ensure(path)
        changed = asyncio.Event()
        self.tree._child_watchers.setdefault(path, []).append(changed)
        return changed


def _dump(data: Any) -> bytes:
    return json.dumps(data).encode()  # what ZooKeeper would hold: JSON or an error now, not later


def _load(raw: bytes) -> Any:
    return json.loads(raw) if raw else None
