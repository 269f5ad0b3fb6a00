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
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import msgpack

from streamlet.core.model.encoding import pack_exact, packb, unpackb
from streamlet.core.model.segments import segment_of, spread
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
from streamlet.errors import StreamletError

_SEGMENT = struct.Struct(">H")
_MISSING: Any = object()
_IMMUTABLE = frozenset({int, float, str, bytes, bool, type(None)})  # values nobody can change in place
_SCALARS = _IMMUTABLE  # values plain msgpack packs as the state codec does
DEFAULT_CACHE_ENTRIES = 4096
WRITE_BATCH = 1024  # values written back that go to the database together
RESTORE_BATCH = 10_000  # entries a restore writes together
MAX_CHAIN = 64
"""Chunks at most in an incremental checkpoint's chain (a full one and its increments): what a restore reads."""


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

        values = RocksValues(make, segments, self.cache_entries, changelog_limit=self.cache_mb << 20)
        state = RocksKeyedState(values, folder)
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


def stored_form(key: Any) -> Any:
    """The form a key is stored in, so that keys Python holds equal are one key, as in a dict (and as
    ``SAME_KEY`` routing holds them): ``True`` and ``1.0`` are stored as ``1``, also inside a tuple. A key
    read back from the database (``items()``) comes in this form."""
    kind = type(key)
    if kind is str or kind is int or kind is bytes:
        return key
    if kind is bool or (kind is float and key.is_integer()):
        return int(key)
    if kind is tuple:
        return tuple(stored_form(part) for part in key)
    return key


def _safe(name: str) -> str:
    """A node or job name as one folder name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


class RocksValues(MutableMapping[Any, Any]):
    """One instance's keyed values in RocksDB behind a write-back cache of decoded values (see the module).

    While ``before`` is a dict (a call under an error policy that replays it runs), the first touch of a key
    keeps its packed value from before the call, so :meth:`take_back` can put it back.
    """

    def __init__(
        self, make_db: Callable[[], Any], segments: int, cache_entries: int, changelog_limit: int = 64 << 20
    ) -> None:
        self._make_db = make_db
        self._db: Any = None
        self._pack = msgpack.Packer(use_bin_type=True).pack  # its own: instances may run in threads
        self.segments = segments
        self.limit = cache_entries
        self.cache: OrderedDict[Any, Any] = OrderedDict()
        self.raw_of: dict[Any, bytes] = {}  # the stored key of each cached key (computed once)
        #: A cached key's value as the database holds it (packed): a value packed the same is not written back
        #: (a read-mostly key costs no write, and a checkpoint's changelog holds the keys that changed).
        self.as_stored: dict[Any, bytes] = {}
        #: Written back but not yet in the database: stored key -> packed value (``None``: deleted). Written as
        #: one batch once it holds ``WRITE_BATCH`` entries (one RocksDB write per key costs several times more).
        self.pending: dict[bytes, bytes | None] = {}
        self.before: dict[Any, Any] | None = None
        self._missed: tuple[Any, bytes] | None = None  # the last key a get did not find, and its stored key
        #: What went into the database since the last checkpoint took it (stored key -> packed value, ``None``:
        #: deleted), for an incremental checkpoint; ``None`` once it held more than ``changelog_limit`` bytes
        #: (then the next checkpoint is a full one).
        self.changed: dict[bytes, bytes | None] | None = None  # kept from the first incremental checkpoint on
        self.changed_bytes = 0
        self.changelog_limit = changelog_limit

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
        self.as_stored.clear()
        self.pending.clear()
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- keys ---------------------------------------------------------------------

    def raw_key(self, key: Any) -> bytes:
        """``key`` as stored: its segment, then the key packed in its stored form (:func:`stored_form`)."""
        kind = type(key)
        if kind is str or kind is bytes or (kind is int and -(1 << 63) <= key < 1 << 64):
            # packed once: these pack as SAME_KEY routing hashes them, so the segment comes from the same bytes
            packed: bytes = self._pack(key)
            return _SEGMENT.pack(spread(zlib.crc32(packed), self.segments)) + packed
        return _SEGMENT.pack(segment_of(key, self.segments)) + packb(stored_form(key))

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
        self.as_stored[key] = packed
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
        self.as_stored.pop(key, None)
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
                if type(value) not in _IMMUTABLE:  # it may be changed in place: cached, so that the change stays
                    self._remember(key, value, raw)
                    self.as_stored[key] = packed
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
            packed = self.packed(kept)
            if self.as_stored.pop(old, None) != packed:
                self._write_back(stored, packed)

    def packed(self, value: Any) -> bytes:
        """``value`` packed with the state codec (a plain scalar by this instance's own packer: the same bytes)."""
        if type(value) in _SCALARS:
            try:
                found: bytes = self._pack(value)
                return found
            except OverflowError:
                pass  # an int past 64 bits: the codec's own extension type
        return pack_exact(value, "keyed state")

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
        self._note_changed()
        self.pending.clear()

    def _note_changed(self) -> None:
        changed = self.changed
        if changed is None:
            return
        changed.update(self.pending)
        self.changed_bytes += sum(len(raw) + len(packed or b"") for raw, packed in self.pending.items())
        if self.changed_bytes > self.changelog_limit:  # bounded memory: the next checkpoint is a full one
            self.changed = None

    def take_changed(self) -> dict[bytes, bytes | None] | None:
        """What went into the database since the last call (``None``: too much to keep, or not kept before
        the first call); keeps it from now on, afresh."""
        changed, self.changed, self.changed_bytes = self.changed, {}, 0
        return changed

    def flush(self) -> None:
        """Write back every cached value that changed (they stay cached), and whatever waits to be written."""
        raw_of, as_stored = self.raw_of, self.as_stored
        for key, value in self.cache.items():
            packed = self.packed(value)
            if as_stored.get(key) == packed:
                continue
            stored = raw_of.get(key)
            if stored is None:
                stored = raw_of[key] = self.raw_key(key)
            self.pending[stored] = as_stored[key] = packed
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
            self.as_stored.pop(key, None)
            raw = self.raw_of.pop(key, None) or self.raw_key(key)
            self._write_back(raw, packed)


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
        values.before = None
        self.chain.clear()
        whole = snapshot if is_changelog(snapshot) else None
        if whole is None:
            restored = _unpack(snapshot)
            entries: Iterator[tuple[bytes, bytes | None]] = (
                (values.raw_key(key), pack_exact(value, "keyed state")) for key, value in restored.items()
            )
            chunks_empty = not restored
        else:
            entries = self._entries(whole)
            chunks_empty = not any(whole[CHANGELOG])
        if values.made:
            values.close()  # a fresh database: emptying one key by key costs as much as filling it
        else:
            values.cache.clear()
            values.raw_of.clear()
            values.as_stored.clear()
            values.pending.clear()
        values._missed = None
        values.changed = None  # the next checkpoint is a full one
        if chunks_empty:
            return
        rocksdict = _rocksdict()
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
