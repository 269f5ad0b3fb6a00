"""One RocksDB state instance's values as a mapping: stored keys by segment, a write-back cache of decoded
values, batched writes, the changelog an incremental checkpoint takes, and the journal that takes a failed call
back (``core.state.rocks`` has the backend and the state around it)."""

from __future__ import annotations

import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import msgpack

from streamlet.core.model.encoding import pack_exact, packb, unpackb
from streamlet.core.model.segments import segment_of, spread
from streamlet.errors import StreamletError

_SEGMENT = struct.Struct(">H")
_MISSING: Any = object()
_IMMUTABLE = frozenset({int, float, str, bytes, bool, type(None)})  # values nobody can change in place
_SCALARS = _IMMUTABLE  # values plain msgpack packs as the state codec does
WRITE_BATCH = 1024  # values written back that go to the database together


def rocksdict_module() -> Any:
    """The ``rocksdict`` module (an error naming the extra when it is not installed)."""
    try:
        import rocksdict
    except ImportError as exc:  # pragma: no cover - the extra is part of every install made by the Makefile
        raise StreamletError("RocksDBState needs rocksdict: pip install 'streamlet[rocksdb]'") from exc
    return rocksdict


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


class RocksValues(MutableMapping[Any, Any]):
    """One instance's keyed values in RocksDB behind a write-back cache of decoded values (``core.state.rocks``
    says why).

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
        #: Whether every value handed out stays cached until :meth:`release` (their holder changes them through
        #: references it keeps across reads of other keys).
        self.holding = False

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

    def reset(self) -> None:
        """Forget everything: the database (the next use makes a fresh one), the cache, what waits to be
        written, a call's journal and the changelog (so the next checkpoint is a full one)."""
        self.close()
        self.before = None
        self._missed = None
        self.changed = None

    def close(self) -> None:
        """Close the database, if one was made."""
        self.forget_all()
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
        value = self.decoded(key, packed)
        self._remember(key, value, raw)
        self.as_stored[key] = packed
        return value

    def decoded(self, key: Any, packed: bytes) -> Any:
        """``key``'s value from its stored bytes (what :meth:`packed` made of it)."""
        return unpackb(packed)

    def _stored(self, raw: bytes) -> bytes | None:
        """The packed value stored under ``raw`` (written back or in the database), ``None`` if absent."""
        pending = self.pending
        if raw in pending:
            return pending[raw]
        found: bytes | None = self.db.get(raw)
        return found

    def holds(self, raw: bytes) -> bool:
        """Whether a value is stored under the stored key ``raw`` (a cached value counts once written back:
        call after :meth:`flush`)."""
        return self._stored(raw) is not None

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

    def discard(self, key: Any, raw: bytes) -> None:
        """Delete ``key`` (stored as ``raw``) without reading it first: no error when it is absent."""
        self._note(key)
        self.cache.pop(key, None)
        self.as_stored.pop(key, None)
        self.raw_of.pop(key, None)
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

    def _stored_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every stored key and packed value (RocksDB iterates a snapshot: write-backs meanwhile are fine)."""
        return iter(self.db.items())

    def _items(self) -> Iterator[tuple[Any, Any]]:
        cache = self.cache
        for raw, packed in self._stored_items():
            key = self.key_of(raw)
            self._note(key)
            value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = self.decoded(key, packed)
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
        if len(cache) > self.limit and not self.holding:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        """The least recently used cached value out of the cache, written back if it changed."""
        old, kept = self.cache.popitem(last=False)
        stored = self.raw_of.pop(old, None) or self.raw_key(old)
        packed = self.packed(kept)
        if self.as_stored.pop(old, None) != packed:
            self._write_back(stored, packed)

    def release(self) -> None:
        """Back within the cache's bound: while ``holding``, nothing was pushed out (the values handed out
        are still referenced by whoever holds them, and changed through those references)."""
        while len(self.cache) > self.limit:
            self._evict_oldest()

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
        rocksdict = rocksdict_module()
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

    def forget(self, gone: Callable[[bytes], bool]) -> None:
        """Drop from the cache every key whose stored key ``gone`` says left the database (moved to another
        instance by range): nothing of it is written back. Call after :meth:`flush`."""
        for key in list(self.cache):
            raw = self.raw_of.get(key)
            if gone(self.raw_key(key) if raw is None else raw):
                del self.cache[key]
                self.raw_of.pop(key, None)
                self.as_stored.pop(key, None)
        self._missed = None

    def forget_all(self) -> None:
        """Empty the cache and what waits to be written (nothing of it goes into the database)."""
        self.cache.clear()
        self.raw_of.clear()
        self.as_stored.clear()
        self.pending.clear()

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
