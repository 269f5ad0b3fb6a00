"""Keyed state with a time to live: what a task added with ``add_task(..., state_ttl=seconds)`` gets.

A subclass used only with a TTL, so :class:`~streamlet.core.state.keyed.KeyedState`
pays nothing for it. Each entry remembers when it was last written (the job
clock's time); ``ttl`` seconds later it reads as absent, is left out of
checkpoints, and its memory is reclaimed.

Reclaiming is cheap because the write times are kept in write order (an
``OrderedDict``, moved to the end on every write): the expired entries are
a prefix, so every access drops what expired at the front and stops at the
first live entry, O(1) amortized. Should the clock ever go back, an expired
entry can sit behind a live one; reads check their own entry, and a
checkpoint sweeps everything, so nothing expired is ever read or saved.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from streamlet.core.model.encoding import pack_exact
from streamlet.core.state.keyed import KeyedState, StateSnapshot, _unpack


class ExpiringState(KeyedState):
    """:class:`KeyedState` whose entries expire ``ttl`` seconds of ``now()`` after their last write.

    Go through :meth:`get`, :meth:`put` and :meth:`delete`: the ``values``
    dict itself holds expired entries until they are swept, and a write
    made straight into it is not timed (it never expires).

    Example:
        >>> clock = [0.0]
        >>> state = ExpiringState(10.0, lambda: clock[0])
        >>> state.put("a", 1)
        >>> clock[0] = 9.5
        >>> state.get("a")
        1
        >>> clock[0] = 10.0
        >>> state.get("a", "expired")
        'expired'
    """

    __slots__ = ("_now", "ttl", "written")

    ttl: float  # never None here

    def __init__(self, ttl: float, now: Callable[[], float], values: dict[Any, Any] | None = None) -> None:
        super().__init__(values)
        self.ttl = ttl
        self._now = now
        #: key -> the clock's time of its last write, oldest first.
        self.written: OrderedDict[Any, float] = OrderedDict()
        self._stamp_all(now())

    def get(self, key: Any, default: Any = None) -> Any:
        """The value stored for ``key``, or ``default`` (also once it expired)."""
        now = self._now()
        self._sweep_front(now)
        stamp = self.written.get(key)
        if stamp is not None and now - stamp >= self.ttl:
            self.delete(key)
            return default
        return self.values.get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` for ``key``; it expires ``ttl`` seconds from now."""
        now = self._now()
        self.values[key] = value
        written = self.written
        written[key] = now
        written.move_to_end(key)
        self._sweep_front(now)

    def delete(self, key: Any) -> None:
        """Forget ``key``; no error when it is absent."""
        self.values.pop(key, None)
        self.written.pop(key, None)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The ``(key, value)`` pairs that have not expired."""
        self._sweep_all(self._now())
        return super().items()

    def __len__(self) -> int:
        self._sweep_all(self._now())
        return len(self.values)

    def checkpoint(self) -> StateSnapshot:
        """Like :meth:`KeyedState.checkpoint`, without the expired entries (swept first)."""
        self._sweep_all(self._now())
        return super().checkpoint()

    def checkpoint_written(self) -> bytes:
        """The write times of the entries :meth:`checkpoint` saw, as bytes (a key -> time map)."""
        return pack_exact(dict(self.written), "keyed state write times")

    def restore(self, snapshot: StateSnapshot) -> None:
        """Replace the contents with :meth:`checkpoint`'s data; every entry counts as written now
        until :meth:`restore_written` says otherwise."""
        super().restore(snapshot)
        self.written = OrderedDict()
        self._stamp_all(self._now())

    def restore_written(self, snapshot: bytes | None) -> None:
        """Take the write times back from :meth:`checkpoint_written`'s data, so expiry goes on where it was.

        ``None`` (a checkpoint taken without ``state_ttl``) leaves every entry
        written at the restore.
        """
        if snapshot is None:
            return
        saved = _unpack(snapshot)
        now = self._now()
        stamps = sorted(((saved.get(key, now), key) for key in self.values), key=lambda pair: pair[0])
        self.written = OrderedDict((key, stamp) for stamp, key in stamps)
        self._sweep_all(now)

    def _stamp_all(self, now: float) -> None:
        for key in self.values:
            if key not in self.written:
                self.written[key] = now

    def _sweep_front(self, now: float) -> None:
        """Drop the entries that expired at the old end of the write order; stop at the first live one."""
        written, values, ttl = self.written, self.values, self.ttl
        while written:
            key, stamp = next(iter(written.items()))
            if now - stamp < ttl:
                return
            written.popitem(last=False)
            values.pop(key, None)

    def _sweep_all(self, now: float) -> None:
        """Drop every expired entry, in whatever order the clock wrote them (O(n): for checkpoints and listing)."""
        ttl = self.ttl
        for key in [key for key, stamp in self.written.items() if now - stamp >= ttl]:
            self.delete(key)
