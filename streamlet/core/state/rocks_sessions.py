"""Session windows' open sessions in RocksDB (``RocksDBState``): a ``window_reduce`` over a ``SessionWindow`` with
more keys holding sessions than fit in memory (a session per user of a big service).

The session logic (``core.windows.session``) runs unchanged over two stores of its own:

- :class:`SessionChains`: each key's chain of sessions (its ``Session`` objects, linked by start) as one value of
  a RocksDB database, through the write-back cache of keyed state (``RocksValues``), so the chains touched lately
  are objects in memory and the others a row each on disk;
- :class:`RocksAgenda`: the closing and the expiring agendas, as entries ``prefix + tick + stored key`` of a
  second database, so a watermark's sweep is a scan of the front of a range, whatever it passed.

The logic keeps references to the sessions it reads while one of its calls runs (the sessions a batch moved,
those a watermark fires): the cache holds every chain it hands out until the call ends (``holding``), then goes
back within its bound. A whole checkpoint is the logic's own snapshot; an incremental one holds the chains
written since the previous one (:meth:`SessionStore.checkpoint_increment`), which :func:`window_form` reads back
into that snapshot's form for a restore, a split or a join on either backend.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.model.windows import WindowSpec
from streamlet.core.state.changelog import CHANGELOG, Chain, changelog, chunk_entries
from streamlet.core.state.rocks_values import RocksValues, rocksdict_module
from streamlet.core.windows.build import logic_for
from streamlet.core.windows.fold import WindowLogic
from streamlet.core.windows.session import SessionLogic
from streamlet.core.windows.session_agenda import NOTHING, ORDER, Session

_TICK = struct.Struct(">Q")
_TICK_OFFSET = 1 << 63  # ticks may be negative: stored shifted, so byte order is numeric order
_CLOSING, _EXPIRING = b"C", b"X"


def chain_of(key: Any, packed: bytes) -> Session | None:
    """``key``'s chain of sessions from its stored row (:meth:`SessionChains.packed`): the first one."""
    first: Session | None = None
    last: Session | None = None
    for start, end, rank, whole, fired, value, has_value, last_ts, due in unpackb(packed):
        session = Session(key, start, end, rank, whole, None)
        session.fired, session.last_ts, session.due = fired, last_ts, due
        session.value = value if has_value else NOTHING
        if last is None:
            first = session
        else:
            last.next = session
        last = session
    return first


def window_form(logic: WindowLogic | WindowSpec, snapshot: Any) -> Any:
    """A window snapshot in the form ``logic`` (or the logic of a spec) restores: the chains of an incremental
    one (:meth:`SessionLogic.snapshot_increment`: a changelog of stored chains) read into its ``sessions``
    list; any other snapshot as it is."""
    if type(snapshot) is not dict or "chains" not in snapshot:
        return snapshot
    if not isinstance(logic, WindowLogic):
        logic = logic_for(logic)
    if not isinstance(logic, SessionLogic):
        raise ValueError("a window snapshot holds session chains, but the window is not a SessionWindow")
    live: dict[bytes, bytes] = {}
    for chunk in snapshot["chains"][CHANGELOG]:
        for raw, packed in chunk_entries(chunk):
            if packed is None:
                live.pop(raw, None)
            else:
                live[raw] = packed
    sessions = []
    for raw, packed in live.items():
        key = RocksValues.key_of(raw)
        first = chain_of(key, packed)
        if first is not None:
            sessions.append(logic.snapshot_entry(key, first))
    rest = {name: value for name, value in snapshot.items() if name != "chains"}
    return {**rest, "sessions": sessions}


class SessionChains(RocksValues):
    """Each key's chain of sessions: the first ``Session`` (the others by ``next``), stored as one row per
    session ``[start, end, rank, whole, fired, value, has_value, last_ts, due]``."""

    def decoded(self, key: Any, packed: bytes) -> Session | None:
        return chain_of(key, packed)

    def packed(self, value: Any) -> bytes:
        rows = []
        session = value
        while session is not None:
            folded = session.value is not NOTHING
            rows.append([
                session.start, session.end, session.rank, session.whole, session.fired,
                session.value if folded else None, folded, session.last_ts, session.due,
            ])  # fmt: skip
            session = session.next
        return pack_exact(rows, "session windows")


