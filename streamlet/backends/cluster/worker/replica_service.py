"""Checkpoint replicas on other workers, over the authenticated data plane (no shared disk).

Every worker keeps its files under its own directory (``<state-dir>/<worker-id>/``):

    checkpoints/<job>/attempt-<n>/<worker>/checkpoint-<epoch>.msgpack   its parts, as it saved them
    replicas/<job>/<owner>/checkpoint-<epoch>.msgpack                   copies of other workers' parts
    .../chunks/<digest>.chunk        beside each: the chunks of incremental checkpoints (core.state.changelog)

A *part* is a checkpoint document holding some instances of some nodes (see
``checkpoints``); a *replica* is the piece of an owner's part that holds the
instances a backup worker backs up, in the same framed, checksummed format.

Two one-off transfers ride on the data server's on-demand channels:

- **push** (``replica/<id>``): the owner sends a piece as a blob; the backup
  checks its checksum, writes it (fsync, rename), keeps the newest
  :data:`KEEP` per owner and job (superseded ones go), then calls
  ``on_stored`` (which acknowledges it in ZooKeeper). A piece of an
  incremental checkpoint carries the chunks its backup lacks (``chunks``:
  name -> bytes); the backup stores them first (each checked against its
  name, the digest of its content) and refuses a piece naming a chunk it
  still lacks;
- **fetch** (``fetch/<id>``): a restoring worker asks a holder for some
  instances of a part; the holder answers on a channel the asker registered,
  with the piece (its chunks put back in: whole) or ``{"error": ...}``.

Nothing but msgpack travels or is stored: never pickle. A request that is not
what this module sends is dropped and counted (``bad_requests``).
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import msgpack
import structlog
from anyio.streams.memory import MemoryObjectSendStream

from streamlet.backends.cluster.tree.paths import instance_id
from streamlet.core.model import world
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.runtime.channel import Inbox
from streamlet.core.state.changelog import chunks_named
from streamlet.core.state.participant import SECTIONS
from streamlet.core.state.store import DirectoryCheckpointStore, checked_chunk, decode, encode
from streamlet.errors import CheckpointError
from streamlet.transport.blobs import DEFAULT_MAX_BLOB, receive_blob, send_blob
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpChannel, TcpClient

log = structlog.get_logger("streamlet")
KEEP = 3  # replicas per owner and job: the newest complete checkpoint and the one before are always among them
TRANSFER_TIMEOUT = 10.0  # seconds a push or a fetch may take before the peer counts as unreachable (plus size)
MIN_RATE = 10e6  # bytes per second a transfer is allowed to be as slow as
PUSH, FETCH, ANSWER = "replica/", "fetch/", "answer/"
MAX_REQUEST = 1 << 20  # bytes of a fetch request: its names and address (a bigger one is dropped and counted)
Address = tuple[str, int]
SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
OnStored = Callable[[dict[str, Any], str, int], Awaitable[None]]  # (piece, owner, bytes)


def transfer_timeout(size: int) -> float:
    """Seconds a transfer of ``size`` bytes may take: :data:`TRANSFER_TIMEOUT`, plus the time at
    :data:`MIN_RATE` (a large state must not fail on a fixed limit)."""
    return TRANSFER_TIMEOUT + size / MIN_RATE


@contextmanager
def abandoned_on_failure(channel: TcpChannel) -> Iterator[None]:
    """A transfer that fails (a timeout, a cancellation) drops its channel from the link, so a reconnect
    never reopens a transfer the receiver has given up on."""
    try:
        yield
    except BaseException:
        channel.abandon()
        raise


def _name(value: Any) -> str:
    """A job or worker name from a peer, checked before it becomes part of a path: one plain file name
    (letters, digits, '_', '-', '.'; never '..' or a separator), so no request reaches outside this folder."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or value in (".", ".."):
        raise ValueError(f"not a job or worker name: {value!r}")
    return value


