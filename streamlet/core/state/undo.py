"""Taking back what a failed call did to its instance's keyed state, timers and TTL bookkeeping.

Under ``on_error="skip"`` or ``"restart"`` the runtime calls ``execute`` (or
``on_timer``) again after a failure: the failing record alone for ``skip``,
the whole batch for ``restart``. Whatever the failed call changed must be
undone first, or its writes count twice. :class:`CallUndo` does that: while a
call runs, the first time it touches a key, through ``get``/``put``/
``delete`` or the ``values`` dict itself, the key's previous value is kept
(immutable values as they are, anything else packed with the state codec, so
a list changed in place comes back as it was); a failure puts those values
back, a success forgets them.

Only tasks whose error policy replays get this: ``on_error="fail"`` keeps the
plain dict and pays nothing. The built-in shortcuts (``map``, ``reduce``, ...)
report the failing record themselves and write state only after the user's
function returned, so they keep the plain dict too (see
:func:`~streamlet.core.model.task.leaves_nothing_on_failure`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from streamlet.core.model.kept import keep, put_back
from streamlet.core.model.timers import Timers
from streamlet.core.state.expiring import ExpiringState
from streamlet.core.state.keyed import KeyedState, StateSnapshot
from streamlet.core.state.rocks_expiring import RocksExpiringState

_MISSING: Any = object()  # the key was absent before the call


class JournaledValues(dict[Any, Any]):
    """A task's ``state.values`` that remembers, while a call runs, each key's value before the call.

    ``before`` is ``None`` between calls (nothing is kept); :class:`CallUndo` sets it for a call.
    """

    __slots__ = ("before", "order_before")

    def __init__(self, values: Iterable[tuple[Any, Any]] | dict[Any, Any] = ()) -> None:
        super().__init__(values)
        self.before: dict[Any, Any] | None = None
        #: The keys in their order before the call's first removal: a key put back goes to the end of a
        #: dict, and the order is what ``items()`` (a task's ``finish``) walks. ``None``: nothing removed.
        self.order_before: list[Any] | None = None

    def _note_order(self) -> None:
        if self.before is not None and self.order_before is None:
            self.order_before = list(dict.keys(self))

    def _note(self, key: Any) -> None:
        before = self.before
        if before is not None and key not in before:
            value = dict.get(self, key, _MISSING)
            before[key] = value if value is _MISSING else keep(value)

    def _note_all(self) -> None:
        if self.before is not None:
            for key in list(dict.keys(self)):
                self._note(key)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)  # a read too: the value may be changed in place
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return dict.get(self, key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._note(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        self._note(key)
        self._note_order()
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._note(key)
        self._note_order()
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        if dict.__len__(self):
            self._note(next(reversed(self)))
            self._note_order()
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return dict.setdefault(self, key, default)

    def update(self, *others: Any, **more: Any) -> None:
        if self.before is None:  # between calls (a rescale hands keys over): nothing to keep
            dict.update(self, *others, **more)
            return
        for key, value in dict(*others, **more).items():
            self[key] = value

    def __ior__(self, other: Any) -> JournaledValues:  # type: ignore[misc]
        self.update(other)
        return self

    def clear(self) -> None:
        self._note_all()
        self._note_order()
        dict.clear(self)

    def items(self) -> Any:
        self._note_all()  # the values are handed out: any may be changed in place
        return dict.items(self)

    def values(self) -> Any:
        self._note_all()
        return dict.values(self)

    def take_back(self) -> None:
        """Put back every key the call touched, in the order the keys had."""
        before = self.before or {}
        for key, kept in before.items():
            if kept is _MISSING:
                dict.pop(self, key, None)
            else:
                dict.__setitem__(self, key, put_back(kept))
        before.clear()
        order, self.order_before = self.order_before, None
        if order is not None and list(dict.keys(self)) != order:  # keys removed and put back: the old order
            values = dict(self)
            dict.clear(self)
            # every key removed went through a method that noted the order first; keys the call added before
            # its first removal are gone again
            dict.update(self, ((key, values[key]) for key in order if key in values))


class UndoableState(KeyedState):
    """:class:`KeyedState` whose ``values`` is a :class:`JournaledValues`, also after a restore."""

    __slots__ = ()

    def __init__(self, values: dict[Any, Any] | None = None) -> None:
        super().__init__(JournaledValues(values or {}))

    def restore(self, snapshot: StateSnapshot) -> None:
        """Replace the contents with a checkpoint's data (still journaled)."""
        super().restore(snapshot)
        self.values = JournaledValues(self.values)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """This instance's ``(key, value)`` pairs (each kept for an undo first, as they may be changed)."""
        return iter(list(self.values.items()))


