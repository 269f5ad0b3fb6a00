"""What every window logic shares: closed windows, the logic interface, folding and snapshots."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from streamlet.core.model.encoding import hashable
from streamlet.core.model.record import Batch
from streamlet.core.model.windows import FoldHow

_MISSING: Any = object()


@dataclass(slots=True)
class ClosedWindow:
    """A window: its bounds and its records per input port (or, when folding, its value per key)."""

    start: float
    end: float
    records: dict[int, Batch]
    folded: dict[Any, Any] | None = field(default=None)
    last_ts: float | None = None  # event time of the last record folded in
    #: Why it is handed to the task now: ``"on_time"`` (its end passed), ``"early"`` (a trigger fired before
    #: that) or ``"late"`` (a record came within ``allowed_lateness`` after it fired). Set by the logic.
    firing: str = "on_time"
    #: The results as the built-in ``window_reduce`` emits them, made by a logic told so (``emits_results``);
    #: such a window may stand for many fired together (``start``/``end`` then span them). ``None``: not made.
    results: Batch | None = None
    #: The results as one columnar batch (a columnar window's: see ``core/windows/columnar.py``), emitted as
    #: it is. ``None``: not made.
    columns: Any = None

    def all_records(self) -> Batch:
        """Records of every port, in port order."""
        return [record for port in sorted(self.records) for record in self.records[port]]


def fold_into(folded: dict[Any, Any], records: Batch, how: FoldHow) -> None:
    """Fold ``records`` (elements) into ``folded`` (key -> value so far), one loop per built-in."""
    get = folded.get
    if how == "sum":
        for element in records:
            key = element[0]
            folded[key] = get(key, 0) + element[1]
    elif how == "count":
        for element in records:
            key = element[0]
            folded[key] = get(key, 0) + 1
    elif how == "min":
        for element in records:
            key, value = element[0], element[1]
            current = get(key, _MISSING)
            if current is _MISSING or value < current:
                folded[key] = value
    elif how == "max":
        for element in records:
            key, value = element[0], element[1]
            current = get(key, _MISSING)
            if current is _MISSING or value > current:
                folded[key] = value
    else:
        fn: Any = how
        for element in records:
            key, value = element[0], element[1]
            current = get(key, _MISSING)
            folded[key] = value if current is _MISSING else fn(current, value)


class WindowLogic(ABC):
    """Per-instance window state: assigns records, reports closed windows.

    With ``fold`` set (by ``window_reduce``) windows keep one value per key
    instead of their records.
    """

    late: int = 0
    fold: FoldHow | None = None
    #: Set by the task instance when its task only emits the per-key results of a folded window (the built-in
    #: ``window_reduce``): a logic may then make those elements itself and hand many windows over as one.
    emits_results: bool = False

    def collect(self, window: ClosedWindow, port: int, records: Batch) -> None:
        """Put ``records`` into ``window``: append them, or fold them per key."""
        if not records:
            return
        if self.fold is None:
            bucket = window.records.get(port)
            if bucket is None:
                window.records[port] = list(records)
            else:
                bucket.extend(records)
            return
        if window.folded is None:
            window.folded = {}
        fold_into(window.folded, records, self.fold)
        window.last_ts = records[-1][2]

    @abstractmethod
    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        """Assign ``batch``; return the windows that closed and the records that came too late."""

    def advance(self, watermark: float) -> list[ClosedWindow]:
        """The input's watermark reached ``watermark`` (seconds): the event-time windows it closes, oldest first.

        Processing-time and count windows ignore it.
        """
        return []

    def on_time(self, now: float) -> list[ClosedWindow]:
        """Windows closed (or fired early) by the clock alone (no record arrived)."""
        return []

    def next_deadline(self) -> float | None:
        """When :meth:`on_time` next has something to close, if ever."""
        return None

    def result_ts(self, window: ClosedWindow) -> float | None:
        """The event time of what ``window`` emits; ``None``: that of its last record."""
        return None

    @abstractmethod
    def close_all(self) -> list[ClosedWindow]:
        """End of stream: every open window, in order."""

    @abstractmethod
    def snapshot(self) -> Any:
        """Open windows and counters as msgpack-able data."""

    def snapshot_increment(self) -> Any:
        """What an incremental checkpoint holds: :meth:`snapshot` (a logic whose windows are in a store that
        tracks what changed gives less)."""
        return self.snapshot()

    @abstractmethod
    def restore(self, snapshot: Any) -> None:
        """Continue from :meth:`snapshot`'s data."""


def window_data(window: ClosedWindow) -> list[Any]:
    """A window as msgpack-able data."""
    ports = [[port, [[r[0], r[1], r[2]] for r in records]] for port, records in window.records.items()]
    folded = None if window.folded is None else [[key, value] for key, value in window.folded.items()]
    return [window.start, window.end, ports, folded, window.last_ts]


def window_from(data: list[Any]) -> ClosedWindow:
    """Back from :func:`window_data` (tuple keys come back as tuples)."""
    start, end, ports, folded, last_ts = data
    records = {port: [(hashable(k), v, ts) for k, v, ts in batch] for port, batch in ports}
    pairs = None if folded is None else {hashable(key): value for key, value in folded}
    return ClosedWindow(start, end, records, pairs, last_ts)


def joined(window: ClosedWindow, other: ClosedWindow) -> ClosedWindow:
    """``window`` with ``other``'s records (appended per port) and folded values added.

    For windows of one span held by different instances, whose keys are disjoint (rescaling).
    """
    for port, records in other.records.items():
        window.records.setdefault(port, []).extend(records)
    if other.folded is not None:
        window.folded = {**(window.folded or {}), **other.folded}
        window.last_ts = other.last_ts
    return window