def instances_of(document: dict[str, Any]) -> list[str]:
    """The instances a part (or piece) holds state of, as ``node.index``."""
    return [
        instance_id(name, int(index))
        for section in SECTIONS
        for name, entries in document.get(section, {}).items()
        for index, _ in entries
    ]


def _store_chunks(store: DirectoryCheckpointStore, document: dict[str, Any], chunks: Any) -> bytes:
    """Save a pushed piece's chunks (each checked against its name) and return the piece to save without
    them; ``ValueError`` when the piece names a chunk this worker then still lacks (never acknowledged: the
    owner sends everything to the backup it chooses next)."""
    if type(chunks) is not dict:
        raise ValueError("a pushed replica's chunks are a map")
    for name, data in chunks.items():
        if type(name) is not str or not SAFE_NAME.fullmatch(name) or type(data) is not bytes:
            raise ValueError("a pushed chunk is named bytes")
        store.save_chunk(name, checked_chunk(name, data))
    missing = sorted(name for name in chunks_named(document) if not store.has_chunk(name))
    if missing:
        raise ValueError(f"a pushed replica names chunks this worker lacks: {missing[:3]}")
    return encode(document)


def piece(document: dict[str, Any], instances: Iterable[str]) -> dict[str, Any]:
    """The part ``document`` cut down to ``instances`` (the header fields stay)."""
    wanted = set(instances)
    cut = {key: value for key, value in document.items() if key not in SECTIONS}
    for section in SECTIONS:
        cut[section] = {}
        for name, entries in document.get(section, {}).items():
            kept = [entry for entry in entries if instance_id(name, int(entry[0])) in wanted]
            if kept:
                cut[section][name] = kept
    return cut


