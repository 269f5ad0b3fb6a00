"""Keyed state as a changelog: how RocksDB state checkpoints, in full or incrementally.

A RocksDB instance's checkpoint of its keyed state is a *changelog*: a list of chunks applied in order, each
chunk a run of entries ``[stored key, packed value]`` (``None`` for a key deleted), the stored key being the
segment and the packed key (``core.state.rocks``) and both packed with the state codec (msgpack, never pickle).
A full checkpoint is one chunk holding every key; an incremental one adds to the chain a chunk of the keys
written since the previous checkpoint. In a document the snapshot is plain data::

    {"changelog": [chunk, chunk, ...], "segments": 4096}       # whole: every chunk's bytes

A store that keeps chunks (``CheckpointStore.save_chunk``, the directory store's) is handed each chunk once,
named by its digest, and the document it saves only names them::

    {"changelog_chunks": ["9f2c…", "4b1e…"], "segments": 4096}

Reading the document back puts the chunks' bytes in again (:func:`resolve`), so a restore, a regroup or a
savepoint sees whole snapshots only. A chunk is never changed once written, so checkpoints share the chunks of
their chain: a checkpoint writes what changed, not the whole state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from streamlet.core.model.encoding import unpackb

CHANGELOG = "changelog"
CHUNKS = "changelog_chunks"
SEGMENT_BYTES = 2  # a stored key starts with its segment, two bytes big-endian

Entry = tuple[bytes, bytes | None]


def pack_chunk(entries: Iterable[Entry]) -> bytes:
    """Entries as one chunk: msgpack arrays back to back (built as it goes: a full chunk is never a list)."""
    packer = msgpack.Packer(use_bin_type=True)
    out = bytearray()
    for raw, packed in entries:
        out += packer.pack([raw, packed])
    return bytes(out)


def chunk_entries(chunk: bytes) -> Iterator[Entry]:
    """The entries of a chunk, in order."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(chunk), 1024))
    unpacker.feed(chunk)
    for entry in unpacker:
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not bytes:
            raise ValueError("a changelog chunk holds [stored key, packed value] entries")
        if entry[1] is not None and type(entry[1]) is not bytes:
            raise ValueError("a changelog entry's value is packed bytes or None")
        yield entry[0], entry[1]


def digest(chunk: bytes) -> str:
    """The name a chunk is stored under: its content's digest."""
    return hashlib.blake2b(chunk, digest_size=16).hexdigest()


def is_changelog(snapshot: Any) -> bool:
    """Whether a keyed state snapshot is a changelog (RocksDB's) rather than the in-memory state's packed map."""
    return type(snapshot) is dict and CHANGELOG in snapshot


def changelog(chunks: list[bytes], segments: int) -> dict[str, Any]:
    """A whole changelog snapshot."""
    return {CHANGELOG: chunks, "segments": segments}


def values_of(snapshot: dict[str, Any]) -> dict[Any, Any]:
    """The key/value map a changelog snapshot holds (later chunks win; ``None`` deletes)."""
    values: dict[Any, Any] = {}
    for chunk in snapshot[CHANGELOG]:
        for raw, packed in chunk_entries(chunk):
            key = unpackb(raw[SEGMENT_BYTES:])
            if packed is None:
                values.pop(key, None)
            else:
                values[key] = unpackb(packed)
    return values


@dataclass(frozen=True, slots=True)
class Increment:
    """An incremental checkpoint of one RocksDB state: the chain of chunks it restores from (oldest first, the
    new one last) and the new chunk's bytes. Made only for a store that keeps chunks; the coordinator hands the
    store the new chunk and puts :meth:`reference` in the document."""

    chain: tuple[str, ...]
    chunk: bytes
    segments: int

    def reference(self) -> dict[str, Any]:
        """What the document holds: the chunks by name."""
        return {CHUNKS: list(self.chain), "segments": self.segments}


