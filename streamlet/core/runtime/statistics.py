"""Frozen snapshots of what a job has done so far."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from streamlet.core.model.histogram import LatencyHistogram


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    """Records into and out of one node, summed over its instances; a join's ``held`` records (in its state
    now) and ``held_peak`` (the most each instance held at once, summed); a lookup join's ``lookups`` (calls
    of its lookup) and ``cache_hits`` (records joined from its cache)."""

    name: str
    kind: str
    parallelism: int
    records_in: int
    records_out: int
    queued: int  # items waiting in the node's inboxes now
    held: int = 0
    held_peak: int = 0
    lookups: int = 0
    cache_hits: int = 0


@dataclass(frozen=True, slots=True)
class JobStatistics:
    """A job's counters at one moment.

    ``dropped`` counts records removed on purpose (past a loop's iteration
    limit, or sent into a loop that had already ended); ``dead_lettered``
    counts records a ``skip`` task set aside; ``discarded`` counts records
    emitted on output ports nothing is connected to; ``late`` counts records
    that reached an event-time window after it closed (they went to the late
    output). ``checkpoints`` counts completed checkpoints and
    ``last_checkpoint`` describes the newest (epoch, size, seconds); ``shed``
    counts records the sources shed under the job's QoS. ``loop_lag`` is how late
    the job's event loop runs now and ``loop_lag_max`` the most it ran late while
    the job ran (seconds behind a 100 ms tick: code that held the loop, the job's
    or the embedding program's).
    """

    job: str
    nodes: dict[str, NodeStatistics]
    dropped: int
    dead_lettered: int
    discarded: int
    late: int
    restarts: int
    checkpoints: int
    last_checkpoint: Any
    wall_time: float
    running: bool
    shed: int = 0  # records the sources shed to keep the job's QoS (held ones included)
    checkpoint_durations: list[int] = field(default_factory=list)  # a LatencyHistogram's counts, in seconds
    loop_lag: float = 0.0
    loop_lag_max: float = 0.0


class QueueState(StrEnum):
    """How full an instance's input queue is (ETRI's load-adaptation states)."""

    NORMAL = "NORMAL"
    YELLOW = "YELLOW"
    RED = "RED"


YELLOW_FILL = 0.5  # an input queue at least this full is YELLOW ...
RED_FILL = 0.8  # ... and at least this full RED


def queue_state(fill: float, yellow: float = YELLOW_FILL, red: float = RED_FILL) -> QueueState:
    """The state of a queue ``fill`` full (0..1)."""
    if fill >= red:
        return QueueState.RED
    return QueueState.YELLOW if fill >= yellow else QueueState.NORMAL


class InstanceCounters:
    """Mutable per-instance counters, summed into :class:`NodeStatistics` (records out are counted by the routes).

    ``busy``: seconds spent processing (a task in ``execute``, a source in ``read``); ``blocked``: seconds
    spent waiting for room downstream (backpressure); ``latency``: per batch, the time from its arrival in
    the input queue to the end of its processing. All are per batch, never per record.
    """

    __slots__ = ("batches", "blocked", "busy", "latency", "loop_held", "observer", "records_in", "shed")

    def __init__(self) -> None:
        self.records_in = 0
        #: Called with the new total after every batch counted in (``None``: nobody watches; a test harness
        #: sets it to act when an instance has taken a number of records).
        self.observer: Callable[[int], None] | None = None
        self.shed = 0  # records a source shed (load shedding under a QoS)
        self.batches = 0
        self.busy = 0.0
        self.blocked = 0.0
        self.loop_held = 0.0  # seconds calls of user code held the event loop, each past loop_warning
        self.latency = LatencyHistogram()

    def count_in(self, records: int) -> None:
        """``records`` more went in (once per batch)."""
        self.records_in += records
        if self.observer is not None:
            self.observer(self.records_in)


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    """One instance's counters at one moment (cumulative: rates are differences of two snapshots).

    ``fill`` is the fullest input channel's share of its capacity (0 for a source), ``state`` its
    :class:`QueueState`; ``latency`` the histogram's bucket counts (see :class:`LatencyHistogram`);
    ``segments`` the records this instance sent into each key segment of every task it feeds through a
    ``SESSION_TABLE`` edge (task -> one count per segment); ``ports`` the items queued at each input port.
    """

    node: str
    index: int
    kind: str
    records_in: int
    records_out: int
    batches: int
    busy: float
    blocked: float
    queued: int
    fill: float
    state: str
    latency: list[int]
    segments: dict[str, list[int]] = field(default_factory=dict)
    shed: int = 0
    ports: list[int] = field(default_factory=list)  # items queued per input port
    loop_held: float = 0.0  # seconds its calls held the event loop, each past the job's loop_warning

    def to_data(self) -> dict[str, Any]:
        """Plain data (JSON, msgpack)."""
        return {field: getattr(self, field) for field in self.__slots__}