class ReplicaService:
    """A worker's checkpoint files, and the replica pushes and fetches its data server takes."""

    def __init__(self, root: Path, me: str, server: DataServer, client: TcpClient) -> None:
        self.root = root
        self.me = me
        self.server = server
        self.client = client
        self.counts = {"stored": 0, "served": 0, "fetched_bytes": 0, "bad_requests": 0}
        self.on_stored: OnStored | None = None
        self._arrivals: MemoryObjectSendStream[tuple[str, Inbox, int]] | None = None

    # -- files --------------------------------------------------------------------

    def parts(self, job: str, attempt: int) -> DirectoryCheckpointStore:
        """Where this worker saves its own parts of ``attempt``."""
        return DirectoryCheckpointStore(self.root / "checkpoints" / job / f"attempt-{attempt}" / self.me)

    def replicas(self, job: str, owner: str) -> DirectoryCheckpointStore:
        """Where this worker keeps the pieces of ``owner``'s parts it backs up."""
        return DirectoryCheckpointStore(self.root / "replicas" / job / owner, keep=KEEP)

    def read_local(self, job: str, attempt: int, epoch: int, owner: str) -> dict[str, Any]:
        """Owner ``owner``'s part (or the piece of it held here) of checkpoint ``epoch``, checksum checked.
        ``ValueError`` / ``OSError`` when it is missing, torn or corrupt."""
        folder = (
            self.root / "checkpoints" / job / f"attempt-{attempt}" / self.me
            if owner == self.me
            else (self.root / "replicas" / job / owner)
        )
        if not folder.is_dir():  # asked for what was never here: no folder is made for it
            raise FileNotFoundError(f"{folder} does not exist")
        store = self.parts(job, attempt) if owner == self.me else self.replicas(job, owner)
        document = store.read(epoch)  # with the chunks of incremental checkpoints in: whole snapshots
        if int(document.get("epoch", -1)) != epoch:
            raise ValueError(f"{store.path(epoch)} holds another checkpoint")
        return document

    def sweep(self, job: str, keep: dict[int, int] | None) -> int:
        """Delete this worker's files of ``job`` no restore can need; returns how many went. ``keep``: the
        epochs a restore may still read (the last complete checkpoint and the one before), each with its
        attempt; ``None``: the job is over (or gone), so nothing of it is kept."""
        removed = 0
        for folder in (self.root / "replicas" / job, self.root / "checkpoints" / job):
            if keep is None and folder.exists():
                removed += sum(1 for path in folder.rglob("*") if path.is_file())
                shutil.rmtree(folder, ignore_errors=True)
        if keep is None:
            return removed
        oldest = min(keep)
        for store in self._stores_of(job):
            old = [epoch for epoch in store.epochs() if epoch < oldest]
            for epoch in old:
                store.path(epoch).unlink(missing_ok=True)
                removed += 1
            if old:
                store.drop_unnamed_chunks()
        attempts = self.root / "checkpoints" / job
        needed = {f"attempt-{attempt}" for attempt in keep.values()}
        newest = max(keep.values())
        for folder in attempts.iterdir() if attempts.exists() else ():
            if folder.name not in needed and int(folder.name.removeprefix("attempt-")) < newest:
                removed += sum(1 for path in folder.rglob("*") if path.is_file())
                shutil.rmtree(folder, ignore_errors=True)  # an older attempt's parts: superseded
        return removed

    def jobs(self) -> set[str]:
        """The jobs this worker keeps files of."""
        return {
            folder.name for kind in ("replicas", "checkpoints") if (self.root / kind).is_dir()
            for folder in (self.root / kind).iterdir()
        }  # fmt: skip

    def _stores_of(self, job: str) -> list[DirectoryCheckpointStore]:
        owners = self.root / "replicas" / job
        return [self.replicas(job, owner.name) for owner in owners.iterdir()] if owners.is_dir() else []

    def read_piece(self, job: str, attempt: int, epoch: int, owner: str, instances: list[str]) -> dict[str, Any]:
        """``instances`` of owner ``owner``'s part of ``epoch`` from this worker's copy (``read_local``);
        ``ValueError`` when the copy lacks some of them."""
        document = self.read_local(job, attempt, epoch, owner)
        missing = set(instances) - set(instances_of(document))
        if missing:
            raise ValueError(f"{self.me} holds no {sorted(missing)}")
        return piece(document, instances)

    def chunks_for(self, job: str, attempt: int, names: Iterable[str]) -> dict[str, bytes]:
        """This worker's chunks ``names`` of its parts of ``attempt`` (what a backup that lacks them is sent)."""
        store = self.parts(job, attempt)
        return {name: store.read_chunk(name) for name in names}

    # -- serving ------------------------------------------------------------------

    async def run(self) -> None:
        """Take pushes and fetch requests until cancelled."""
        send, receive = anyio.create_memory_object_stream[tuple[str, Inbox, int]](math.inf)  # one per connection
        self._arrivals = send
        self.server.accept(PUSH, self._accept)
        self.server.accept(FETCH, self._accept)
        async with send, receive, anyio.create_task_group() as group:
            async for channel_id, inbox, channel in receive:
                group.start_soon(self._serve, channel_id, inbox, channel)

    def _accept(self, channel_id: str) -> tuple[Inbox, int]:
        inbox = Inbox(8)
        channel = inbox.add_channel(0)
        assert self._arrivals is not None
        self._arrivals.send_nowait((channel_id, inbox, channel))
        return inbox, channel

    async def _serve(self, channel_id: str, inbox: Inbox, channel: int) -> None:
        try:
            with anyio.fail_after(TRANSFER_TIMEOUT * 6):
                pushed = channel_id.startswith(PUSH)  # a fetch request is a few names: no more than that
                blob = await receive_blob(inbox, channel, DEFAULT_MAX_BLOB if pushed else MAX_REQUEST)
                if pushed:
                    await self._store(blob)
                else:
                    await self._answer(unpackb(blob))
        except Exception as exc:  # noqa: BLE001 - a bad or failed transfer is dropped and counted, never fatal
            self.counts["bad_requests"] += 1
            log.warning("dropping a replica transfer", channel=channel_id, reason=f"{type(exc).__name__}: {exc}")
        finally:
            self.server.unregister(channel_id)

    async def _store(self, blob: bytes) -> None:
        document = decode(blob, "a pushed replica")  # the checksum: a corrupt push is never stored
        job, owner, epoch = _name(document["job_key"]), _name(document["owner"]), int(document["epoch"])
        chunks = document.pop("chunks", None)
        store = self.replicas(job, owner)
        if chunks is not None:  # an incremental checkpoint's new chunks, before the piece naming them
            blob = await world.blocking(_store_chunks, store, document, chunks)
        await world.blocking(store.save, epoch, blob)
        self.counts["stored"] += 1
        if self.on_stored is not None:
            await self.on_stored(document, owner, len(blob))

    async def _answer(self, request: dict[str, Any]) -> None:
        job, attempt, epoch = _name(request["job"]), int(request["attempt"]), int(request["epoch"])
        owner, wanted = _name(request["owner"]), [str(instance) for instance in request["instances"]]
        host, port, reply = str(request["reply"][0]), int(request["reply"][1]), str(request["reply"][2])
        asker = _name(request["reply"][3]) if len(request["reply"]) > 3 else None  # its certificate names it
        if not reply.startswith(ANSWER):
            raise ValueError(f"a fetch asks for its answer on {reply!r}")
        try:
            answer = await world.blocking(self.read_piece, job, attempt, epoch, owner, wanted)
        except (OSError, ValueError, CheckpointError, msgpack.UnpackException) as exc:
            answer = {"error": f"{self.me} cannot read its copy: {exc}"}
            log.warning("replica unreadable", job=job, epoch=epoch, owner=owner, reason=str(exc))
        data = encode(answer)
        channel = self.client.channel((host, port), reply, transfer=True, peer=asker)
        with abandoned_on_failure(channel), anyio.fail_after(transfer_timeout(len(data))):
            await send_blob(channel, data)
            await channel.release()
        self.counts["served"] += 1

    # -- asking -------------------------------------------------------------------

    async def push(self, address: Address, document: dict[str, Any], backup: str | None = None) -> None:
        """Send ``document`` (a piece, with ``owner``, ``job_name`` and ``attempt_number`` set) to the backup
        at ``address`` (``backup``: its worker id, which its TLS certificate must name); returns once it is
        delivered (the backup acknowledges it in ZooKeeper once stored)."""
        data = encode(document)
        channel = self.client.channel(address, f"{PUSH}{world.token_hex(16)}", transfer=True, peer=backup)
        with abandoned_on_failure(channel), anyio.fail_after(transfer_timeout(len(data))):
            await send_blob(channel, data)
            await channel.release()

    async def fetch(
        self, address: Address, holder: str, job: str, attempt: int, epoch: int, owner: str, instances: list[str]
    ) -> dict[str, Any]:
        """``instances`` of ``owner``'s part of ``epoch``, from ``holder`` at ``address``. ``ValueError`` when
        the holder has no intact copy; ``TimeoutError`` when it does not answer."""
        reply = f"{ANSWER}{world.token_hex(16)}"
        inbox = Inbox(8)
        channel = inbox.add_channel(0)
        self.server.register(reply, inbox, channel)
        try:
            request = {
                "job": job, "attempt": attempt, "epoch": epoch, "owner": owner, "instances": instances,
                "reply": [*self.server.address, reply, self.me],  # advertised: where the holder connects
            }  # fmt: skip
            asking = self.client.channel(address, f"{FETCH}{world.token_hex(16)}", transfer=True, peer=holder)
            with abandoned_on_failure(asking), anyio.fail_after(TRANSFER_TIMEOUT * 6):
                await send_blob(asking, packb(request))
                blob = await receive_blob(inbox, channel)  # the answer may be large: the holder times its send
                await asking.release()
        finally:
            self.server.unregister(reply)
        answer = decode(blob, f"checkpoint {epoch} of {owner} from {address[0]}:{address[1]}")
        if "error" in answer:
            raise ValueError(str(answer["error"]))
        self.counts["fetched_bytes"] += len(blob)
        return answer
