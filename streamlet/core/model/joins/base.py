"""What every join shares: its two ports, its output function, its error handling and its late records.

A join is a built-in :class:`~streamlet.core.model.task.Task` with two input
ports (``LEFT`` and ``RIGHT``), keyed on ``record.key``: everything it holds
lives in ``self.state`` (per key), so a join is checkpointed, restored and
re-split by key segment on a rescale like any keyed task. An event-time join
also keeps an index of when each key has something due (a heap, rebuilt from
the state whenever the runtime replaces or moves it: ``reindex``); the
runtime calls ``advance(watermark)`` as the watermark rises, so the work due
is done in one pass rather than by a timer per record. It handles its own failures: the output function ``fn`` is
called before anything of the record that caused the call is stored or
emitted, so a failing record leaves nothing behind and the error policy
(``JoinHooks.failed``) decides what becomes of it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, Final

from streamlet.core.model.constants import LATE
from streamlet.core.model.ports import Inputs, Outputs, PortDeclarer
from streamlet.core.model.record import Element
from streamlet.core.model.task import Task
from streamlet.errors import TaskError

LEFT: Final = 0  #: ``set_input(..., in_port=LEFT)``: a join's left input
RIGHT: Final = 1  #: ``set_input(..., in_port=RIGHT)``: a join's right input

#: ``fn(key, left_value, right_value) -> value``: a join's output value.
JoinFunction = Callable[[Any, Any, Any], Any]


class JoinCounters:
    """One instance's join counters, kept by the runtime so that a restarted task object keeps counting:
    ``late`` records sent to the ``LATE`` port, records ``held`` in state now, and the most held at once."""

    __slots__ = ("held", "late", "peak")

    def __init__(self) -> None:
        self.late = 0
        self.held = 0
        self.peak = 0

    def hold(self, records: int) -> None:
        """``records`` more are held (a negative number: fewer)."""
        held = self.held = self.held + records
        if held > self.peak:
            self.peak = held


def _fail(element: Element, error: BaseException) -> bool:
    raise error


class JoinHooks:
    """What the runtime gives a join: ``failed(element, error) -> again`` applies the task's error policy to
    the record that caused a failing call (fail raises, skip dead-letters it, restart says to call again),
    and ``counters`` counts its late and held records (``statistics.late``)."""

    __slots__ = ("counters", "failed")

    def __init__(
        self, failed: Callable[[Element, BaseException], bool] = _fail, counters: JoinCounters | None = None
    ) -> None:
        self.failed = failed
        self.counters = JoinCounters() if counters is None else counters


class JoinTask(Task):
    """The base of the built-in joins: two inputs, one output, failures isolated per record."""

    #: The runtime calls ``execute``/``on_timer`` without an error policy of its own: the join applies it
    #: through ``hooks`` to the exact record, after taking nothing of it into state.
    handles_failures: Final = True
    #: Validation refuses any partitioning but ``SAME_KEY`` on its inputs.
    keyed_inputs: Final = True
    #: The kinds of ``how`` this join takes.
    kinds: tuple[str, ...] = ("inner",)

    def __init__(self, how: str, fn: JoinFunction | None) -> None:
        self.how = how
        self.fn = fn
        self.hooks = JoinHooks()
        #: Unpaired left (right) records are emitted: ``how`` is ``"left"`` or ``"outer"`` (``"right"``, ``"outer"``).
        self.keeps_left = how in ("left", "outer")
        self.keeps_right = how in ("right", "outer")

    def declare_ports(self, ports: PortDeclarer) -> None:
        """``LEFT`` and ``RIGHT`` in, one port out (and ``LATE``)."""
        ports.set_inputs(2)

    def value(self, key: Any, left: Any, right: Any) -> Any:
        """``fn(key, left, right)``, or the default pair."""
        fn = self.fn
        return (left, right) if fn is None else fn(key, left, right)

    def outputs_of(self, element: Element, build: Callable[[], list[Element]]) -> list[Element] | None:
        """``build()`` (it calls ``fn``) under the error policy: its elements, or ``None`` when ``element``,
        the record that caused the call, was dead-lettered (it must then leave nothing behind)."""
        while True:
            try:
                return build()
            except Exception as exc:  # noqa: BLE001 - user code: the error policy decides
                if not self.hooks.failed(element, exc):
                    return None

    def send_late(self, element: Element, outputs: Outputs) -> None:
        """``element`` can pair with nothing any more: to the ``LATE`` port, counted."""
        outputs.emit_elements([element], port=LATE)
        self.hooks.counters.late += 1

    def check_ts(self, element: Element, port: int, inputs: Inputs) -> float:
        """The event time of ``element``; a ``TaskError`` naming the node and key when it has none (or one
        that is not a number of seconds: a bool, a string, NaN)."""
        ts = element[2]
        if (type(ts) is float or type(ts) is int) and ts == ts:
            return ts
        rule = "has no ts" if ts is None else f"has ts {ts!r}"
        raise TaskError(
            f"{inputs.where} input port {port}: the record with key {element[0]!r} {rule}; "
            "an event-time join needs ts in seconds (an int or a float)",
            task=_task_name(inputs.where), instance=_instance_of(inputs.where), key=element[0],
        )  # fmt: skip


class StreamJoin(JoinTask):
    """A join fed record by record (not by windows): each port's batches go to :meth:`on_left` or
    :meth:`on_right`."""

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Join the batch of the port that woke the task."""
        port = inputs.port
        assert port is not None  # a join runs in async mode: one port per wake-up
        if port == LEFT:
            self.on_left(inputs.elements(port), inputs, outputs)
        else:
            self.on_right(inputs.elements(port), inputs, outputs)

    @abstractmethod
    def on_left(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """A batch of left records."""

    @abstractmethod
    def on_right(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """A batch of right records."""


class EventTimeJoin(StreamJoin):
    """A join whose held records are due when the watermark passes a time.

    An index says which keys to look at as the watermark rises (``advance``): ``_next`` holds, per key,
    the earliest time after which something of it is due, and ``_due`` is a heap of ``(when, order, key)``
    with an entry for each such time (and stale ones, skipped: a key scheduled earlier since, or done).
    One entry per key at a time rather than one per record, so a record costs a dict lookup, not a heap
    push. The index is derived from the state: :meth:`reindex` makes it anew.
    """

    #: The job tracks event time (watermarks flow) for this task.
    event_time: Final = True

    def __init__(self, how: str, fn: JoinFunction | None) -> None:
        super().__init__(how, fn)
        self._next: dict[Any, float] = {}
        self._due: list[tuple[float, int, Any]] = []
        self._emptied: list[Any] = []  # keys whose entries held nothing at the last rise
        self._order = itertools.count()  # keys of several types never meet in a comparison

    def advance(self, watermark: float, outputs: Outputs) -> None:
        """The watermark reached ``watermark``: every key with something due then, once each, in the
        order their due times came; what they emit leaves as one batch."""
        values = self.state.values
        self._forget_emptied(values)
        due, scheduled, keys = self._due, self._next, dict[Any, None]()
        while due and due[0][0] < watermark:
            when, _, key = heapq.heappop(due)
            if scheduled.get(key) == when:  # else stale: scheduled earlier since, or done
                keys[key] = None
        out, order, emptied = list[Element](), self._order, self._emptied
        for key in keys:
            entry = values.get(key)
            if entry is None:  # moved away by a rescale
                del scheduled[key]
                continue
            after = self.expire(key, entry, watermark, out)
            if after is not None:
                scheduled[key] = after
                heapq.heappush(due, (after, next(order), key))
            else:
                del scheduled[key]
                if not entry[LEFT] and not entry[RIGHT]:  # nothing held any more: gone at the next rise,
                    emptied.append(key)  # unless a record of the key comes first (then it is used again)
        if watermark == math.inf:  # the input ended: nothing held can meet anything any more
            values.clear()
            scheduled.clear()
            due.clear()
            self._emptied = []
            self.hooks.counters.held = 0
        if out:
            outputs.emit_elements(out)

    def _forget_emptied(self, values: dict[Any, Any]) -> None:
        """Drop the entries emptied at the last rise that are still empty."""
        for key in self._emptied:
            entry = values.get(key)
            if entry is not None and not entry[LEFT] and not entry[RIGHT]:
                del values[key]
        self._emptied = []

    def share_index(self, other: EventTimeJoin) -> None:
        """Use ``other``'s index (the same objects): a restarted task object taking over from ``other``."""
        self._next, self._due, self._order, self._emptied = other._next, other._due, other._order, other._emptied

    def reindex(self) -> None:
        """The state was replaced (a restore) or keys moved in or out (a rescale): index it again."""
        counters, held = self.hooks.counters, 0
        self._next, self._due, self._emptied = {}, [], []
        values = self.state.values
        for key in [key for key, entry in values.items() if not entry[LEFT] and not entry[RIGHT]]:
            del values[key]  # emptied at the rise before a snapshot
        for key, entry in values.items():
            held += self.held_in(entry)
            when = self.next_due(entry)
            if when is not None:
                self._next[key] = when
                self._due.append((when, next(self._order), key))
        heapq.heapify(self._due)
        counters.held = held
        counters.peak = max(counters.peak, held)

    @abstractmethod
    def expire(self, key: Any, entry: list[Any], watermark: float, out: list[Element]) -> float | None:
        """Do what is due for ``key`` at ``watermark``: add what it emits to ``out``, drop what can meet
        nothing any more; return :meth:`next_due` of what is left."""

    @abstractmethod
    def next_due(self, entry: list[Any]) -> float | None:
        """The earliest time after which something of ``entry`` is due; ``None`` when nothing is (an entry
        that holds nothing then goes)."""

    @abstractmethod
    def held_in(self, entry: list[Any]) -> int:
        """How many records ``entry`` holds."""


def _task_name(where: str) -> str:
    """``"task 'j' instance 0"`` -> ``"j"``."""
    return where.split("'")[1] if where.count("'") >= 2 else where


def _instance_of(where: str) -> int:
    tail = where.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0
