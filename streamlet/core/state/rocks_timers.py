"""Timers in RocksDB (``RocksDBState``): a task instance's pending timers on disk, not in its memory.

The same :class:`~streamlet.core.model.timers.Timers` a task sees, kept in a database of their own (made at
the first timer set), so a timer per key of a state bigger than memory costs disk, not memory. Two ranges:

- the firing order: ``b"F"``, the time domain (one byte), ``when`` as 16 bytes whose order is its exact
  numeric order (the nearest float, sortable, then what a whole number differs from it by), the order it was
  set in (8 bytes, big-endian) -> ``[key, when]`` packed exactly (so ``pending`` gives back the key and the
  time as they were set);
- the live timers: ``b"L"``, the time domain, the key packed in its stored form (keys Python holds equal are
  one key, as for the state), ``when`` packed in one form for equal numbers (``5``, ``5.0``, ``-0.0`` and
  ``0``) -> the order, so setting a timer again changes nothing and cancelling one finds its place in the
  firing order.

Fired and cancelled timers leave deletion markers at the front of the firing order until RocksDB compacts
them away; each domain keeps a key at or before its first live timer (``_low``), where every read of the
firing order starts, so a pass over N timers reads N entries, not N² markers.

Checkpoints are those of :class:`Timers` (every pending timer, whole), so either kind restores the other's.
"""

from __future__ import annotations

import itertools
import shutil
import struct
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, cast

from streamlet.core.model import world
from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.model.timers import TIME_DOMAINS, TimeDomain, Timers, _check_when
from streamlet.core.state.changelog import CHANGELOG, Chain, chunk_entries, is_changelog
from streamlet.core.state.rocks_values import stored_form

_DOUBLE = struct.Struct(">d")
_ORDER = struct.Struct(">Q")
_OFFSET = struct.Struct(">Q")
_FIRING, _LIVE = b"F", b"L"
_PAST_FIRING = b"G"  # the least key after every firing entry
_DOMAIN = {"event": b"\x00", "processing": b"\x01"}
_WHEN = 16  # bytes of a firing key's when
_PAST_DOMAIN = b"\xff" * (_WHEN + _ORDER.size + 1)  # after every firing entry of a domain
_WHOLE_LIMIT = 1 << 63  # whole-number whens RocksDB's timers keep exactly


def sortable(when: float) -> bytes:
    """``when`` as 8 bytes whose byte order is its numeric order (IEEE 754, sign flipped; negatives inverted;
    ``-0.0`` as ``0.0``)."""
    raw = _DOUBLE.pack(float(when) + 0.0)
    if raw[0] & 0x80:
        return bytes(255 - byte for byte in raw)
    return bytes([raw[0] | 0x80]) + raw[1:]


def exact_order(when: float) -> bytes:
    """``when`` as 16 bytes in its exact numeric order: the nearest float (:func:`sortable`), then how far a
    whole number is from it (a float is 0 from itself), so whole numbers past 2**53 keep their order."""
    if type(when) is int:
        if not -_WHOLE_LIMIT < when < _WHOLE_LIMIT:
            raise TypeError(f"a timer's when on RocksDB must be within ±2**63 seconds, got {when!r}")
        return sortable(when) + _OFFSET.pack(when - int(float(when)) + _WHOLE_LIMIT)
    return sortable(when) + _OFFSET.pack(_WHOLE_LIMIT)


def _one_form(when: float) -> Any:
    """``when`` in one form for numbers Python holds equal (a float that is whole, as the int it equals)."""
    if type(when) is float and when.is_integer() and -_WHOLE_LIMIT < when < _WHOLE_LIMIT:
        return int(when)
    return when


