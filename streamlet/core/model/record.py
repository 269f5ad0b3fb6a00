"""Records and the control markers that travel with them.

A channel carries, in order, either a data batch (a ``list`` of elements: plain
tuples, see :data:`Element`; user code sees them as :class:`Record` objects) or
one control marker. Markers never overtake data: a barrier or end-of-stream
is delivered after every batch sent before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias


class Record:
    """One element of a stream: a ``key``, a ``value`` and an event time ``ts``.

    A plain ``__slots__`` class: reading its fields is as cheap as it gets
    (~8 ns). The runtime carries records as plain tuples (:data:`Element`) and
    makes a ``Record`` only where user code reads one (``Inputs.get``, a
    shortcut's function, a partition or watermark function, a sink writer
    that takes records, a job's collected results). A record emitted is
    taken apart into its element, so changing it afterwards changes nothing
    downstream.

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


#: How a record travels inside the runtime: a plain tuple ``(key, value, ts)``, or
#: ``(key, value, ts, iteration, window, firing)`` for a record inside a cycle or produced by a window.
#: Plain tuples of plain values cost ~35 ns to make against ~140 ns for a :class:`Record`, and the
#: garbage collector stops tracking them at its first pass, so they are never promoted to the older
#: generations while they wait in a channel. User code sees :class:`Record` objects, made where it asks
#: for them (``Inputs.get``, a shortcut's function, a sink that takes records).
Element: TypeAlias = tuple[Any, ...]
#: A batch of elements, as channels carry them.
Batch: TypeAlias = list[Element]
#: A batch of records, as user code sees it.
Records: TypeAlias = list[Record]


def element_of(record: Record) -> Element:
    """The element carrying ``record`` (its iteration, window and firing when it has any)."""
    if type(record) is Record:
        return (record.key, record.value, record.ts)
    if record.iteration == 0 and record.window is None:
        return (record.key, record.value, record.ts)
    return (record.key, record.value, record.ts, record.iteration, record.window, record.firing)


def elements_of(records: Records) -> Batch:
    """The elements carrying ``records``."""
    return [(r.key, r.value, r.ts) if type(r) is Record else element_of(r) for r in records]


def record_of(element: Element) -> Record:
    """The :class:`Record` (or loop/window record) an element carries."""
    if len(element) == 3:
        return Record(element[0], element[1], element[2])
    key, value, ts, iteration, window, firing = element
    if window is not None:
        if firing == "on_time":
            return WindowRecord(key, value, ts, window)
        return FiredWindowRecord(key, value, ts, window, firing or "on_time")
    return LoopRecord(key, value, ts, iteration)


def records_of(batch: Batch) -> Records:
    """The records a batch carries: one object per element, made here."""
    try:
        return [Record(key, value, ts) for key, value, ts in batch]
    except ValueError:  # loop or window elements among them (six wide)
        return [record_of(element) for element in batch]


def iteration_of(element: Element) -> int:
    """How many times the element went round a cycle."""
    return element[3] if len(element) > 3 else 0


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
class CaughtUp(Marker):
    """The sender has caught up with its sources: what each source upstream held when it started (a
    ``PostgresSource``'s snapshot, a Kafka topic up to its end offsets at start, a bounded source's whole
    input) was sent on this channel before this marker (``table_join(bootstrap=True)`` waits for it)."""


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
CAUGHT_UP: Final = CaughtUp()
CYCLE_END: Final = CycleEnd()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record a task with ``on_error="skip"`` could not process, and why."""

    task: str
    instance: int
    record: Record
    error: str
    exception: BaseException = field(repr=False, compare=False)