MAX_CHAIN = 64
"""Chunks at most in an incremental checkpoint's chain (a full one and its increments): what a restore reads."""


class Chain:
    """The chunks the last incremental checkpoint of one RocksDB store restores from (oldest first) and their
    sizes: what decides whether the next checkpoint adds an increment or starts a new chain with a full chunk."""

    __slots__ = ("base_bytes", "chain_bytes", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.chain_bytes = 0  # the size of every chunk in the chain
        self.base_bytes = 0  # the size of its first (full) one

    def clear(self) -> None:
        """The next checkpoint starts a new chain (after a restore, or keys moved behind the changelog's back)."""
        self.names.clear()

    def next(
        self, changed: Iterable[Entry] | None, everything: Callable[[], Iterable[Entry]], segments: int
    ) -> Increment:
        """The next checkpoint: ``changed`` (the entries written since the previous one) as an increment, or
        ``everything()`` as a full chunk that starts a new chain when there is no chain yet, when ``changed`` is
        ``None`` (more was written than could be kept), when the chain is :data:`MAX_CHAIN` long, or when its
        increments weigh more than its full chunk (so a restore reads at most about twice the whole)."""
        names = self.names
        if names and changed is not None and len(names) < MAX_CHAIN and self.chain_bytes <= 2 * self.base_bytes:
            chunk = pack_chunk(changed)
            self.chain_bytes += len(chunk)
        else:
            chunk = pack_chunk(everything())
            names.clear()
            self.chain_bytes = self.base_bytes = len(chunk)
        names.append(digest(chunk))
        return Increment(tuple(names), chunk, segments)


#: Where a task's snapshot may hold an incremental checkpoint: its keyed state, its timers, its open sessions.
INCREMENTAL: tuple[tuple[str, ...], ...] = (("state",), ("timers",), ("window", "chains"))


def _fields(snapshot: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """``(holder, name)`` of each field of :data:`INCREMENTAL` that ``snapshot`` has."""
    for path in INCREMENTAL:
        holder: Any = snapshot
        for name in path[:-1]:
            holder = holder.get(name) if type(holder) is dict else None
        if type(holder) is dict and path[-1] in holder:
            yield holder, path[-1]


def store_increments(document: dict[str, Any], save_chunk: Callable[[str, bytes], None]) -> int:
    """Replace every :class:`Increment` in a checkpoint document's task snapshots by its reference, handing
    its new chunk to ``save_chunk(name, bytes)`` first; returns the bytes of the chunks handed over."""
    written = 0
    for snapshot in _task_snapshots(document):
        for holder, field in _fields(snapshot):
            increment = holder[field]
            if type(increment) is Increment:
                save_chunk(increment.chain[-1], increment.chunk)
                written += len(increment.chunk)
                holder[field] = increment.reference()
    return written


def chunks_named(document: dict[str, Any]) -> set[str]:
    """Every chunk a stored document names."""
    names: set[str] = set()
    for snapshot in _task_snapshots(document):
        for holder, field in _fields(snapshot):
            stored = holder[field]
            if type(stored) is dict and CHUNKS in stored:
                names.update(stored[CHUNKS])
    return names


def resolve(document: dict[str, Any], read_chunk: Callable[[str], bytes]) -> dict[str, Any]:
    """A stored document with its chunks' bytes in again (whole snapshots); ``ValueError`` when a chunk is
    missing or damaged (``read_chunk`` raises it), so that the store falls back to an older checkpoint."""
    for snapshot in _task_snapshots(document):
        for holder, field in _fields(snapshot):
            stored = holder[field]
            if type(stored) is dict and CHUNKS in stored:
                holder[field] = changelog([read_chunk(name) for name in stored[CHUNKS]], stored["segments"])
    return document


def _task_snapshots(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for entries in (document.get("tasks") or {}).values():
        for entry in entries:
            snapshot = entry[1] if type(entry) is list else entry  # a part of a job holds [index, snapshot]
            if type(snapshot) is dict:
                yield snapshot
