"""Keyed state in RocksDB (through ``rocksdict``): a task's state bigger than its memory.

:class:`RocksDBState` is the backend a job or a task chooses (``sl.run(..., state_backend=sl.RocksDBState(...))``,
``add_task(..., state_backend=...)``); each task instance then keeps its ``self.state`` in a RocksDB database of
its own under the backend's folder. The database is a working copy: what a restore starts from is the
checkpoint, so the folder is emptied when the instance opens it and removed when the job ends.

Layout: a key is stored as its segment (two bytes, big-endian: the ``SAME_KEY`` segment that decides which
instance owns it, ``core.model.segments``) followed by the key packed with the state codec; the value is packed
with the same codec (msgpack, never pickle: ``core.model.encoding``). So one segment's keys are one range of
the database.

Operators change the values they read in place (a join appends to the list its key holds), as they may with the
in-memory dict. So values are read through a bounded write-back cache of decoded objects: every value read or
written stays in it until ``cache_entries`` newer ones push it out, and is then written back whole (changed or
not), as it is at every checkpoint. Memory is bounded by that cache and RocksDB's block cache (``cache_mb``).
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from streamlet.core.state.changelog import (
    CHANGELOG,
    Increment,
    changelog,
    chunk_entries,
    digest,
    is_changelog,
    pack_chunk,
)
from streamlet.core.state.keyed import KeyedState, _unpack
from streamlet.core.state.rocks_timers import RocksTimers
from streamlet.core.state.rocks_values import RocksValues, rocksdict_module
from streamlet.core.state.rocks_windows import WindowStore
from streamlet.errors import StreamletError

DEFAULT_CACHE_ENTRIES = 4096
RESTORE_BATCH = 10_000  # entries a restore writes together
MAX_CHAIN = 64
"""Chunks at most in an incremental checkpoint's chain (a full one and its increments): what a restore reads."""


_USED_HERE = False  # whether this process opened a RocksDB database


def forking_is_unsafe() -> bool:
    """Whether a process forked from this one now could not run RocksDB: this process opened a database, so
    RocksDB's background threads exist here, and a forked child inherits their locks but not the threads
    (its first flush waits for them forever)."""
    return _USED_HERE


