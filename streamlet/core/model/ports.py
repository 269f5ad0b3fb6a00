"""What a task sees of its ports: the declarer, its inputs, and the protocol of its outputs.

The runtime implements :class:`Outputs` (``core.runtime.outputs``); a task only ever uses what is here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.record import Batch, Record, Records
from streamlet.core.model.views import RecordViews
from streamlet.errors import PortError, TopologyError


class PortDeclarer:
    """Passed to ``Task.declare_ports``: how many ports, and the input mode.

    Defaults: one input, one output, async mode (execute runs when any
    input has data).
    """

    __slots__ = ("inputs", "outputs", "sync")

    def __init__(self) -> None:
        self.inputs = 1
        self.outputs = 1
        self.sync = False

    def set_inputs(self, count: int) -> None:
        """Declare ``count`` input ports (numbered from 0)."""
        self.inputs = _at_least_one(count, "input")

    def set_outputs(self, count: int) -> None:
        """Declare ``count`` output ports (numbered from 0)."""
        self.outputs = _at_least_one(count, "output")

    def sync_inputs(self, flag: bool = True) -> None:
        """Sync mode: execute runs only when every open input port has data."""
        self.sync = bool(flag)


def _at_least_one(count: int, what: str) -> int:
    if not isinstance(count, int) or count < 1:
        raise TopologyError(f"a task needs at least one {what} port, got {count!r}")
    return count


class Inputs:
    """The batches that woke a task.

    In async mode one port woke it: ``inputs.port`` says which and ``get()``
    returns its batch. In sync mode every open port delivered a batch:
    ``get(i)`` returns port ``i``'s (empty for a port that has ended) and
    ``get()`` all of them concatenated in port order.

    Batches travel as plain tuples; ``get`` hands out their :class:`Record`
    objects the first time a port is read in a wake-up (and the same list if
    it is read again), so a task pays for records only when it reads them.
    The records are views refilled wake-up after wake-up (``RecordViews``): a
    record the task keeps stays as it is, one it let go is refilled with a
    later element instead of a new one being made.
    """

    __slots__ = ("_batches", "_records", "_views", "firing", "held", "port", "where", "window")

    def __init__(self, ports: int, where: str = "this task") -> None:
        self._batches: list[Batch] = [[] for _ in range(ports)]
        self._records: list[Records | None] = [None] * ports
        self._views = [RecordViews() for _ in range(ports)]
        self.port: int | None = 0
        self.window: tuple[float, float] | None = None
        #: While a window is handled: ``"early"``, ``"on_time"`` or ``"late"`` (see ``TimeWindow``).
        self.firing: str | None = None
        self.where = where  # "task 'join' instance 0", for messages
        #: Runtime: what a built-in owes from the part of the batch before a failed record (``RecordFailure``).
        self.held: Any = None

    def no_port(self, port: Any) -> PortError:
        """The error for reading ``port``, which this task did not declare."""
        count = len(self._batches)
        return PortError(
            f"{self.where}: inputs.get({port!r}), but it has {count} input port{'s' if count != 1 else ''} "
            f"({', '.join(map(str, range(count)))}); declare more with ports.set_inputs(n) in declare_ports"
        )

    def get(self, port: int | None = None) -> Records:
        """Records from ``port``, or from the port(s) that woke the task."""
        if port is not None:
            if not 0 <= port < len(self._batches):  # a negative index would quietly read another port
                raise self.no_port(port)
            return self._records_of(port)
        if self.port is not None:
            return self._records_of(self.port)
        return [record for index in range(len(self._batches)) for record in self._records_of(index)]

    def _records_of(self, port: int) -> Records:
        records = self._records[port]
        if records is None:
            records = self._records[port] = self._views[port].records_of(self._batches[port])
        return records

    def elements(self, port: int | None = None) -> Batch:
        """Like :meth:`get`, but the batch as the runtime carries it: tuples ``(key, value, ts)``, no
        :class:`Record` made (six wide, ``(key, value, ts, iteration, window, firing)``, for a record
        inside a cycle or produced by a window; read them by index, ``element[0]`` is the key).

        The fastest path for a hot loop that only reads fields (measured in ``benchmarks wordcount``: a
        keyed count over ``get()`` runs at ~0.85 of one over ``elements()``). The list is the runtime's:
        read it, do not change it.
        """
        if port is not None:
            if not 0 <= port < len(self._batches):
                raise self.no_port(port)
            return self._batches[port]
        if self.port is not None:
            return self._batches[self.port]
        return [element for batch in self._batches for element in batch]

    @property
    def port_count(self) -> int:
        """Number of input ports."""
        return len(self._batches)

    def set_one(self, port: int, batch: Batch) -> None:
        """Runtime: async mode, ``port`` woke the task with ``batch``."""
        batches = self._batches
        if self.port is None:  # after a sync wake-up every port held a batch: none of them is current now
            batches = self._batches = [[] for _ in batches]
            self._records = [None] * len(batches)
        else:
            batches[self.port] = []
            self._records[self.port] = None
        batches[port] = batch
        self._records[port] = None
        self.port = port

    def set_all(self, batches: list[Batch]) -> None:
        """Runtime: sync mode, one batch per port (empty for ended ports)."""
        self._batches = batches
        self._records = [None] * len(batches)
        self.port = None

    def count(self) -> int:
        """Records in this wake-up."""
        return sum(len(batch) for batch in self._batches)


class Outputs(Protocol):
    """Where a task emits records: ``emit(key, value, port=0, ts=None)``.

    Emitting only buffers; the runtime sends whole batches after ``execute``
    returns. ``ts=None`` gives the record the event time of the last record
    of the batch being processed, so event time flows through tasks. A port
    the task did not declare raises :class:`~streamlet.errors.PortError`.
    """

    #: Event time given to records emitted without ``ts`` (the batch's last record's, or the window's end).
    ts: float | None
    #: Inside a cycle: the iteration of the records being processed.
    iteration: int
    #: While a window is handled: its ``(start, end)``.
    window: tuple[float, float] | None

    def emit(self, key: Any, value: Any, port: int = 0, ts: float | None = None) -> None:
        """Send ``(key, value)`` out of output ``port``."""
        ...

    def emit_record(self, record: Record, port: int = 0) -> None:
        """Send an existing record unchanged (a filter passing records through)."""
        ...

    def emit_batch(self, records: Records, port: int = 0) -> None:
        """Send many records at once; cheaper than one ``emit`` per record."""
        ...

    def emit_all(self, pairs: Iterable[tuple[Any, Any]], port: int = 0) -> None:
        """Emit every ``(key, value)`` pair of ``pairs``."""
        ...

    def emit_elements(self, batch: Batch, port: int = 0) -> None:
        """Runtime and built-in tasks: send elements (the tuples ``Inputs.elements`` gives) as they are."""
        ...

    def emit_columns(self, batch: ColumnBatch, port: int = 0) -> None:
        """Built-in columnar tasks: send a columnar batch (an Arrow record batch with its key/value/ts columns)."""
        ...

    @property
    def port_count(self) -> int:
        """Number of output ports."""
        ...