class RocksTimers(Timers):
    """:class:`Timers` kept in RocksDB. ``make_db`` opens the (empty) database at the first timer set;
    ``folder`` is where it lives (removed by :meth:`close`)."""

    __slots__ = (
        "_db",
        "_folder",
        "_low",
        "_make_db",
        "_sequence",
        "chain",
        "changed",
        "changed_bytes",
        "changelog_limit",
    )

    def __init__(
        self,
        make_db: Callable[[], Any],
        folder: Path,
        now: Callable[[], float] = world.wall_time,
        changelog_limit: int = 64 << 20,
    ) -> None:
        super().__init__(now)
        self._make_db = make_db
        self._folder = folder
        self._db: Any = None
        self._sequence = itertools.count()
        self._low = {domain: _FIRING + domain for domain in _DOMAIN.values()}  # at or before each first live timer
        self.chain = Chain()  # the chunks the last incremental checkpoint restores from
        #: The firing entries set (packed ``[key, when]``) or gone (``None``) since the last incremental
        #: checkpoint; ``None`` before the first one, or once it held more than ``changelog_limit`` bytes (then
        #: the next checkpoint is a full one).
        self.changed: dict[bytes, bytes | None] | None = None
        self.changed_bytes = 0
        self.changelog_limit = changelog_limit

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
        hash(key)  # an unhashable key is refused, as the in-memory timers refuse it
        live = self._live_key(domain, key, when)
        db = self.db
        if db.get(live) is not None:
            return
        self._put(domain, live, key, when, next(self._sequence))
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
        self._gone(_firing_key(domain, when, order))
        if self._undo_log is not None:
            self._undo_log.append((time, key, when, order))

    def pending(self, key: Any = None) -> list[tuple[Any, float, TimeDomain]]:
        entries = []
        for time in TIME_DOMAINS:
            for firing, order, (found, when) in self._firing(_DOMAIN[time]):
                if key is None or found == key:
                    entries.append((firing[2 : 2 + _WHEN], order, found, when, time))
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
            for firing, _, (key, when) in self._firing(domain):  # from the first live one: the callback may
                if when > until:  # have set an earlier one
                    break
                live = self._live_key(domain, key, when)
                if live in fired:
                    continue  # set again by a callback of this pass: the next pass takes it
                taken = (live, firing, key, when)
                break
            if taken is None:
                return
            live, firing, key, when = taken
            del self.db[live]
            self._gone(firing)
            fired.add(live)
            yield key, when

    def clear(self) -> None:
        """Forget every timer: the database goes (the next timer set makes a fresh one)."""
        self.close()
        self._low = {domain: _FIRING + domain for domain in _DOMAIN.values()}
        self.chain.clear()
        self.changed = None

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
                    self._gone(_firing_key(domain, when, _ORDER.unpack(found)[0]))
            else:  # cancelled by the call: pending again, in its old place in the firing order
                self._put(domain, live, key, when, order)

    def close(self) -> None:
        """Close the database, if one was made, and remove its folder."""
        if self._db is not None:
            self._db.close()
            self._db = None
        shutil.rmtree(self._folder, ignore_errors=True)

    # -- incremental checkpoints --------------------------------------------------------

    def checkpoint_increment(self) -> Any:
        """What changed since the previous checkpoint: an :class:`~streamlet.core.state.changelog.Increment` of
        firing entries (``F`` + domain + when + order -> ``[key, when]``), or a full chunk of them that starts a
        new chain (:meth:`~streamlet.core.state.changelog.Chain.next`). Never set a timer: the in-memory form."""
        if self._db is None and not self.chain.names:
            return self.checkpoint()
        changed, self.changed, self.changed_bytes = self.changed, {}, 0
        return self.chain.next(None if changed is None else changed.items(), self._firing_entries, 0)

    def restore(self, snapshot: Any) -> None:
        """Replace the timers with a checkpoint's (either form, :func:`timer_list`); the next incremental
        checkpoint is a full one."""
        super().restore(timer_list(snapshot))
        self.chain.clear()
        self.changed = None

    def _firing_entries(self) -> Iterator[tuple[bytes, bytes]]:
        """Every firing entry, as stored."""
        if self._db is None:
            return
        cursor = self._db.iter()
        cursor.seek(_FIRING)
        while cursor.valid() and cursor.key() < _PAST_FIRING:
            yield cursor.key(), cursor.value()
            cursor.next()

    def _note(self, firing: bytes, packed: bytes | None) -> None:
        changed = self.changed
        if changed is None:
            return
        changed[firing] = packed
        self.changed_bytes += len(firing) + len(packed or b"")
        if self.changed_bytes > self.changelog_limit:  # bounded memory: the next checkpoint is a full one
            self.changed = None

    def _gone(self, firing: bytes) -> None:
        del self.db[firing]
        self._note(firing, None)

    # -- the layout ------------------------------------------------------------------

    def _firing(self, domain: bytes) -> Generator[tuple[bytes, int, list[Any]], None, None]:
        """``(firing key, order, [key, when])`` of the domain's timers in firing order (from its low mark,
        moved up to the first live one found: the markers before it are never read again)."""
        if self._db is None:
            return
        prefix = _FIRING + domain
        cursor = self._db.iter()
        cursor.seek(self._low[domain])
        first = True
        while cursor.valid():
            raw = cursor.key()
            if not raw.startswith(prefix):
                break
            if first:
                self._low[domain], first = raw, False
            yield raw, _ORDER.unpack_from(raw, 2 + _WHEN)[0], unpackb(cursor.value())
            cursor.next()
        if first:  # none live: the next one set lowers the mark to itself
            self._low[domain] = prefix + _PAST_DOMAIN

    def _put(self, domain: bytes, live: bytes, key: Any, when: float, order: int) -> None:
        firing = _firing_key(domain, when, order)
        self.db[live] = _ORDER.pack(order)
        packed = pack_exact([key, when], "timers", "timer")
        self.db[firing] = packed
        self._note(firing, packed)
        if firing < self._low[domain]:
            self._low[domain] = firing

    @staticmethod
    def _live_key(domain: bytes, key: Any, when: float) -> bytes:
        packed_key = pack_exact(stored_form(key), "timers", "timer key")
        return _LIVE + domain + packed_key + pack_exact(_one_form(when), "timers", "timer when")

    @staticmethod
    def _domain(time: str) -> bytes:
        try:
            return _DOMAIN[time]
        except (KeyError, TypeError):
            raise ValueError(f"time must be 'event' or 'processing', got {time!r}") from None


def _firing_key(domain: bytes, when: float, order: int) -> bytes:
    return _FIRING + domain + exact_order(when) + _ORDER.pack(order)


_TIME_OF = {domain: time for time, domain in _DOMAIN.items()}


def timer_list(snapshot: Any) -> bytes | None:
    """A timers snapshot in the in-memory timers' form (``Timers.checkpoint``: ``[time, when, key]`` in firing
    order): a changelog of RocksDB's firing entries (``RocksTimers.checkpoint_increment``) is read into it; the
    in-memory form (or ``None``) is given back as it is."""
    if not is_changelog(snapshot):
        return cast("bytes | None", snapshot)
    live: dict[bytes, bytes] = {}
    for chunk in snapshot[CHANGELOG]:
        for firing, packed in chunk_entries(chunk):
            if packed is None:
                live.pop(firing, None)
            else:
                live[firing] = packed
    # by when, then the order they were set in, across both domains: as ``Timers.pending`` lists them
    ordered = sorted(live.items(), key=lambda entry: entry[0][2:])
    entries = []
    for firing, packed in ordered:
        key, when = unpackb(packed)
        entries.append([_TIME_OF[firing[1:2]], when, key])
    return pack_exact(entries, "timers", "timer list")
