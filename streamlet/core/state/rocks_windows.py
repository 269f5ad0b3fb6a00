"""Open time windows' folded values in RocksDB (``RocksDBState``): a ``window_reduce`` over more keys than fit
in memory.

Each open window of a fold (``window_reduce`` on a tumbling or sliding time window) keeps its value per key in
a range of one database per task instance: a prefix of its own (8 bytes, a number given when the window
opened, never reused), then the key as the keyed state lays it out (segment, packed key). Reads and writes go
through the same write-back cache as keyed state (:class:`~streamlet.core.state.rocks_values.RocksValues`),
one per open window. When a window fires, its values are read out in the order of that layout (a fired window
emits them all at once, so they are in memory then anyway) and its range is deleted. Checkpoints read the open
windows whole, as the in-memory windows are checkpointed; a restore writes them back.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator
from typing import Any

from streamlet.core.state.rocks_values import RocksValues

_PREFIX = struct.Struct(">Q")


class WindowValues(RocksValues):
    """One open window's values: :class:`RocksValues` over the range ``prefix`` of a shared database."""

    def __init__(self, database: Callable[[], Any], prefix: bytes, segments: int, cache_entries: int) -> None:
        super().__init__(database, segments, cache_entries)
        self.prefix = prefix
        self._end = _PREFIX.pack(_PREFIX.unpack(prefix)[0] + 1)

    def raw_key(self, key: Any) -> bytes:
        return self.prefix + super().raw_key(key)

    def key_of(self, raw: bytes) -> Any:  # type: ignore[override]
        return RocksValues.key_of(raw[len(self.prefix) :])

    def _range(self) -> Iterator[tuple[bytes, bytes]]:
        cursor = self.db.iter()
        cursor.seek(self.prefix)
        end = self._end
        while cursor.valid():
            raw = cursor.key()
            if raw >= end:
                return
            yield raw, cursor.value()
            cursor.next()

    def __iter__(self) -> Iterator[Any]:
        self.flush()
        return iter([self.key_of(raw) for raw, _ in self._range()])

    def __len__(self) -> int:
        self.flush()
        return sum(1 for _ in self._range())

    def _stored_items(self) -> Iterator[tuple[bytes, bytes]]:
        return self._range()

    def take_out(self) -> dict[Any, Any]:
        """The window's values (it fired), in the order of the layout; its range goes."""
        values = dict(self.items())
        self.drop()
        return values

    def drop(self) -> None:
        """Forget the window: its range deleted, its cache emptied (nothing written back)."""
        self.forget_all()
        if self._db is not None:
            self._db.delete_range(self.prefix, self._end)
        self._db = None  # the database is the store's: never closed here

    def close(self) -> None:
        self.drop()


class WindowStore:
    """The open windows of one task instance's fold, each a :class:`WindowValues` range of one database (made
    when the first window opens)."""

    def __init__(self, make_db: Callable[[], Any], segments: int, cache_entries: int) -> None:
        self._make_db = make_db
        self._db: Any = None
        self.segments = segments
        self.cache_entries = cache_entries
        self._numbers = itertools.count()

    def _database(self) -> Any:
        if self._db is None:
            self._db = self._make_db()
        return self._db

    def folded(self) -> WindowValues:
        """An empty range for a window opening now."""
        prefix = _PREFIX.pack(next(self._numbers))
        return WindowValues(self._database, prefix, self.segments, self.cache_entries)

    def close(self) -> None:
        """Close the database (the job ended); the backend removes its folder."""
        if self._db is not None:
            self._db.close()
            self._db = None
