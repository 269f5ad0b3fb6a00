"""Brute-force model of keyed state with a time to live, docs/state.md ("State TTL"), written from the
documentation alone.

With ``state_ttl=seconds`` every entry of a task's state "expires that many seconds of the job clock
after it was last written: reading it then gives the default, as for a key never written, and it is
left out of checkpoints". "The write times are checkpointed too, so expiry goes on where it was after a
restore (state checkpointed before the task had a TTL counts as written at the restore)".

So the model is a plain dict of ``key -> (value, time of the last put)`` and decides at every call, from
the current clock time alone, whether an entry is live. It never reclaims anything: when memory is
reclaimed is not observable through ``get``, ``put`` and ``delete`` (the page: "Memory is reclaimed as
the task uses its state, at O(1) a read or write, and at every checkpoint"), so the model need not say.
The ``values`` dict ("itself is not timed") is outside the model: what it shows depends on when memory
is reclaimed.

Decisions where the page is silent
----------------------------------

1. The boundary. An entry written at ``w`` is expired at ``now`` iff ``now >= w + ttl``: at exactly
   ``ttl`` seconds it is gone. The prose ("expire that many seconds ... after it was last written")
   does not say which side of the instant the entry is on; the example does ("149 is 60 s after the
   write at 89: Ann starts again"). For fractional times the comparison is ``now >= w + ttl`` as
   floats (not ``now - w >= ttl``, which can differ by one ulp).
2. Only ``put`` (re)starts an entry's clock. A ``get`` does not refresh it ("after it was last
   written"), nor does changing a value got from ``get`` in place, nor a checkpoint or a restore of a
   checkpoint that has write times. Every ``put`` is a write, even of an equal value or of the same
   object.
3. ``delete`` of an absent or expired key is allowed and does nothing. After a ``delete`` the key reads
   as never written; a later ``put`` starts a fresh clock. The page does not describe ``delete`` at
   all beyond naming it.
4. A listing (``items``) shows exactly the live entries at ``now``: an expired entry is left out as it
   is left out of ``get`` and of checkpoints. The page names no listing; "reading it then gives the
   default" is the sentence this extends. The order of a listing is not part of the model.
5. A checkpoint saves the live entries and, for exactly those keys, their write times (unchanged, as
   absolute job-clock times). Expired entries leave neither a value nor a write time ("it is left out
   of checkpoints" speaks only of the entry). Taking a checkpoint changes nothing in the state.
6. A restore keeps the saved write times as they are, on the job clock of the restored job, and applies
   the restoring task's ``ttl`` to them (if the TTL changed, the new one counts from the saved write
   times). An entry whose time has run out by the restore's ``now`` is restored expired: it reads as
   the default. Write times later than ``now`` are kept, not clamped. ("expiry goes on where it was
   after a restore" is the sentence; it does not say what happens if the clock of the new run is
   elsewhere or the TTL differs.)
7. ``written=None`` (a checkpoint taken before the task had a TTL): every restored entry counts as
   written at the restore's ``now`` (the page's parenthesis). A key with a value but no write time in a
   non-``None`` ``written`` is treated the same way: written at the restore. A write time for a key
   that has no value in the checkpoint is ignored: there is no entry to time, and a later ``put``
   starts a fresh clock.
8. ``ttl`` must be a number > 0 ("``state_ttl`` must be a number > 0"); the model raises
   ``ValueError`` (the job raises ``TopologyError``) for ``ttl <= 0``, NaN, a bool or a non-number.
   ``float("inf")`` is a number > 0 and is accepted: nothing ever expires.
9. The job clock does not go back: within one model (from its creation or restore on) every call's
   ``now`` is >= the previous call's, and the model raises ``ValueError`` otherwise. A restore may
   happen at any ``now`` (see 6). The page does not say the clock is monotonic; a model that allowed it
   to go back would have to say whether a reclaimed entry comes back to life.
10. Values are stored as given (``get`` returns the stored object); a checkpoint saves a deep copy, and
    a restore takes a deep copy, as a serialised checkpoint would.
"""

from __future__ import annotations

import copy
import math
from typing import Any


class TtlModel:
    """Keyed state whose entries expire ``ttl`` seconds of the job clock after their last ``put``.

    Every method takes the job clock's time ``now`` of the call; expiry is decided afresh at each call
    from the stored write time (see the module docstring for the decisions the page leaves open).
    """

    def __init__(self, ttl: float) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or math.isnan(ttl) or not ttl > 0:
            raise ValueError(f"ttl must be a number > 0, got {ttl!r}")
        self.ttl: float = ttl
        self._entries: dict[Any, tuple[Any, float]] = {}
        self._now: float = -math.inf

    # ------------------------------------------------------------------------------------ helpers

    def _tick(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"the clock went back: {now!r} after {self._now!r}")
        self._now = now

    def _live(self, written: float, now: float) -> bool:
        return now < written + self.ttl

    # ------------------------------------------------------------------------------------ state

    def put(self, key: Any, value: Any, now: float) -> None:
        """Write ``value`` under ``key`` at clock time ``now``: its clock starts again at ``now``."""
        self._tick(now)
        self._entries[key] = (value, now)

    def get(self, key: Any, default: Any, now: float) -> Any:
        """The value of ``key`` at ``now``, or ``default`` if never written, deleted or expired."""
        self._tick(now)
        entry = self._entries.get(key)
        if entry is None or not self._live(entry[1], now):
            return default
        return entry[0]

    def delete(self, key: Any, now: float) -> None:
        """Remove ``key``; nothing happens if it is absent or expired."""
        self._tick(now)
        self._entries.pop(key, None)

    def items(self, now: float) -> dict[Any, Any]:
        """The live entries at ``now`` (``key -> value``)."""
        self._tick(now)
        return {key: value for key, (value, written) in self._entries.items() if self._live(written, now)}

    # ------------------------------------------------------------------------------------ checkpoints

    def checkpoint(self, now: float) -> tuple[dict[Any, Any], dict[Any, float]]:
        """What a checkpoint at ``now`` saves: the live entries' values and their write times."""
        self._tick(now)
        values: dict[Any, Any] = {}
        written: dict[Any, float] = {}
        for key, (value, at) in self._entries.items():
            if self._live(at, now):
                values[key] = copy.deepcopy(value)
                written[key] = at
        return values, written

    @classmethod
    def restored(cls, ttl: float, values: dict[Any, Any], written: dict[Any, float] | None, now: float) -> TtlModel:
        """The state after a restore at ``now`` from a checkpoint's ``(values, written)``.

        ``written=None`` is a checkpoint taken before the task had a TTL: every entry counts as written
        at ``now``; so does an entry whose key ``written`` lacks. Saved write times are kept as they are,
        so an entry may come back already expired.
        """
        model = cls(ttl)
        model._tick(now)
        times = written if written is not None else {}
        for key, value in values.items():
            model._entries[key] = (copy.deepcopy(value), times.get(key, now))
        return model