class RocksDBState:
    """Keep keyed state in RocksDB, under ``path`` (a temporary folder when ``None``).

    ``cache_mb``: RocksDB's block cache, shared by the job's instances of this backend (each instance's
    memtables take up to half as much again). ``cache_entries``: the decoded values each instance keeps in
    memory (its write-back cache). The in-memory dict (the default backend) is faster; choose RocksDB for
    state that does not fit in memory.

    Example:
        >>> backend = RocksDBState(cache_mb=16)
        >>> backend.cache_mb
        16
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, cache_mb: int = 64, cache_entries: int = DEFAULT_CACHE_ENTRIES
    ) -> None:
        if type(cache_mb) is not int or cache_mb < 1:
            raise StreamletError(f"RocksDBState: cache_mb must be a whole number of MB >= 1, got {cache_mb!r}")
        if type(cache_entries) is not int or cache_entries < 1:
            raise StreamletError(f"RocksDBState: cache_entries must be a whole number >= 1, got {cache_entries!r}")
        self.path = None if path is None else Path(path)
        self.cache_mb = cache_mb
        self.cache_entries = cache_entries
        self._root: Path | None = None
        self._cache: Any = None
        self._opened: list[RocksKeyedState | RocksTimers | WindowStore] = []
        #: ``(job, node, instance)`` of every state opened, in order (what a test or an operator can check).
        self.opened: list[tuple[str, str, int]] = []

    def __repr__(self) -> str:
        return f"RocksDBState({str(self.path) if self.path else None!r}, cache_mb={self.cache_mb})"

    def open(self, job: str, node: str, index: int, segments: int) -> RocksKeyedState:
        """The (empty) state of instance ``index`` of ``node`` in ``job``; its database is made on first use (a
        stateless task never makes one)."""
        folder = self._folder(job, node, index, "state")

        def make() -> Any:
            self.opened.append((job, node, index))
            return self._database(folder)

        values = RocksValues(make, segments, self.cache_entries, changelog_limit=self.cache_mb << 20)
        state = RocksKeyedState(values, folder)
        self._opened.append(state)
        return state

    def open_timers(self, job: str, node: str, index: int, now: Callable[[], float]) -> RocksTimers:
        """The (empty) timers of instance ``index`` of ``node`` in ``job``; their database is made at the first
        timer set (a task without timers never makes one)."""
        folder = self._folder(job, node, index, "timers")
        timers = RocksTimers(lambda: self._database(folder), folder, now)
        self._opened.append(timers)
        return timers

    def open_windows(self, job: str, node: str, index: int, segments: int) -> WindowStore:
        """The open windows of a fold of instance ``index`` of ``node`` in ``job``; their database is made when
        the first window opens."""
        folder = self._folder(job, node, index, "windows")
        store = WindowStore(lambda: self._database(folder), segments, self.cache_entries)
        self._opened.append(store)
        return store

    def _folder(self, job: str, node: str, index: int, kind: str) -> Path:
        rocksdict = rocksdict_module()
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="streamlet-rocksdb-")) if self.path is None else self.path
            self._cache = rocksdict.Cache(self.cache_mb * 1024 * 1024)
        # one folder per opening: a live rescale opens instance i's new state while the old one's is still open
        return self._root / _safe(job) / _safe(node) / f"{index}.{len(self._opened)}.{kind}"

    def _database(self, folder: Path) -> Any:
        """A fresh database in ``folder`` (what was there goes: a working copy, a restore starts from the
        checkpoint)."""
        rocksdict = rocksdict_module()
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        options = rocksdict.Options(raw_mode=True)
        # memtables count against memory too: RocksDB's default (64 MB each) would hold a whole state of that
        # size in memory before a flush; a quarter of the cache each, two at most
        options.set_write_buffer_size(max(1, self.cache_mb // 4) * 1024 * 1024)
        options.set_max_write_buffer_number(2)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(self._cache)
        table.set_bloom_filter(10, False)  # a read of a key never written (a new key) skips the files
        options.set_block_based_table_factory(table)
        db = rocksdict.Rdict(str(folder), options)
        global _USED_HERE  # a fact about this process, for whoever would fork it
        _USED_HERE = True
        unlogged = rocksdict.WriteOptions()
        unlogged.disable_wal = True  # a working copy: what survives a crash is the checkpoint, not this
        db.set_write_options(unlogged)
        return db

    def close(self) -> None:
        """Close every database opened and remove what this backend made (the job ended)."""
        for state in self._opened:
            state.close()
        self._opened.clear()
        if self._root is not None and self.path is None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root = None


_SEGMENT_BYTES = struct.Struct(">H")  # a stored key's first two bytes: its segment (as ``RocksValues`` lays keys)


def _runs(owners: Sequence[int], keeper: int) -> Iterator[tuple[int, int, int]]:
    """``(first, last, owner)`` of each run of consecutive segments going to one owner other than ``keeper``."""
    start = 0
    for segment in range(1, len(owners) + 1):
        if segment == len(owners) or owners[segment] != owners[start]:
            if owners[start] != keeper:
                yield start, segment - 1, owners[start]
            start = segment


def _after_segment(last: int) -> bytes:
    """The least stored key past every key of segment ``last``."""
    if last + 1 < 1 << 16:
        return _SEGMENT_BYTES.pack(last + 1)
    return b"\xff" * 64  # no packed key of the last segment runs this long in 0xff bytes


def _safe(name: str) -> str:
    """A node or job name as one folder name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


