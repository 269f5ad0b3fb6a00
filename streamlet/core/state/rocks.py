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
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamlet.core.state.rocks_expiring import RocksExpiringState
from streamlet.core.state.rocks_keyed import RocksKeyedState
from streamlet.core.state.rocks_sessions import SessionStore
from streamlet.core.state.rocks_timers import RocksTimers
from streamlet.core.state.rocks_values import RocksValues, rocksdict_module
from streamlet.core.state.rocks_windows import WindowStore
from streamlet.errors import StreamletError

DEFAULT_CACHE_ENTRIES = 4096

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
        self._opened: list[RocksKeyedState | RocksTimers | WindowStore | SessionStore] = []
        #: ``(job, node, instance)`` of every state opened, in order (what a test or an operator can check).
        self.opened: list[tuple[str, str, int]] = []

    def __repr__(self) -> str:
        return f"RocksDBState({str(self.path) if self.path else None!r}, cache_mb={self.cache_mb})"

    def open(
        self,
        job: str,
        node: str,
        index: int,
        segments: int,
        ttl: float | None = None,
        now: Callable[[], float] | None = None,
    ) -> RocksKeyedState:
        """The (empty) state of instance ``index`` of ``node`` in ``job``; its database is made on first use (a
        stateless task never makes one). With ``ttl`` (``state_ttl``), entries expire ``ttl`` seconds of
        ``now()`` after their last write (their write times in a database of their own)."""
        folder = self._folder(job, node, index, "state")

        def make() -> Any:
            self.opened.append((job, node, index))
            return self._database(folder)

        values = RocksValues(make, segments, self.cache_entries, changelog_limit=self.cache_mb << 20)
        state: RocksKeyedState
        if ttl is None:
            state = RocksKeyedState(values, folder)
        else:
            assert now is not None
            stamps = self._folder(job, node, index, "expiry")
            state = RocksExpiringState(values, folder, ttl, now, lambda: self._database(stamps), stamps)
        self._opened.append(state)
        return state

    def open_timers(self, job: str, node: str, index: int, now: Callable[[], float]) -> RocksTimers:
        """The (empty) timers of instance ``index`` of ``node`` in ``job``; their database is made at the first
        timer set (a task without timers never makes one)."""
        folder = self._folder(job, node, index, "timers")
        timers = RocksTimers(lambda: self._database(folder), folder, now, changelog_limit=self.cache_mb << 20)
        self._opened.append(timers)
        return timers

    def open_windows(self, job: str, node: str, index: int, segments: int) -> WindowStore:
        """The open windows of a fold of instance ``index`` of ``node`` in ``job``; their database is made when
        the first window opens."""
        folder = self._folder(job, node, index, "windows")
        store = WindowStore(lambda: self._database(folder), segments, self.cache_entries)
        self._opened.append(store)
        return store

    def open_sessions(self, job: str, node: str, index: int, segments: int) -> SessionStore:
        """The open sessions of a session window fold of instance ``index`` of ``node`` in ``job``; their
        databases are made when the first session opens."""
        store = SessionStore(self._database, self._folder(job, node, index, "sessions"), segments, self.cache_entries)
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


def _safe(name: str) -> str:
    """A node or job name as one folder name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


def backend_from(settings: dict[str, Any] | None, path: Path) -> RocksDBState | None:
    """The backend a cluster job's spec names (``{"backend": "rocksdb", "cache_mb": N}``: ``submit
    --state-backend rocksdb``), its databases under ``path``; ``None``: in memory."""
    if not settings:
        return None
    if settings.get("backend") != "rocksdb":
        raise StreamletError(f"unknown state backend {settings.get('backend')!r} (this worker knows rocksdb)")
    return RocksDBState(path, cache_mb=int(settings.get("cache_mb", 64)))
