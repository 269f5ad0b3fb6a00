"""Keyed state with a time to live in RocksDB: what a task with ``state_ttl`` gets on a RocksDB backend.

The values live in the instance's state database as without a TTL (``core.state.rocks``). Each key's last write
time lives in a second database of the instance, twice: under ``W`` + the stored key (the time, packed with the
state codec) and under ``E`` + the time in byte order + the stored key, so the entries that expired are the
front of the ``E`` range whatever order the clock wrote them in (a clock that went back included). Memory holds
the write times not yet written there (at most ``WRITE_BATCH``, then one batch) and a lower bound of the
earliest time held, so an access checks one number and sweeps only when something may have expired: an
expired entry is never read, and a checkpoint, which sweeps first, never saves one.

The semantics are :class:`~streamlet.core.state.expiring.ExpiringState`'s: an entry written at ``t`` reads
as absent once ``now - t >= ttl``. A checkpoint's write times are a changelog of the ``W`` entries
(``core.state.changelog``), written whole, which either backend restores.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from streamlet.core.model.encoding import unpackb
from streamlet.core.state.changelog import changelog, is_changelog, pack_chunk
from streamlet.core.state.keyed import StateSnapshot, _unpack
from streamlet.core.state.rocks_keyed import RocksKeyedState
from streamlet.core.state.rocks_timers import sortable
from streamlet.core.state.rocks_values import WRITE_BATCH, RocksValues, rocksdict_module

_WRITTEN, _EXPIRES = b"W", b"E"
_PAST_WRITTEN, _PAST_EXPIRES = b"X", b"F"  # the least keys after every ``W`` and every ``E`` key
_NOTHING = float("inf")
_ABSENT: Any = object()  # a journal's mark: the key had no write time before the call


class RocksExpiringState(RocksKeyedState):
    """:class:`RocksKeyedState` whose entries expire ``ttl`` seconds of ``now()`` after their last write.

    Go through :meth:`get`, :meth:`put` and :meth:`delete` (as with the in-memory ``ExpiringState``): a write
    made straight into ``values`` is not timed.
    """

    __slots__ = ("_earliest", "_make_stamps", "_now", "_stamps", "fresh", "stamps_before", "stamps_folder", "ttl")

    ttl: float  # never None here

    def __init__(
        self,
        values: RocksValues,
        folder: Path,
        ttl: float,
        now: Callable[[], float],
        make_stamps: Callable[[], Any],
        stamps_folder: Path,
    ) -> None:
        super().__init__(values, folder)
        self.ttl = ttl
        self._now = now
        self._make_stamps = make_stamps
        self._stamps: Any = None
        self.stamps_folder = stamps_folder
        #: Write times not yet in the database: stored key -> time (``None``: the key was deleted).
        self.fresh: dict[bytes, float | None] = {}
        #: No write time held (here or in ``fresh``) is earlier: nothing expires before ``_earliest + ttl``.
        self._earliest = _NOTHING
        #: While a call runs under a replaying error policy: each touched key's write time before it.
        self.stamps_before: dict[bytes, Any] | None = None

    # -- the store's API -------------------------------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        """The value stored for ``key``, or ``default`` (also once it expired)."""
        self._expire(self._now())
        return self.values.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` for ``key``; it expires ``ttl`` seconds from now."""
        now = self._now()
        self._expire(now)
        values = self.values
        values[key] = value
        self._stamp(values.raw_of.get(key) or values.raw_key(key), now)

    def delete(self, key: Any) -> None:
        """Forget ``key``; no error when it is absent."""
        self._expire(self._now())
        values = self.values
        raw = values.raw_of.get(key) or values.raw_key(key)
        values.discard(key, raw)
        self._stamp(raw, None)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The ``(key, value)`` pairs that have not expired."""
        self._expire(self._now())
        return super().items()

    def __len__(self) -> int:
        self._expire(self._now())
        return super().__len__()

    # -- checkpoints -------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """Like :meth:`RocksKeyedState.checkpoint`, without the expired entries (swept first)."""
        self._expire(self._now())
        return super().checkpoint()

    def checkpoint_increment(self) -> Any:
        """Like :meth:`RocksKeyedState.checkpoint_increment`, without the expired entries (swept first)."""
        self._expire(self._now())
        return super().checkpoint_increment()

    def checkpoint_written(self) -> dict[str, Any]:
        """The write times of the entries :meth:`checkpoint` saw: a changelog of ``stored key -> time``."""
        # no sweep here (as ``ExpiringState``'s): the checkpoint swept at its own time, and a clock that went on
        # since would drop the write time of an entry its values hold, which a restore would count as new
        segments = self.values.segments
        self._write_stamps()
        if self._stamps is None:
            return changelog([], segments)
        return changelog([pack_chunk(self._scan(_WRITTEN, _PAST_WRITTEN, strip=1))], segments)

    def restore(self, snapshot: Any) -> None:
        """Replace the contents with a checkpoint's (of either backend); every entry counts as written now
        until :meth:`restore_written` says otherwise."""
        super().restore(snapshot)
        self._forget_stamps()
        now = self._now()
        if self.values.made:
            for raw in self.values.db.keys():  # noqa: SIM118 - an Rdict, not a dict
                self._stamp(raw, now)

    def restore_written(self, snapshot: StateSnapshot | dict[str, Any] | None) -> None:
        """Take the write times back from :meth:`checkpoint_written`'s data (or the in-memory state's), so
        expiry goes on where it was; ``None`` (a checkpoint taken without ``state_ttl``) leaves every entry
        written at the restore."""
        if snapshot is None or not self.values.made:
            return
        values = self.values
        if is_changelog(snapshot):
            assert isinstance(snapshot, dict)
            entries: Iterator[tuple[bytes, Any]] = (
                (raw, None if packed is None else unpackb(packed)) for raw, packed in self._entries(snapshot)
            )
        else:
            entries = ((values.raw_key(key), stamp) for key, stamp in _unpack(snapshot).items())
        values.flush()
        for raw, stamp in entries:
            if stamp is not None and values.holds(raw):  # a key the state holds
                self._stamp(raw, stamp)
        self._expire(self._now())

    # -- expiry ---------------------------------------------------------------------------

    def _stamp(self, raw: bytes, stamp: float | None) -> None:
        """``raw``'s write time is ``stamp`` from now on (``None``: it has none, it was deleted)."""
        if self.stamps_before is not None:
            self._note_stamp(raw)
        fresh = self.fresh
        fresh[raw] = stamp
        if stamp is not None and stamp < self._earliest:
            self._earliest = stamp
        if len(fresh) >= WRITE_BATCH:
            self._write_stamps()

    def _expire(self, now: float) -> None:
        """Delete every entry that expired by ``now``; one comparison when none can have."""
        if now - self._earliest < self.ttl:
            return
        self._write_stamps()
        ttl, values, batch = self.ttl, self.values, rocksdict_module().WriteBatch(raw_mode=True)
        earliest = _NOTHING
        cursor = self._stamps.iter()
        cursor.seek(_EXPIRES)
        while cursor.valid():
            position: bytes = cursor.key()
            if position >= _PAST_EXPIRES:
                break
            stamp = unpackb(cursor.value())
            if now - stamp < ttl:
                earliest = stamp
                break
            raw = position[1 + 8 :]
            if self.stamps_before is not None:
                self._note_stamp(raw)
            values.discard(values.key_of(raw), raw)
            batch.delete(position)
            batch.delete(_WRITTEN + raw)
            cursor.next()
        del cursor
        self._stamps.write(batch)
        self._earliest = earliest

    def _write_stamps(self) -> None:
        """The write times in ``fresh`` into the database (each key's old ``E`` entry goes), as one batch."""
        fresh = self.fresh
        if not fresh:
            return
        if self._stamps is None:
            self._stamps = self._make_stamps()
        raws = list(fresh)
        olds = self._stamps.get([_WRITTEN + raw for raw in raws])
        batch = rocksdict_module().WriteBatch(raw_mode=True)
        packer = msgpack.Packer(use_bin_type=True)
        for raw, old in zip(raws, olds, strict=True):
            if old is not None:
                batch.delete(_EXPIRES + sortable(unpackb(old)) + raw)
            stamp = fresh[raw]
            if stamp is None:
                batch.delete(_WRITTEN + raw)
            else:
                packed = packer.pack(stamp)
                batch.put(_WRITTEN + raw, packed)
                batch.put(_EXPIRES + sortable(stamp) + raw, packed)
        self._stamps.write(batch)
        fresh.clear()

    def _scan(self, low: bytes, high: bytes, strip: int) -> Iterator[tuple[bytes, bytes]]:
        """The stamps database's entries from ``low`` up to ``high``, each key without its first ``strip``
        bytes."""
        cursor = self._stamps.iter()
        cursor.seek(low)
        while cursor.valid():
            key: bytes = cursor.key()
            if key >= high:
                return
            yield key[strip:], cursor.value()
            cursor.next()

    def _stored_stamp(self, raw: bytes) -> float | None:
        if raw in self.fresh:
            return self.fresh[raw]
        if self._stamps is None:
            return None
        packed = self._stamps.get(_WRITTEN + raw)
        return None if packed is None else float(unpackb(packed))

    def _forget_stamps(self) -> None:
        """No write time held any more (the database goes; the next one is made fresh)."""
        self.fresh.clear()
        self._earliest = _NOTHING
        self.stamps_before = None
        if self._stamps is not None:
            self._stamps.close()
            self._stamps = None

    # -- taking a failed call back ----------------------------------------------------------

    def _note_stamp(self, raw: bytes) -> None:
        before = self.stamps_before
        assert before is not None
        if raw not in before:
            stamp = self._stored_stamp(raw)
            before[raw] = _ABSENT if stamp is None else stamp

    def take_back_stamps(self) -> None:
        """Put the write times the failed call changed back as they were."""
        before, self.stamps_before = self.stamps_before or {}, None
        for raw, stamp in before.items():
            self._stamp(raw, None if stamp is _ABSENT else stamp)

    def close(self) -> None:
        """Close both databases and remove their folders."""
        super().close()
        self._forget_stamps()
        shutil.rmtree(self.stamps_folder, ignore_errors=True)
