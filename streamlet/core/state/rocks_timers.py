"""Timers in RocksDB (``RocksDBState``): a task instance's pending timers on disk, not in its memory.

The same :class:`~streamlet.core.model.timers.Timers` a task sees, kept in a database of their own (made at
the first timer set), so a timer per key of a state bigger than memory costs disk, not memory. Two ranges:

- the firing order: ``b"F"``, the time domain (one byte), ``when`` as a sortable 8-byte float, the order it
  was set in (8 bytes, big-endian) -> ``[key, when]`` packed exactly (so ``pending`` gives back the key and
  the time as they were set);
- the live timers: ``b"L"``, the time domain, the key packed in its stored form (keys Python holds equal are
  one key, as for the state), ``when`` sortable -> the order, so setting a timer again changes nothing and
  cancelling one finds its place in the firing order.

Checkpoints are those of :class:`Timers` (every pending timer, whole), so either kind restores the other's.
"""

from __future__ import annotations

import itertools
import shutil
import struct
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from streamlet.core.model import world
from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.model.timers import TIME_DOMAINS, TimeDomain, Timers, _check_when
from streamlet.core.state.rocks_values import stored_form

_DOUBLE = struct.Struct(">d")
_ORDER = struct.Struct(">Q")
_FIRING, _LIVE = b"F", b"L"
_DOMAIN = {"event": b"\x00", "processing": b"\x01"}
_PAST_DOMAIN = b"\xff" * 17  # after every firing entry of a domain (when and order are 16 bytes)


def sortable(when: float) -> bytes:
    """``when`` as 8 bytes whose byte order is its numeric order (IEEE 754, sign flipped; negatives inverted)."""
    raw = _DOUBLE.pack(float(when))
    if raw[0] & 0x80:
        return bytes(255 - byte for byte in raw)
    return bytes([raw[0] | 0x80]) + raw[1:]


class RocksTimers(Timers):
    """:class:`Timers` kept in RocksDB. ``make_db`` opens the (empty) database at the first timer set;
    ``folder`` is where it lives (removed by :meth:`close`)."""

    __slots__ = ("_db", "_folder", "_make_db", "_sequence")

    def __init__(self, make_db: Callable[[], Any], folder: Path, now: Callable[[], float] = world.wall_time) -> None:
        super().__init__(now)
        self._make_db = make_db
        self._folder = folder
        self._db: Any = None
        self._sequence = itertools.count()

    @property
    def db(self) -> Any:
        """The database (made now, on first use)."""
        if self._db is None:
            self._db = self._make_db()
        return self._db

    # -- what a task calls -------------------------------------------------------

    def at(self, key: Any, when: float, time: TimeDomain = "event") -> None:
        domain = self._domain(time)
        when = _check_when(when)
        live = self._live_key(domain, key, when)
        db = self.db
        if db.get(live) is not None:
            return
        order = next(self._sequence)
        db[live] = _ORDER.pack(order)
        db[_firing_key(domain, when, order)] = pack_exact([key, when], "timers", "timer")
        if self._undo_log is not None:
            self._undo_log.append((time, key, when, None))

    def cancel(self, key: Any, when: float, time: TimeDomain = "event") -> None:
        domain = self._domain(time)
        when = _check_when(when)
        if self._db is None:
            return
        live = self._live_key(domain, key, when)
        found = self._db.get(live)
        if found is None:
            return
        order = _ORDER.unpack(found)[0]
        del self._db[live]
        del self._db[_firing_key(domain, when, order)]
        if self._undo_log is not None:
            self._undo_log.append((time, key, when, order))

    def pending(self, key: Any = None) -> list[tuple[Any, float, TimeDomain]]:
        entries = []
        for time in TIME_DOMAINS:
            for when_bytes, order, (found, when) in self._firing(_DOMAIN[time]):
                if key is None or found == key:
                    entries.append((when_bytes, order, found, when, time))
        entries.sort(key=lambda entry: (entry[0], entry[1]))
        return [(found, when, time) for _, _, found, when, time in entries]

    # -- what the runtime calls --------------------------------------------------

    def next_due(self, time: TimeDomain) -> float | None:
        first = next(self._firing(_DOMAIN[time]), None)
        return None if first is None else first[2][1]

    def last_due(self, time: TimeDomain) -> float | None:
        if self._db is None:
            return None
        domain = _DOMAIN[time]
        cursor = self._db.iter()
        cursor.seek_for_prev(_FIRING + domain + _PAST_DOMAIN)
        if not cursor.valid() or not cursor.key().startswith(_FIRING + domain):
            return None
        when: float = unpackb(cursor.value())[1]
        return when

    def due(self, time: TimeDomain, until: float) -> Generator[tuple[Any, float], None, None]:
        """As :meth:`Timers.due`: each timer due is removed, then yielded; one set again during the pass at a
        slot it already fired stays for the next pass."""
        domain = _DOMAIN[time]
        fired: set[bytes] = set()
        while True:
            taken = None
            for when_bytes, order, (key, when) in self._firing(domain):  # from the start: the callback may
                if when > until:  # have set an earlier one
                    break
                live = self._live_key(domain, key, when)
                if live in fired:
                    continue  # set again by a callback of this pass: the next pass takes it
                taken = (live, _FIRING + domain + when_bytes + _ORDER.pack(order), key, when)
                break
            if taken is None:
                return
            live, firing, key, when = taken
            del self.db[live]
            del self.db[firing]
            fired.add(live)
            yield key, when

    def clear(self) -> None:
        """Forget every timer: the database goes (the next timer set makes a fresh one)."""
        self.close()

    def take_back(self) -> None:
        """Undo what was set or cancelled since :meth:`start_undo_log`, newest first; stop noting."""
        log, self._undo_log = self._undo_log or [], None
        for time, key, when, order in reversed(log):
            domain = _DOMAIN[time]
            live = self._live_key(domain, key, when)
            if order is None:  # set by the call: gone again
                found = self.db.get(live)
                if found is not None:
                    del self.db[live]
                    del self.db[_firing_key(domain, when, _ORDER.unpack(found)[0])]
            else:  # cancelled by the call: pending again, in its old place in the firing order
                self.db[live] = _ORDER.pack(order)
                self.db[_firing_key(domain, when, order)] = pack_exact([key, when], "timers", "timer")

    def close(self) -> None:
        """Close the database, if one was made, and remove its folder."""
        if self._db is not None:
            self._db.close()
            self._db = None
        shutil.rmtree(self._folder, ignore_errors=True)

    # -- the layout ------------------------------------------------------------------

    def _firing(self, domain: bytes) -> Generator[tuple[bytes, int, list[Any]], None, None]:
        """``(when bytes, order, [key, when])`` of the domain's timers in firing order."""
        if self._db is None:
            return
        prefix = _FIRING + domain
        cursor = self._db.iter()
        cursor.seek(prefix)
        while cursor.valid():
            raw = cursor.key()
            if not raw.startswith(prefix):
                return
            yield raw[2:10], _ORDER.unpack(raw[10:18])[0], unpackb(cursor.value())
            cursor.next()

    @staticmethod
    def _live_key(domain: bytes, key: Any, when: float) -> bytes:
        return _LIVE + domain + pack_exact(stored_form(key), "timers", "timer key") + sortable(when)

    @staticmethod
    def _domain(time: str) -> bytes:
        try:
            return _DOMAIN[time]
        except (KeyError, TypeError):
            raise ValueError(f"time must be 'event' or 'processing', got {time!r}") from None


def _firing_key(domain: bytes, when: float, order: int) -> bytes:
    return _FIRING + domain + sortable(when) + _ORDER.pack(order)