class RocksKeyedState(KeyedState):
    """:class:`KeyedState` whose ``values`` live in RocksDB (:class:`RocksValues`). Its checkpoints are
    changelogs (``core.state.changelog``), whole or incremental; either backend restores and regroups both
    backends' checkpoints."""

    __slots__ = ("base_bytes", "chain", "chain_bytes", "folder")

    values: RocksValues  # type: ignore[assignment]

    def __init__(self, values: RocksValues, folder: Path) -> None:
        self.values = values
        self.folder = folder
        self.chain: list[str] = []  # the chunks the last incremental checkpoint restores from, oldest first
        self.chain_bytes = 0  # their size
        self.base_bytes = 0  # the size of the first (full) one

    def items(self) -> Iterator[tuple[Any, Any]]:
        """This instance's ``(key, value)`` pairs, read as they are walked."""
        return iter(self.values.items())

    def __len__(self) -> int:
        return len(self.values)

    def checkpoint(self) -> dict[str, Any]:
        """The whole state as a changelog of one chunk (``core.state.changelog``), read as it is packed."""
        values = self.values
        if not values.made and not values.cache:  # never touched (a stateless task): no database to make
            return changelog([], values.segments)
        values.flush()
        return changelog([pack_chunk(values.db.items())], values.segments)

    def checkpoint_increment(self) -> Any:
        """What changed since the previous checkpoint, as an :class:`~streamlet.core.state.changelog.Increment`
        (its chain names the chunks to restore from); a full chunk that starts a new chain when there is no
        chain yet (the first checkpoint, or one after a restore or a hand-over), when the chain is
        :data:`MAX_CHAIN` long, when its increments weigh more than its full chunk (so a restore reads at most
        about twice the state), or when more was written than the changelog may hold in memory."""
        values = self.values
        if not values.made and not values.cache:
            return changelog([], values.segments)
        values.flush()
        changed = values.take_changed()
        chain = self.chain
        if chain and changed is not None and len(chain) < MAX_CHAIN and self.chain_bytes <= 2 * self.base_bytes:
            chunk = pack_chunk(changed.items())
            self.chain_bytes += len(chunk)
        else:
            chunk = pack_chunk(values.db.items())
            chain.clear()
            self.chain_bytes = self.base_bytes = len(chunk)
        chain.append(digest(chunk))
        return Increment(tuple(chain), chunk, values.segments)

    def restore(self, snapshot: Any) -> None:
        """Replace the contents with a checkpoint's (of either backend); the next checkpoint is a full one."""
        values = self.values
        self.chain.clear()
        whole = snapshot if is_changelog(snapshot) else None
        if whole is None:
            restored = _unpack(snapshot)
            entries: Iterator[tuple[bytes, bytes | None]] = (
                (values.raw_key(key), values.packed(value)) for key, value in restored.items()
            )
            chunks_empty = not restored
        else:
            entries = self._entries(whole)
            chunks_empty = not any(whole[CHANGELOG])
        values.reset()  # a fresh database: emptying one key by key costs as much as filling it
        if chunks_empty:
            return
        rocksdict = rocksdict_module()
        batch, size = rocksdict.WriteBatch(raw_mode=True), 0
        for raw, packed in entries:
            if packed is None:
                batch.delete(raw)
            else:
                batch.put(raw, packed)
            size += 1
            if size == RESTORE_BATCH:
                values.db.write(batch)
                batch, size = rocksdict.WriteBatch(raw_mode=True), 0
        values.db.write(batch)

    def hand_over_segments(self, owners: Sequence[int], keeper: int) -> dict[int, list[tuple[bytes, bytes]]]:
        """Take the keys of every segment whose new owner (``owners[segment]``) is not ``keeper`` out of the
        database, by range: one scan and one range delete per run of segments going to one owner, the keys
        staying untouched. Each new owner's entries, as stored. The next checkpoint is a full one."""
        values = self.values
        moved: dict[int, list[tuple[bytes, bytes]]] = {}
        if not values.made and not values.cache:
            return moved
        values.flush()
        db = values.db
        for first, last, owner in _runs(owners, keeper):
            low, high = _SEGMENT_BYTES.pack(first), _after_segment(last)
            entries = moved.setdefault(owner, [])
            cursor = db.iter()
            cursor.seek(low)
            while cursor.valid() and cursor.key() < high:
                entries.append((cursor.key(), cursor.value()))
                cursor.next()
            db.delete_range(low, high)
        values.forget(lambda raw: owners[_SEGMENT_BYTES.unpack_from(raw)[0]] != keeper)
        self._start_afresh()
        return moved

    def take_in(self, whole: dict[str, Any]) -> None:
        """Add a changelog's keys (another instance's segments, handed over) to what this database holds."""
        rocksdict = rocksdict_module()
        batch, size = rocksdict.WriteBatch(raw_mode=True), 0
        for raw, packed in self._entries(whole):
            if packed is not None:
                batch.put(raw, packed)
                size += 1
            if size == RESTORE_BATCH:
                self.values.db.write(batch)
                batch, size = rocksdict.WriteBatch(raw_mode=True), 0
        if size:
            self.values.db.write(batch)
        self._start_afresh()

    def _start_afresh(self) -> None:
        """Keys moved in or out behind the changelog's back: the next checkpoint is a full one."""
        self.chain.clear()
        self.values.changed = None

    def _entries(self, whole: dict[str, Any]) -> Iterator[tuple[bytes, bytes | None]]:
        """A changelog's entries as this database stores them (keys placed again if its segments differ)."""
        values = self.values
        same = whole["segments"] == values.segments
        for chunk in whole[CHANGELOG]:
            for raw, packed in chunk_entries(chunk):
                yield (raw if same else values.raw_key(values.key_of(raw))), packed

    def close(self) -> None:
        """Close the database and remove its folder."""
        self.values.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def backend_from(settings: dict[str, Any] | None, path: Path) -> RocksDBState | None:
    """The backend a cluster job's spec names (``{"backend": "rocksdb", "cache_mb": N}``: ``submit
    --state-backend rocksdb``), its databases under ``path``; ``None``: in memory."""
    if not settings:
        return None
    if settings.get("backend") != "rocksdb":
        raise StreamletError(f"unknown state backend {settings.get('backend')!r} (this worker knows rocksdb)")
    return RocksDBState(path, cache_mb=int(settings.get("cache_mb", 64)))
