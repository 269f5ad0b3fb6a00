"""Records and the control markers that travel with them.

A channel carries, in order, either a data batch (a ``list`` of :class:`Record`)
or one control marker. Markers never overtake data: a barrier or end-of-stream
is delivered after every batch sent before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias


class Record:
    """One element of a stream: a ``key``, a ``value`` and an event time ``ts``.

    A plain ``__slots__`` class because records are created on the hot path
    (one per record per hop); see the cost table in the design notes.
    Records are read-only once emitted: the same object may reach several
    downstream nodes.

    Example:
        >>> r = Record("user42", 3, 1.5)
        >>> (r.key, r.value, r.ts)
        ('user42', 3, 1.5)
    """

    __slots__ = ("key", "ts", "value")

    #: How many times the record went round a cycle (see :class:`LoopRecord`).
    iteration: int = 0
    #: ``(start, end)`` of the window that produced the record, if any (see :class:`WindowRecord`).
    window: tuple[float, float] | None = None
    #: Which firing of its window produced the record: ``"early"``, ``"on_time"``, ``"late"`` (``None``: none).
    firing: str | None = None

    def __init__(self, key: Any, value: Any, ts: float | None = None) -> None:
        self.key = key
        self.value = value
        self.ts = ts

    @property
    def window_start(self) -> float | None:
        """Start of the window that produced the record, or ``None``."""
        window = self.window
        return None if window is None else window[0]

    @property
    def window_end(self) -> float | None:
        """End of the window that produced the record, or ``None``."""
        window = self.window
        return None if window is None else window[1]

    def __repr__(self) -> str:
        return f"Record(key={self.key!r}, value={self.value!r}, ts={self.ts!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (self.key, self.value, self.ts) == (other.key, other.value, other.ts)

    __hash__ = None  # type: ignore[assignment]  # mutable slots; equality is by content


class LoopRecord(Record):
    """A record inside a cycle, carrying its iteration count.

    Kept apart from :class:`Record` so that records outside loops stay three
    slots wide (each extra field costs on every creation).
    """

    __slots__ = ("iteration",)

    def __init__(self, key: Any, value: Any, ts: float | None, iteration: int) -> None:
        self.key = key
        self.value = value
        self.ts = ts
        self.iteration = iteration


class WindowRecord(Record):
    """A record emitted for a closed window, carrying the window's ``(start, end)``.

    ``window_reduce`` results and whatever a windowed task emits while it
    handles a window are window records, so a sink (``SparkSink``) can store
    ``window_start``/``window_end``. Other records read ``None`` for both.
    The records of one window share one bounds tuple: one slot more than a
    :class:`Record` (measured: +7 ns to create, against +26 ns for two slots).

    Example:
        >>> r = WindowRecord("s1", 3, 60.0, (0.0, 60.0))
        >>> (r.window_start, r.window_end)
        (0.0, 60.0)
    """

    __slots__ = ("window",)

    firing: str | None = "on_time"

    def __init__(self, key: Any, value: Any, ts: float | None, window: tuple[float, float]) -> None:
        self.key = key
        self.value = value
        self.ts = ts
        self.window = window


class FiredWindowRecord(WindowRecord):
    """A result of an early or late firing of its window (``firing`` says which); on-time results are
    plain :class:`WindowRecord` objects, so the common case stays one slot smaller.

    Example:
        >>> FiredWindowRecord("s1", 3, 59.999, (0.0, 60.0), firing="late").firing
        'late'
    """

    __slots__ = ("firing",)

    def __init__(self, key: Any, value: Any, ts: float | None, window: tuple[float, float], firing: str) -> None:
        self.key = key
        self.value = value
        self.ts = ts
        self.window = window
        self.firing = firing


Batch: TypeAlias = list[Record]


class Marker:
    """Base of control markers carried in order with data batches."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class EndOfStream(Marker):
    """The sending instance will send nothing more on this channel."""


@dataclass(frozen=True, slots=True)
class CycleEnd(Marker):
    """A cycle went quiet: every in-cycle input port of the receiver is ended."""


@dataclass(frozen=True, slots=True)
class Barrier(Marker):
    """Checkpoint barrier for ``epoch`` (Flink's asynchronous barrier snapshots)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Watermark(Marker):
    """No record with an event time below ``ts`` will follow on this channel.

    With ``idle``, the sender has nothing to send for now and holds no
    receiver's watermark back until its next watermark (``ts`` is then unused).
    """

    ts: float
    idle: bool = False


@dataclass(frozen=True, slots=True)
class Reconfigure(Marker):
    """Reconfiguration ``id`` of task ``task`` (a rescale or moved segments) passes here, like a barrier.

    A sender into ``task`` sends it on its old channels just before it routes
    by the new segment table; an instance of ``task`` aligned on it hands the
    segments it loses to their new owners; a receiver downstream of ``task``
    aligns on it over the channels of ``task``'s first ``senders`` instances,
    so that results from before a move never follow results from after it.
    """

    id: int
    task: str
    senders: int


END_OF_STREAM: Final = EndOfStream()
CYCLE_END: Final = CycleEnd()

Item: TypeAlias = "Batch | Marker"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record a task with ``on_error="skip"`` could not process, and why."""

    task: str
    instance: int
    record: Record
    error: str
    exception: BaseException = field(repr=False, compare=False)
