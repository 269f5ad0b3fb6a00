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
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from streamlet.core.model.encoding import pack_exact, packb, unpackb
from streamlet.core.model.segments import segment_of
from streamlet.core.state.keyed import KeyedState, _unpack
from streamlet.errors import StreamletError

_SEGMENT = struct.Struct(">H")
_MISSING: Any = object()
DEFAULT_CACHE_ENTRIES = 4096
WRITE_BATCH = 1024  # values written back that go to the database together


def _rocksdict() -> Any:
    try:
        import rocksdict
    except ImportError as exc:  # pragma: no cover - the extra is part of every install made by the Makefile
        raise StreamletError("RocksDBState needs rocksdict: pip install 'streamlet[rocksdb]'") from exc
    return rocksdict


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
        self._opened: list[RocksKeyedState] = []
        #: ``(job, node, instance)`` of every state opened, in order (what a test or an operator can check).
        self.opened: list[tuple[str, str, int]] = []

    def __repr__(self) -> str:
        return f"RocksDBState({str(self.path) if self.path else None!r}, cache_mb={self.cache_mb})"

    def open(self, job: str, node: str, index: int, segments: int) -> RocksKeyedState:
        """The (empty) state of instance ``index`` of ``node`` in ``job``; its database is made on first use (a
        stateless task never makes one)."""
        rocksdict = _rocksdict()
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="streamlet-rocksdb-")) if self.path is None else self.path
            self._cache = rocksdict.Cache(self.cache_mb * 1024 * 1024)
        folder = self._root / _safe(job) / _safe(node) / str(index)

        def make() -> Any:
            shutil.rmtree(folder, ignore_errors=True)  # a working copy: a restore starts from the checkpoint
            folder.mkdir(parents=True)
            options = rocksdict.Options(raw_mode=True)
            # memtables count against memory too: RocksDB's default (64 MB each) would hold a whole state of
            # that size in memory before a flush; a quarter of the cache each, two at most
            options.set_write_buffer_size(max(1, self.cache_mb // 4) * 1024 * 1024)
            options.set_max_write_buffer_number(2)
            table = rocksdict.BlockBasedOptions()
            table.set_block_cache(self._cache)
            table.set_bloom_filter(10, False)  # a read of a key never written (a new key) skips the files
            options.set_block_based_table_factory(table)
            self.opened.append((job, node, index))
            db = rocksdict.Rdict(str(folder), options)
            unlogged = rocksdict.WriteOptions()
            unlogged.disable_wal = True  # a working copy: what survives a crash is the checkpoint, not this
            db.set_write_options(unlogged)
            return db

        state = RocksKeyedState(RocksValues(make, segments, self.cache_entries), folder)
        self._opened.append(state)
        return state

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


class RocksValues(MutableMapping[Any, Any]):
    """One instance's keyed values in RocksDB behind a write-back cache of decoded values (see the module).

    While ``before`` is a dict (a call under an error policy that replays it runs), the first touch of a key
    keeps its packed value from before the call, so :meth:`take_back` can put it back.
    """

    def __init__(self, make_db: Callable[[], Any], segments: int, cache_entries: int) -> None:
        self._make_db = make_db
        self._db: Any = None
        self.segments = segments
        self.limit = cache_entries
        self.cache: OrderedDict[Any, Any] = OrderedDict()
        self.raw_of: dict[Any, bytes] = {}  # the stored key of each cached key (computed once)
        #: Written back but not yet in the database: stored key -> packed value (``None``: deleted). Written as
        #: one batch once it holds ``WRITE_BATCH`` entries (one RocksDB write per key costs several times more).
        self.pending: dict[bytes, bytes | None] = {}
        self.before: dict[Any, Any] | None = None
        self._missed: tuple[Any, bytes] | None = None  # the last key a get did not find, and its stored key

    @property
    def db(self) -> Any:
        """The database (made now, on first use)."""
        if self._db is None:
            self._db = self._make_db()
        return self._db

    @property
    def made(self) -> bool:
        """Whether the database was made (the state was touched)."""
        return self._db is not None

    def close(self) -> None:
        """Close the database, if one was made."""
        self.cache.clear()
        self.raw_of.clear()
        self.pending.clear()
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- keys ---------------------------------------------------------------------

    def raw_key(self, key: Any) -> bytes:
        """``key`` as stored: its segment, then the key packed."""
        return _SEGMENT.pack(segment_of(key, self.segments)) + packb(key)

    @staticmethod
    def key_of(raw: bytes) -> Any:
        """The key a stored key holds."""
        return unpackb(raw[_SEGMENT.size :])

    # -- the mapping ----------------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        if self.before is not None:
            self._note(key)
        cache = self.cache
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        raw = self.raw_key(key)
        packed = self._stored(raw)
        if packed is None:
            self._missed = (key, raw)  # a get then a put of a new key (a count's first record) packs it once
            return default
        value = unpackb(packed)
        self._remember(key, value, raw)
        return value

    def _stored(self, raw: bytes) -> bytes | None:
        """The packed value stored under ``raw`` (written back or in the database), ``None`` if absent."""
        pending = self.pending
        if raw in pending:
            return pending[raw]
        found: bytes | None = self.db.get(raw)
        return found

    def __contains__(self, key: object) -> bool:
        return key in self.cache or self._stored(self.raw_key(key)) is not None

    def __setitem__(self, key: Any, value: Any) -> None:
        if self.before is not None:
            self._note(key)
        missed = self._missed
        same = missed is not None and type(missed[0]) is type(key) and missed[0] == key  # 1 and 1.0 pack apart
        self._remember(key, value, missed[1] if same and missed is not None else None)
        self._missed = None

    def __delitem__(self, key: Any) -> None:
        self._note(key)
        cached = self.cache.pop(key, _MISSING)
        raw = self.raw_of.pop(key, None) or self.raw_key(key)
        if cached is _MISSING and self._stored(raw) is None:
            raise KeyError(key)
        self._write_back(raw, None)

    def __iter__(self) -> Iterator[Any]:
        """The keys (a list taken now, so the state may change while it is walked)."""
        self.flush()
        return iter([self.key_of(raw) for raw in self.db.keys()])  # noqa: SIM118 - an Rdict, not a dict

    def __len__(self) -> int:
        self.flush()
        return sum(1 for _ in self.db.keys())  # noqa: SIM118 - an Rdict, not a dict

    def items(self) -> Any:  # a generator, not a view
        """Every ``(key, value)``; the values handed out are the cached objects (changes in place persist)."""
        self.flush()
        return self._items()

    def _items(self) -> Iterator[tuple[Any, Any]]:
        cache = self.cache
        for raw, packed in self.db.items():  # RocksDB iterates a snapshot: write-backs meanwhile are fine
            key = self.key_of(raw)
            self._note(key)
            value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = unpackb(packed)
                self._remember(key, value, raw)
            yield key, value

    def values(self) -> Any:
        return (value for _, value in self.items())

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    # -- the cache ------------------------------------------------------------------

    def _remember(self, key: Any, value: Any, raw: bytes | None) -> None:
        cache = self.cache
        if key in cache:
            cache.move_to_end(key)
        elif raw is not None:
            self.raw_of[key] = raw
        cache[key] = value
        if len(cache) > self.limit:
            old, kept = cache.popitem(last=False)
            stored = self.raw_of.pop(old, None) or self.raw_key(old)
            self._write_back(stored, pack_exact(kept, "keyed state"))

    def _write_back(self, raw: bytes, packed: bytes | None) -> None:
        pending = self.pending
        pending[raw] = packed
        if len(pending) >= WRITE_BATCH:
            self._write_pending()

    def _write_pending(self) -> None:
        """Everything written back into the database, as one batch."""
        if not self.pending:
            return
        rocksdict = _rocksdict()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for raw, packed in self.pending.items():
            if packed is None:
                batch.delete(raw)
            else:
                batch.put(raw, packed)
        self.db.write(batch)
        self.pending.clear()

    def flush(self) -> None:
        """Write every cached value back (they stay cached), and whatever waits to be written."""
        raw_of = self.raw_of
        for key, value in self.cache.items():
            stored = raw_of.get(key)
            if stored is None:
                stored = raw_of[key] = self.raw_key(key)
            self.pending[stored] = pack_exact(value, "keyed state")
        self._write_pending()

    # -- taking a failed call back -----------------------------------------------------

    def _note(self, key: Any) -> None:
        before = self.before
        if before is not None and key not in before:
            value = self.cache.get(key, _MISSING)
            if value is not _MISSING:
                before[key] = pack_exact(value, "keyed state")
            else:
                before[key] = self._stored(self.raw_key(key))  # None: absent before the call

    def take_back(self) -> None:
        """Put back every key the call touched as it was before the call."""
        before, self.before = self.before or {}, None
        for key, packed in before.items():
            self.cache.pop(key, None)
            raw = self.raw_of.pop(key, None) or self.raw_key(key)
            self._write_back(raw, packed)


class RocksKeyedState(KeyedState):
    """:class:`KeyedState` whose ``values`` live in RocksDB (:class:`RocksValues`). Its checkpoints have the
    in-memory state's format, so they restore on either backend and regroup by key the same way."""

    __slots__ = ("folder",)

    values: RocksValues  # type: ignore[assignment]

    def __init__(self, values: RocksValues, folder: Path) -> None:
        self.values = values
        self.folder = folder

    def items(self) -> Iterator[tuple[Any, Any]]:
        """This instance's ``(key, value)`` pairs, read as they are walked."""
        return iter(self.values.items())

    def __len__(self) -> int:
        return len(self.values)

    def checkpoint(self) -> bytes:
        """The whole map packed, as the in-memory state packs it."""
        values = self.values
        if not values.made and not values.cache:  # never touched (a stateless task): no database to make
            return pack_exact({}, "keyed state")
        values.flush()
        return pack_exact({values.key_of(raw): unpackb(packed) for raw, packed in values.db.items()}, "keyed state")

    def restore(self, snapshot: bytes) -> None:
        """Replace the contents with a checkpoint's map (of either backend)."""
        values = self.values
        values.cache.clear()
        values.raw_of.clear()
        values.pending.clear()
        values.before = None
        restored = _unpack(snapshot)
        if not values.made and not restored:  # nothing to hold: no database to make
            return
        for raw in list(values.db.keys()):
            values.db.delete(raw)
        rocksdict = _rocksdict()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in restored.items():
            batch.put(values.raw_key(key), pack_exact(value, "keyed state"))
        values.db.write(batch)

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