class UndoableExpiringState(ExpiringState):
    """:class:`ExpiringState` whose values and write times a failed call's undo puts back."""

    __slots__ = ("stamps_before",)

    def __init__(self, ttl: float, now: Callable[[], float], values: dict[Any, Any] | None = None) -> None:
        self.stamps_before: dict[Any, Any] | None = None
        super().__init__(ttl, now, JournaledValues(values or {}))

    def restore(self, snapshot: StateSnapshot) -> None:
        """Replace the contents with a checkpoint's data (still journaled)."""
        super().restore(snapshot)
        self.values = JournaledValues(self.values)

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` for ``key`` (its old value and write time kept while a call runs)."""
        self.note_stamp(key)
        super().put(key, value)

    def delete(self, key: Any) -> None:
        """Forget ``key`` (its old value and write time kept while a call runs)."""
        self.note_stamp(key)
        super().delete(key)

    # (the full sweep needs no override: it removes each entry through ``delete``, which keeps its write time)

    def _sweep_front(self, now: float) -> None:
        if self.stamps_before is not None:  # the expired prefix is about to go: keep its write times
            for key, stamp in self.written.items():
                if now - stamp < self.ttl:
                    break
                self.note_stamp(key)
        super()._sweep_front(now)

    def note_stamp(self, key: Any) -> None:
        """Keep ``key``'s write time before the call's first change to it."""
        stamps = self.stamps_before
        if stamps is not None and key not in stamps:
            stamps[key] = self.written.get(key, _MISSING)

    def take_back_stamps(self) -> None:
        """Put the write times back as they were, oldest first again."""
        stamps = self.stamps_before or {}
        if not stamps:
            return
        written = self.written
        for key, stamp in stamps.items():
            if stamp is _MISSING:
                written.pop(key, None)
            else:
                written[key] = stamp
        self.written = OrderedDict(sorted(written.items(), key=lambda pair: pair[1]))
        stamps.clear()


UndoableStore = UndoableState | UndoableExpiringState
TIMED_UNDO = (UndoableExpiringState, RocksExpiringState)  # stores whose write times a failed call's undo puts back


def undoable_state(ttl: float | None, now: Callable[[], float]) -> UndoableStore:
    """The keyed state of a task whose failed calls are taken back (with a TTL when ``ttl`` is set)."""
    return UndoableState() if ttl is None else UndoableExpiringState(ttl, now)


class CallUndo:
    """Brackets one user call: :meth:`begin` before it, then :meth:`take_back` if it raised, else :meth:`forget`.

    Example:
        >>> state, timers = UndoableState(), Timers(lambda: 0.0)
        >>> undo = CallUndo(state, timers)
        >>> state.put("a", [1])
        >>> undo.begin()
        >>> state.get("a").append(2); state.put("b", 1); timers.at("a", 5.0)
        >>> undo.take_back()
        >>> state.values, timers.pending()
        ({'a': [1]}, [])
    """

    __slots__ = ("state", "timers")

    def __init__(self, state: KeyedState, timers: Timers) -> None:
        self.state = state  # an undoable store, or one that journals itself (``RocksKeyedState``)
        self.timers = timers

    def begin(self) -> None:
        """A call starts: keep what it changes from now on."""
        values: Any = self.state.values
        assert hasattr(values, "take_back")  # an undoable store's values always journal
        values.before = {}
        if isinstance(self.state, TIMED_UNDO):
            self.state.stamps_before = {}
        self.timers.start_undo_log()

    def take_back(self) -> None:
        """The call failed: its state, TTL and timer changes are undone."""
        values: Any = self.state.values
        values.take_back()
        values.before = None
        if isinstance(self.state, TIMED_UNDO):
            self.state.take_back_stamps()
            self.state.stamps_before = None
        self.timers.take_back()

    def forget(self) -> None:
        """The call succeeded: its changes stand."""
        values: Any = self.state.values
        values.before = None
        if isinstance(values, JournaledValues):
            values.order_before = None
        if isinstance(self.state, TIMED_UNDO):
            self.state.stamps_before = None
        self.timers.stop_undo_log()
