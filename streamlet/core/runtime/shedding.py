"""Load shedding at a source instance: a share of its records is dropped (to its ``SHED`` port) or held.

The share (``ratio``) is set by the shed policy from outside; records are
shed evenly through the stream (every k-th, by a running credit), so no key
or stretch of time is singled out. Held records (``recover``) are replayed
once the ratio is back at 0 (and when the source ends or is stopped), and
are part of the source's checkpoint, so a restore loses none of them; they
must be msgpack-encodable, as checkpointed state is. Nothing bounds how many
are held: ``max_shed_ratio`` is the bound on the share, the overload's length
on the count.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from streamlet.core.model.record import Batch, Element

HELD = "streamlet.held"  # the key of a source snapshot that carries held records beside the reader's position
REPLAY_PATIENCE = 0.01  # seconds a read may wait while held records are replayed, before the replay goes on


class Shedder:
    """Sheds ``ratio`` of one source instance's records; ``recover``: hold them for a replay."""

    __slots__ = ("_credit", "held", "preserve_order", "ratio", "recover")

    def __init__(self, recover: bool = False, preserve_order: bool = False) -> None:
        self.ratio = 0.0
        self.recover = recover
        self.preserve_order = preserve_order
        self.held: deque[Element] = deque()
        self._credit = 0.0

    def split(self, batch: Batch) -> tuple[Batch, Batch]:
        """``batch`` as (kept, shed): every record adds ``ratio`` to a credit, and one whose credit reaches 1
        is shed (the credit carries over from batch to batch)."""
        ratio = self.ratio
        if ratio <= 0:
            return batch, []
        kept: Batch = []
        shed: Batch = []
        credit = self._credit
        for record in batch:
            credit += ratio
            if credit >= 1.0:
                credit -= 1.0
                shed.append(record)
            else:
                kept.append(record)
        self._credit = credit
        return kept, shed

    def replaying(self) -> bool:
        """Held records wait and nothing is being shed: the replay is on."""
        return self.ratio <= 0 and bool(self.held)

    def take_held(self, count: int) -> Batch:
        """Up to ``count`` held records, oldest first."""
        held = self.held
        return [held.popleft() for _ in range(min(count, len(held)))]

    def snapshot(self, position: Any) -> Any:
        """The source's checkpoint: its reader's ``position``, and the held records when there are any."""
        if not self.held:
            return position
        return {HELD: [[e[0], e[1], e[2]] for e in self.held], "position": position}


def split_snapshot(snapshot: Any) -> tuple[Any, Batch]:
    """A source snapshot as (the reader's position, the elements it held)."""
    if isinstance(snapshot, dict) and HELD in snapshot:
        return snapshot.get("position"), [(key, value, ts) for key, value, ts in snapshot[HELD]]
    return snapshot, []
