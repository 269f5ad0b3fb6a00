"""The runtime's side of a task's outputs: per-port routes to the downstream channels."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.constants import LATE
from streamlet.core.model.record import (
    CAUGHT_UP,
    Batch,
    Element,
    Marker,
    Record,
    Records,
    Watermark,
    element_of,
    elements_of,
)
from streamlet.core.runtime.routing import DiscardRoute, Route
from streamlet.errors import PortError


class RoutedOutputs:
    """Where a task emits records: ``emit(key, value, port=0, ts=None)``.

    Emitting only buffers; the runtime sends whole batches after ``execute``
    returns. ``ts=None`` gives the record the event time of the last record
    of the batch being processed, so event time flows through tasks.
    """

    __slots__ = ("_adders", "_numbers", "_ports", "firing", "iteration", "routes", "ts", "where", "window")

    def __init__(
        self,
        routes_by_port: list[list[Route]],
        adders: list[Callable[[Element], None]] | None = None,
        *,
        late: bool = False,
        side: int = LATE,
        where: str = "this task",
    ) -> None:
        # Ports by number: the declared ones from 0, and (with ``late``) the last one as the side output
        # ``side`` (a task's LATE, -1; a source's SHED, -2). A dict
        # rather than a list, so a port that was never declared (5, or -2) is a KeyError, never another port.
        self._numbers = [*range(len(routes_by_port) - late), *([side] if late else [])]
        self._ports = dict(zip(self._numbers, routes_by_port, strict=True))
        self._adders: dict[int, Callable[[Element], None]] = {}
        self.set_adders(adders if adders is not None else [routes[0].add for routes in routes_by_port])
        self.routes = [route for routes in routes_by_port for route in routes]
        self.ts: float | None = None
        self.iteration = 0
        self.window: tuple[float, float] | None = None  # set by the runtime while a window is handled
        self.firing: str | None = None  # and which firing of it this is
        self.where = where  # "task 'split' instance 0", for messages

    def emit(self, key: Any, value: Any, port: int = 0, ts: float | None = None) -> None:
        """Send ``(key, value)`` out of output ``port``."""
        try:
            add = self._adders[port]
        except KeyError:
            raise self.no_port(port) from None
        add((key, value, self.ts if ts is None else ts))

    def emit_record(self, record: Record, port: int = 0) -> None:
        """Send an existing record unchanged (a filter passing records through)."""
        try:
            add = self._adders[port]
        except KeyError:
            raise self.no_port(port) from None
        add(element_of(record))

    def set_adders(self, adders: list[Callable[[Element], None]]) -> None:
        """Runtime: the per-port functions that take an emitted record, in port order."""
        self._adders = dict(zip(self._numbers, adders, strict=True))

    def refresh_adders(self) -> None:
        """Re-read every route's ``add`` (a switch may have changed it). Not for a task inside a loop,
        whose adders wrap the routes' (a reconfiguration never touches one)."""
        self.set_adders([fan_out([route.add for route in routes]) for routes in self._ports.values()])

    def _adder(self, port: int) -> Callable[[Element], None]:
        """The function taking records emitted on ``port`` (per call, not per record: emit inlines it)."""
        try:
            return self._adders[port]
        except KeyError:
            raise self.no_port(port) from None

    def connected(self, port: int) -> bool:
        """Something is connected to ``port`` (records emitted there are not just discarded)."""
        return not all(isinstance(route, DiscardRoute) for route in self._ports[port])

    def no_port(self, port: Any) -> PortError:
        """The error for emitting on ``port``, which this task did not declare."""
        declared = [number for number in self._numbers if number >= 0]
        late = " and LATE (-1)" if LATE in self._numbers else ""
        return PortError(
            f"{self.where}: emitted on output port {port!r}, but it has {len(declared)} output "
            f"port{'s' if len(declared) != 1 else ''} ({', '.join(map(str, declared))}){late}; "
            "declare more with ports.set_outputs(n) in declare_ports"
        )

    def emit_batch(self, records: Records, port: int = 0) -> None:
        """Send many records at once; cheaper than one ``emit`` per record."""
        self.emit_elements(elements_of(records), port)

    def emit_elements(self, batch: Batch, port: int = 0) -> None:
        """Runtime and built-in tasks: send a batch of elements (tuples) as they are."""
        try:
            routes = self._ports[port]
        except KeyError:
            raise self.no_port(port) from None
        if len(routes) == 1 and routes[0].add is self._adders[port]:
            routes[0].add_batch(batch)
            return
        add = self._adders[port]
        for element in batch:
            add(element)

    def emit_columns(self, batch: ColumnBatch, port: int = 0) -> None:
        """Built-in columnar tasks: send a columnar batch (each edge takes it whole, split by key, or as elements)."""
        try:
            routes = self._ports[port]
        except KeyError:
            raise self.no_port(port) from None
        for route in routes:
            route.add_columns(batch)

    def emit_all(self, pairs: Iterable[tuple[Any, Any]], port: int = 0) -> None:
        """Emit every ``(key, value)`` pair of ``pairs``."""
        add, ts = self._adder(port), self.ts
        for key, value in pairs:
            add((key, value, ts))

    @property
    def port_count(self) -> int:
        """Number of output ports."""
        return len(self._ports)

    def marks(self) -> list[list[int]]:
        """Where every buffer stands now (see :meth:`rollback`)."""
        return [route.marks() for route in self.routes]

    def rollback(self, marks: list[list[int]]) -> None:
        """Forget what was emitted since :meth:`marks` (a failed execute)."""
        for route, mark in zip(self.routes, marks, strict=True):
            route.truncate(mark)

    async def flush(self, at_least: int = 1) -> None:
        """Send buffers holding at least ``at_least`` records."""
        for route in self.routes:
            await route.flush(at_least)

    async def broadcast(self, marker: Marker) -> None:
        """Send a control marker to every receiver of every port, after what was flushed."""
        for route in self.routes:
            await route.broadcast(marker)

    async def forward_watermark(self, marker: Watermark) -> None:
        """Send everything buffered, then ``marker`` on every edge that carries watermarks (not inside loops)."""
        for route in self.routes:
            if route.send_watermarks:
                await route.flush()
                await route.broadcast(marker)
                route.watermark = marker

    async def forward_caught_up(self) -> None:
        """Send everything buffered, then ``CAUGHT_UP`` on every edge that carries watermarks (not inside loops:
        a loop's own records never hold its head back)."""
        for route in self.routes:
            if route.send_watermarks and not route.caught_up:
                await route.flush()
                await route.broadcast(CAUGHT_UP)
                route.caught_up = True

    async def end(self) -> None:
        """Flush everything and send end-of-stream downstream."""
        for route in self.routes:
            await route.end()

    def sent(self) -> int:
        """Records emitted so far (each counted once per output port)."""
        return sum(routes[0].sent for routes in self._ports.values() if routes)


