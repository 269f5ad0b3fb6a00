"""The :class:`~streamlet.backends.cluster.tree.store.ClusterStore` on ZooKeeper, through kazoo, without blocking
the event loop.

kazoo is thread-based: every call here runs in a worker thread
(``anyio.to_thread``) and every kazoo callback is handed back to the event
loop with ``call_soon_threadsafe``. Node data is JSON (readable with
``zkCli``; never pickle). All paths are relative to the cluster's root
``/streamlet/<cluster>``.

Connection states follow ZooKeeper's rules. SUSPENDED means the connection
dropped but the session may live: callers pause decisions. LOST means the
session expired and its ephemeral nodes are gone: callers re-register and
re-check what they owned once kazoo has a new session (CONNECTED again).

Security: a store given the cluster secret authenticates with ZooKeeper's
digest scheme (user ``streamlet``, a password derived from the secret) and
creates every node with an ACL that gives that identity every permission.
The nodes of the cluster itself (``paths.world_readable``: the root, who
leads, the epoch, candidates, workers, the dashboard's URL) also give
everyone read access; every node holding job data (``/jobs`` and all below
it, the heartbeats under ``/loads``) gives nobody else anything (ZooKeeper
ACLs are not inherited, so each create passes its own). A store without the
secret can read the cluster's nodes; a read of job data is refused with
:class:`NotAuthorized` naming the node, and so is every write. A cluster
root that already carries another identity's ACL is refused at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import structlog

from streamlet.backends.cluster.tree.paths import world_readable
from streamlet.backends.cluster.tree.store import Check, Create, Delete, Found, Op, SetData, Version, moved
from streamlet.errors import CoordinationError, NodeExists, NotAuthorized, VersionConflict
from streamlet.transport.tls import TlsSettings

log = structlog.get_logger("streamlet")


def _kazoo() -> Any:
    try:
        import kazoo.client
        import kazoo.security
    except ImportError:  # pragma: no cover - depends on the install
        raise CoordinationError("the cluster backend needs kazoo: pip install 'streamlet[cluster]'") from None
    return kazoo


SESSION_TIMEOUT = 4.0  # seconds: how long ZooKeeper waits for a silent client before its ephemeral nodes go


@dataclass(frozen=True)
class StoreSettings:
    """Where a cluster's store is and how to open it: the one way every process and command gets a store.

    ``secret``: the cluster secret (job data is readable and every node writable with it only; ``None``: an
    anonymous reader of the cluster's own nodes). ``session_timeout``: see :data:`SESSION_TIMEOUT`.
    ``tls``: reach ZooKeeper's TLS client ports (``secureClientPort``) with this process's certificate,
    verified against the cluster CA (``None``: the plain client port, for 127.0.0.1).
    """

    hosts: str
    cluster: str
    secret: bytes | None = None
    session_timeout: float = SESSION_TIMEOUT
    tls: TlsSettings | None = None

    def open(self) -> ZkStore:
        """A store on these settings, not yet connected: ``async with settings.open() as store``."""
        return ZkStore(self.hosts, self.cluster, self.session_timeout, secret=self.secret, tls=self.tls)


def four_letter_tls(tls: TlsSettings | None) -> ssl.SSLContext | None:
    """The context to ask members for their mode with (``None``: plain, on 127.0.0.1): this process's
    certificate, the member's checked against the cluster CA, TLS 1.2 or later (ZooKeeper 3.8's TLS port
    speaks 1.2, as kazoo's sessions do)."""
    if tls is None:
        return None
    return tls.client_context(check_name=False, minimum=ssl.TLSVersion.TLSv1_2)  # names: processes, not addresses


class ZkStore:
    """The cluster's view of ZooKeeper: JSON nodes under ``/streamlet/<cluster>``.

    Example:
        >>> async def show(hosts):                                  # doctest: +SKIP
        ...     async with ZkStore(hosts, "demo", secret=b"...") as zk:
        ...         await zk.create("/workers/w1", {"host": "10.0.0.5"}, ephemeral=True)
    """

    def __init__(
        self,
        hosts: str,
        cluster: str,
        session_timeout: float = SESSION_TIMEOUT,
        secret: bytes | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.hosts = hosts
        self.secret = secret
        self.tls = tls
        self.cluster = cluster
        self.root = f"/streamlet/{cluster}"
        self.session_timeout = session_timeout
        self.state = "disconnected"
        self._listeners: list[Callable[[str], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None

    async def __aenter__(self) -> ZkStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Connect (with a session of ``session_timeout`` seconds)."""
        kazoo = _kazoo()
        self._loop = asyncio.get_running_loop()
        options: dict[str, Any] = {} if self.secret is None else {"auth_data": [("digest", credentials(self.secret))]}
        if self.tls is not None:  # the digest password then never crosses the network in clear
            options |= {"use_ssl": True, "ca": str(self.tls.ca), "certfile": str(self.tls.cert)}
            options |= {"keyfile": str(self.tls.key), "verify_certs": True, "check_hostname": False}
        self._client = kazoo.client.KazooClient(  # default_acl: anything created without ours is private
            hosts=self.hosts, timeout=self.session_timeout, default_acl=private_acl(self.secret), **options
        )
        self._client.add_listener(self._on_state)
        try:
            await anyio.to_thread.run_sync(lambda: self._client.start(timeout=max(10.0, self.session_timeout)))
        except Exception as exc:
            raise CoordinationError(f"cannot reach ZooKeeper at {self.hosts}: {exc}") from exc
        self.state = "connected"
        if self.secret is not None:
            await self._claim_root()

    async def _claim_root(self) -> None:
        """Create the cluster root with our ACL, or check that the existing one carries it."""
        kazoo = _kazoo()
        shared = [kazoo.security.make_acl("world", "anyone", read=True, create=True)]  # every cluster's parent
        await self._call(lambda: self._client.ensure_path(self.root.rsplit("/", 1)[0], acl=shared))
        await self.ensure("")
        acls, _ = await self._call(lambda: self._client.get_acls(self.root))
        ours = {(acl.id.scheme, acl.id.id) for acl in cluster_acl(self.secret) if acl.id.scheme == "digest"}
        if not ours <= {(acl.id.scheme, acl.id.id) for acl in acls}:
            found = ", ".join(f"{acl.id.scheme}:{acl.id.id}" for acl in acls)
            raise CoordinationError(
                f"the cluster root {self.root} carries another owner's ACL ({found}); "
                "refusing to use it (another secret made it, or it was created by hand)"
            )
        await self._seal_job_data()

    async def _seal_job_data(self) -> None:
        """Make private what an earlier version left world-readable under the root (ZooKeeper's data outlives
        a 'cluster down'): a top node that should be private but is not, and everything below it."""
        sealed: list[str] = await self._call(self._seal_open_tops)
        if sealed:
            log.info("made job data private", cluster=self.cluster, nodes=sealed)

    def _seal_open_tops(self) -> list[str]:
        """The top nodes (``/jobs``, ``/loads``) found open to anyone, sealed (kazoo's thread)."""
        sealed = []
        for name in self._client.get_children(self.root):
            top = f"/{name}"
            if not world_readable(top) and _open_to_anyone(self._client.get_acls(self.path(top))[0]):
                self._seal(self.path(top))
                sealed.append(top)
        return sealed

    def _seal(self, path: str) -> None:
        """The private ACL on ``path`` and below it, deepest first: an interrupted run leaves the top node
        open, so the next start finds it and seals the rest (kazoo's thread)."""
        kazoo = _kazoo()
        with contextlib.suppress(kazoo.exceptions.NoNodeError):  # gone meanwhile: nothing left to hide
            for child in self._client.get_children(path):
                self._seal(f"{path}/{child}")
            self._client.set_acls(path, private_acl(self.secret))

    async def aclose(self) -> None:
        """Close the session: our ephemeral nodes disappear at once."""
        self._listeners.clear()  # closing on purpose is not a lost session
        self._loop = None
        client, self._client = self._client, None
        if client is not None:
            await anyio.to_thread.run_sync(lambda: (client.stop(), client.close()))
        self.state = "closed"

    def on_state(self, callback: Callable[[str], None]) -> None:
        """Call ``callback("suspended" | "lost" | "connected")`` on the event loop when the state changes."""
        self._listeners.append(callback)

    def _on_state(self, state: Any) -> None:
        # kazoo's thread: only hand over to the loop here
        name = str(state).lower()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._changed, name)

    def _changed(self, name: str) -> None:
        previous, self.state = self.state, name
        if name != previous:
            log.info("zookeeper session", cluster=self.cluster, state=name)
        for callback in list(self._listeners):
            callback(name)

    # -- nodes --------------------------------------------------------------------

    def path(self, relative: str) -> str:
        """The absolute path of ``relative`` under the cluster root."""
        return self.root + relative

    def acl(self, relative: str) -> list[Any]:
        """The ACL a node at ``relative`` is created with: readable by anyone only when it holds no job data.

        Parents made on the way (``makepath``) get the same ACL: a private node's parents below the root are
        private too, as the rule is by subtree.
        """
        return cluster_acl(self.secret) if world_readable(relative) else private_acl(self.secret)

    async def _call(self, fn: Callable[[], Any], reading: str | None = None) -> Any:
        """``fn()`` in a thread, kazoo's errors as ours; ``reading``: the node ``fn`` reads (for a refusal)."""
        if self._client is None:
            raise CoordinationError("the coordinator is not connected")
        kazoo = _kazoo()
        try:
            return await anyio.to_thread.run_sync(fn)
        except kazoo.exceptions.NodeExistsError as exc:
            raise NodeExists(str(exc) or "node exists") from exc
        except kazoo.exceptions.BadVersionError as exc:
            raise VersionConflict(str(exc) or "version conflict") from exc
        except kazoo.exceptions.NoAuthError as exc:
            raise self._refused(reading) from exc
        except kazoo.exceptions.KazooException as exc:
            raise CoordinationError(f"{type(exc).__name__}: {exc}") from exc

    def _refused(self, reading: str | None) -> NotAuthorized:
        """What ZooKeeper's refusal means: a change (any write), or a read of ``reading``, a node of job data."""
        if reading is None:
            return NotAuthorized(
                f"ZooKeeper refused a change under {self.root}: this client does not hold the cluster secret"
            )
        return NotAuthorized(
            f"ZooKeeper refused to let this client read {self.path(reading)}: job data is readable only with "
            "the cluster secret (set STREAMLET_SECRET (hex), or run the command with the --state-dir where "
            "'streamlet cluster up' wrote it)"
        )

    async def ensure(self, relative: str) -> None:
        """Create ``relative`` (and its parents) if missing."""
        await self._call(lambda: self._client.ensure_path(self.path(relative), acl=self.acl(relative)))

    async def create(self, relative: str, data: Any, *, ephemeral: bool = False, sequence: bool = False) -> str:
        """Create a node holding ``data`` as JSON; returns its path relative to the root."""
        value = json.dumps(data).encode()
        acl = self.acl(relative)
        created: str = await self._call(
            lambda: self._client.create(
                self.path(relative), value, acl=acl, ephemeral=ephemeral, sequence=sequence, makepath=True
            )
        )
        return created[len(self.root) :]

    async def get(self, relative: str) -> Found[Any] | None:
        """A node's data and version, or ``None`` when it does not exist."""
        kazoo = _kazoo()

        def read() -> Found[Any] | None:
            try:
                raw, stat = self._client.get(self.path(relative))
            except kazoo.exceptions.NoNodeError:
                return None
            return Found(json.loads(raw) if raw else None, Version(stat.version, stat.mzxid))

        result: Found[Any] | None = await self._call(read, reading=relative)
        return result

    async def set(self, relative: str, data: Any, version: int = -1) -> Version:
        """Write ``data``; with ``version`` only if the node is still at it. Returns the new version."""
        value = json.dumps(data).encode()
        stat = await self._call(lambda: self._client.set(self.path(relative), value, version=version))
        return Version(stat.version, stat.mzxid)

    def write_from_thread(self, relative: str, data: Any) -> None:
        """See :meth:`ClusterStore.write_from_thread`: kazoo's client is safe to call from any thread, and its
        own thread keeps the session, so this goes through however long the loop is held."""
        client, kazoo = self._client, _kazoo()
        if client is None:
            raise CoordinationError("the coordinator is not connected")
        value, path = json.dumps(data).encode(), self.path(relative)
        try:
            try:
                client.set(path, value)
            except kazoo.exceptions.NoNodeError:
                client.create(path, value, acl=self.acl(relative), ephemeral=True, makepath=True)
        except kazoo.exceptions.KazooException as exc:
            raise CoordinationError(f"{type(exc).__name__}: {exc}") from exc

    async def children(self, relative: str) -> list[str]:
        """Names of a node's children (empty when the node does not exist)."""
        kazoo = _kazoo()

        def read() -> list[str]:
            try:
                return sorted(self._client.get_children(self.path(relative)))
            except kazoo.exceptions.NoNodeError:
                return []

        names: list[str] = await self._call(read, reading=relative)
        return names

    async def delete(self, relative: str, *, recursive: bool = False) -> None:
        """Remove a node (no error when it is already gone)."""
        kazoo = _kazoo()

        def remove() -> None:
            with contextlib.suppress(kazoo.exceptions.NoNodeError):
                self._client.delete(self.path(relative), recursive=recursive)

        await self._call(remove)

    async def wait_gone(self, relative: str) -> None:
        """Return once ``relative`` does not exist (at once if it does not now)."""
        assert self._loop is not None
        loop = self._loop
        while True:
            gone = asyncio.Event()

            def watch(event: Any, gone: asyncio.Event = gone) -> None:
                loop.call_soon_threadsafe(gone.set)

            exists = await self._call(lambda: self._client.exists(self.path(relative), watch=watch), reading=relative)
            if exists is None:
                return
            await gone.wait()

    async def wait_changed(self, relative: str, version: int | None) -> tuple[Any, Version | None]:
        """``(data, version)`` of ``relative`` once it changed since ``version`` (``None``: absent).

        Given a :class:`Version` this store handed out, any write since wakes it (its ``mzxid`` moved), a node
        deleted and created again at the same data version included.
        """
        assert self._loop is not None
        loop = self._loop
        kazoo = _kazoo()
        while True:
            changed = asyncio.Event()

            def watch(event: Any, changed: asyncio.Event = changed) -> None:
                loop.call_soon_threadsafe(changed.set)

            def read(watch: Any = watch) -> tuple[Any, Version | None]:
                while True:
                    try:
                        raw, stat = self._client.get(self.path(relative), watch=watch)
                    except kazoo.exceptions.NoNodeError:
                        # be told when it appears; created since the get, it is read again (its creation
                        # happened before this watch, which would only fire at the change after it)
                        if self._client.exists(self.path(relative), watch=watch) is None:
                            return None, None
                        continue
                    return (json.loads(raw) if raw else None), Version(stat.version, stat.mzxid)

            data, found = await self._call(read, reading=relative)
            if moved(version, found):
                return data, found
            await changed.wait()

    async def commit(self, ops: Sequence[Op]) -> bool:
        """Apply every step or none (one ZooKeeper multi); ``False`` when a check or version failed."""
        kazoo = _kazoo()

        def run() -> bool:
            transaction = self._client.transaction()
            for op in ops:
                _add(transaction, self.path(op.path), op, self.acl(op.path))
            results = transaction.commit()
            if any(isinstance(result, kazoo.exceptions.NoAuthError) for result in results):
                raise kazoo.exceptions.NoAuthError()  # not a failed check: this client may not write here
            return not any(isinstance(result, Exception) for result in results)

        committed: bool = await self._call(run)
        return committed

    async def watch_children(self, relative: str) -> asyncio.Event:
        """An event set (on the loop) every time the children of ``relative`` change; the caller clears it.

        kazoo's ``ChildrenWatch`` re-arms itself, so one watch serves for the session's life.
        """
        assert self._loop is not None
        loop, changed = self._loop, asyncio.Event()
        await self.ensure(relative)

        def on_change(children: list[str]) -> None:
            loop.call_soon_threadsafe(changed.set)

        await self._call(lambda: self._client.ChildrenWatch(self.path(relative), on_change), reading=relative)
        return changed


def _add(transaction: Any, path: str, op: Op, acl: list[Any]) -> None:
    """``op`` as a step of ``transaction``; a created node gets ``acl``."""
    if isinstance(op, Check):
        transaction.check(path, op.version)
    elif isinstance(op, Create):
        transaction.create(path, json.dumps(op.data).encode(), acl=acl, ephemeral=op.ephemeral)
    elif isinstance(op, SetData):
        transaction.set_data(path, json.dumps(op.data).encode(), op.version)
    elif isinstance(op, Delete):
        transaction.delete(path, op.version)


DIGEST_USER = "streamlet"


def credentials(secret: bytes) -> str:
    """``user:password`` for ZooKeeper's digest scheme, derived from the cluster secret (not the secret itself)."""
    password = hmac.new(secret, b"streamlet zookeeper digest", hashlib.sha256).hexdigest()
    return f"{DIGEST_USER}:{password}"


def cluster_acl(secret: bytes | None) -> list[Any]:
    """Every permission for the secret's digest identity, read for anyone: the nodes that hold no job data
    (only read for anyone without a secret)."""
    kazoo = _kazoo()
    if secret is None:
        return [kazoo.security.make_acl("world", "anyone", read=True)]  # only ever used on reads: nothing created
    user, password = credentials(secret).split(":", 1)
    return [
        kazoo.security.make_digest_acl(user, password, all=True),
        kazoo.security.make_acl("world", "anyone", read=True),
    ]


def private_acl(secret: bytes | None) -> list[Any]:
    """Every permission for the secret's digest identity and nothing for anyone else: the nodes of job data
    (without a secret the same as :func:`cluster_acl`: such a store can create nothing under the root)."""
    if secret is None:
        return cluster_acl(None)
    user, password = credentials(secret).split(":", 1)
    return [_kazoo().security.make_digest_acl(user, password, all=True)]


def _open_to_anyone(acls: list[Any]) -> bool:
    """Whether an ACL lets someone without the secret in (any ``world`` entry)."""
    return any(acl.id.scheme == "world" for acl in acls)