class RocksAgenda:
    """Sessions by the tick they are due at (``core.windows.session_agenda.Agenda``'s API), as entries of a
    database: ``prefix`` + the tick (8 bytes, in numeric order) + the session's stored key. A key's sessions are
    disjoint, so at most one of them is due at a tick on one agenda: the entry finds it in its chain, among the
    open sessions (the closing agenda) or the fired ones (the expiring agenda: ``fired``), since a fired one
    kept for lateness may be due when an open one of its key ends."""

    def __init__(self, database: Callable[[], Any], prefix: bytes, chains: SessionChains, fired: bool) -> None:
        self._database = database
        self.prefix = prefix
        self.fired = fired
        self._end = bytes([prefix[0] + 1])
        self.chains = chains
        self.pending: dict[bytes, bool] = {}  # entry -> put (True) or deleted (False), written in one batch

    def _entry(self, session: Session, when: int) -> bytes:
        return self.prefix + _TICK.pack(when + _TICK_OFFSET) + self.chains.raw_key(session.key)

    def put(self, session: Session, when: int) -> None:
        """Schedule ``session`` (on this agenda or on none) at tick ``when``."""
        if session.due is not None:
            self.remove(session)
        session.due = when
        self.pending[self._entry(session, when)] = True

    def put_ends(self, sessions: list[Session]) -> None:
        """Schedule each of ``sessions`` at its end, unless it is there already."""
        for session in sessions:
            if session.due != session.end:
                self.put(session, session.end)

    def remove(self, session: Session) -> None:
        """Take ``session`` off this agenda (it is on it)."""
        assert session.due is not None
        self.pending[self._entry(session, session.due)] = False
        session.due = None

    def pop_through(self, tick: float, limit: int | None = None) -> list[Session]:
        """Sessions due at or before ``tick`` by tick, start and key rank, taken off the agenda: all of them, or
        the first ticks' once they are ``limit`` sessions or more (a tick's sessions go together)."""
        self.write()
        chains, cursor = self.chains, self._database().iter()
        due_at: list[tuple[int, bytes]] = []
        cursor.seek(self.prefix)
        while cursor.valid():
            entry: bytes = cursor.key()
            if entry >= self._end:
                break
            when = _TICK.unpack_from(entry, 1)[0] - _TICK_OFFSET
            if when > tick or (limit is not None and len(due_at) >= limit and when != due_at[-1][0]):
                break
            due_at.append((when, entry))
            cursor.next()
        del cursor
        if not due_at:
            return []
        self._database().delete_range(due_at[0][1], due_at[-1][1] + b"\x00")
        taken: list[Session] = []
        through: list[Session] = []
        at = due_at[0][0]
        for when, entry in due_at:
            if when != at:
                through.sort(key=ORDER)
                taken += through
                through, at = [], when
            session = chains.get(chains.key_of(entry[1 + _TICK.size :]))
            while session is not None and (session.due != when or session.fired is not self.fired):
                session = session.next
            assert session is not None, "an agenda entry without its session"
            session.due = None
            through.append(session)
        through.sort(key=ORDER)
        return taken + through

    def first(self) -> int | None:
        """The earliest tick a session is due at, if any."""
        self.write()
        cursor = self._database().iter()
        cursor.seek(self.prefix)
        if not cursor.valid() or cursor.key() >= self._end:
            return None
        when: int = _TICK.unpack_from(cursor.key(), 1)[0] - _TICK_OFFSET
        return when

    def write(self) -> None:
        """What waits to be written, into the database as one batch."""
        if not self.pending:
            return
        batch = rocksdict_module().WriteBatch(raw_mode=True)
        for entry, present in self.pending.items():
            if present:
                batch.put(entry, b"")
            else:
                batch.delete(entry)
        self._database().write(batch)
        self.pending.clear()

    def clear(self) -> None:
        """Forget every entry."""
        self.pending.clear()
        self._database().delete_range(self.prefix, self._end)


class SessionStore:
    """One task instance's sessions in RocksDB: the chains in one database, both agendas in another (both made
    at first use, emptied by :meth:`reset`)."""

    def __init__(self, make_db: Callable[[Path], Any], folder: Path, segments: int, cache_entries: int) -> None:
        self._make_db = make_db
        self.folder = folder
        self._agenda_db: Any = None
        self.chains = SessionChains(lambda: make_db(folder / "chains"), segments, cache_entries)
        self.chains.holding = True  # released by the logic at the end of each of its calls
        self.chain = Chain()  # the chunks the last incremental checkpoint of the chains restores from
        self.closing = RocksAgenda(self._agendas, _CLOSING, self.chains, fired=False)
        self.expiring = RocksAgenda(self._agendas, _EXPIRING, self.chains, fired=True)

    def _agendas(self) -> Any:
        if self._agenda_db is None:
            self._agenda_db = self._make_db(self.folder / "agendas")
        return self._agenda_db

    def release(self) -> None:
        """A call of the logic ended: the chains' cache back within its bound, the agendas written."""
        self.chains.release()
        self.closing.write()
        self.expiring.write()

    @contextmanager
    def walking(self) -> Iterator[None]:
        """A walk over every session that changes none (a snapshot, a restore, the end of the stream): the
        chains are read through the cache without being held on to, so memory stays within its bound."""
        self.release()
        self.chains.holding = False
        try:
            yield
        finally:
            self.chains.holding = True

    def checkpoint_increment(self) -> Any:
        """The chains that changed since the previous checkpoint, as an increment of their chain of chunks, or
        a full chunk of them all that starts a new chain (:meth:`~streamlet.core.state.changelog.Chain.next`);
        an empty changelog while no session ever opened."""
        chains = self.chains
        if not chains.made and not chains.cache and not chains.pending:
            return changelog([], chains.segments)
        chains.flush()
        changed = chains.take_changed()
        return self.chain.next(None if changed is None else changed.items(), chains.db.items, chains.segments)

    def reset(self) -> None:
        """Forget every session (a restore or the end of the stream follows): the next checkpoint is a full
        one."""
        self.chain.clear()
        self.chains.reset()
        self.closing.pending.clear()
        self.expiring.pending.clear()
        if self._agenda_db is not None:
            self._agenda_db.close()
            self._agenda_db = None

    def keys(self) -> Iterator[Any]:
        """The keys that hold sessions."""
        return iter(self.chains)

    def close(self) -> None:
        """Close both databases and remove their folder (the job ended)."""
        self.reset()
        self.chains.close()
        shutil.rmtree(self.folder, ignore_errors=True)