class WindowOutputs(RoutedOutputs):
    """The outputs of a windowed task: records emitted while a window is handled carry its bounds.

    A subclass rather than a check in :meth:`Outputs.emit`, so tasks without
    windows pay nothing on the hot path.
    """

    __slots__ = ()

    def emit(self, key: Any, value: Any, port: int = 0, ts: float | None = None) -> None:
        """Send ``(key, value)`` out of output ``port`` (a window's element inside a window)."""
        if ts is None:
            ts = self.ts
        try:
            add = self._adders[port]
        except KeyError:
            raise self.no_port(port) from None
        window = self.window
        if window is None:
            add((key, value, ts))
        else:
            add((key, value, ts, 0, window, self.firing or "on_time"))

    def emit_all(self, pairs: Iterable[tuple[Any, Any]], port: int = 0) -> None:
        """Emit every ``(key, value)`` pair of ``pairs``."""
        window = self.window
        if window is None:
            super().emit_all(pairs, port)
            return
        add, ts, firing = self._adder(port), self.ts, self.firing or "on_time"
        for key, value in pairs:
            add((key, value, ts, 0, window, firing))


def fan_out(adders: list[Callable[[Element], None]]) -> Callable[[Element], None]:
    """One function giving a record to every one of ``adders`` (the one itself when there is one)."""
    if len(adders) == 1:
        return adders[0]

    def add_to_all(element: Element) -> None:
        for add in adders:
            add(element)

    return add_to_all
