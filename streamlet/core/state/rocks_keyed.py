"""One RocksDB task instance's keyed state (``self.state``): its checkpoints as changelogs, whole or
incremental, its restore, and its hand-over of key segments by range (``core.state.rocks`` has the backend
that opens it, ``core.state.rocks_values`` the values behind it)."""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from streamlet.core.state.changelog import (
    CHANGELOG,
    Chain,
    changelog,
    chunk_entries,
    is_changelog,
    pack_chunk,
)
from streamlet.core.state.keyed import KeyedState, _unpack
from streamlet.core.state.rocks_values import RocksValues, rocksdict_module

RESTORE_BATCH = 10_000  # entries a restore writes together


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


def _untouched(values: RocksValues) -> bool:
    """Whether ``values`` never held anything: no database made, nothing cached and nothing waiting to be written
    (a value pushed out of the cache waits there before any database exists)."""
    return not values.made and not values.cache and not values.pending


class RocksKeyedState(KeyedState):
    """:class:`KeyedState` whose ``values`` live in RocksDB (:class:`RocksValues`). Its checkpoints are
    changelogs (``core.state.changelog``), whole or incremental; either backend restores and regroups both
    backends' checkpoints."""

    __slots__ = ("chain", "folder")

    values: RocksValues  # type: ignore[assignment]

    def __init__(self, values: RocksValues, folder: Path) -> None:
        self.values = values
        self.folder = folder
        self.chain = Chain()  # the chunks the last incremental checkpoint restores from

    def items(self) -> Iterator[tuple[Any, Any]]:
        """This instance's ``(key, value)`` pairs, read as they are walked."""
        return iter(self.values.items())

    def __len__(self) -> int:
        return len(self.values)

    def checkpoint(self) -> dict[str, Any]:
        """The whole state as a changelog of one chunk (``core.state.changelog``), read as it is packed."""
        values = self.values
        if _untouched(values):  # a stateless task: no database to make
            return changelog([], values.segments)
        values.flush()
        return changelog([pack_chunk(values.db.items())], values.segments)

    def checkpoint_increment(self) -> Any:
        """What changed since the previous checkpoint, as an :class:`~streamlet.core.state.changelog.Increment`
        (its chain names the chunks to restore from), or a full chunk that starts a new chain: when there is no
        chain yet (the first checkpoint, or one after a restore or a hand-over), or as
        :meth:`~streamlet.core.state.changelog.Chain.next` decides."""
        values = self.values
        if _untouched(values):
            return changelog([], values.segments)
        values.flush()
        changed = values.take_changed()
        return self.chain.next(None if changed is None else changed.items(), values.db.items, values.segments)

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
        if _untouched(values):
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
