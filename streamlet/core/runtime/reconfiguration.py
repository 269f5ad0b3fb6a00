"""One live reconfiguration of a task: who hands which keys to whom, and how the parts travel.

A reconfiguration changes a task's segment table (``core.model.segments``):
a rescale spreads the segments over a new number of instances, a move gives
some segments another owner. The protocol (``Reconfigure`` markers, aligned
like barriers) is run by the instances; this module holds what they ask:

- :class:`ReconfigurationPlan` — pure data: the old and new tables, the
  instances that give state away (*exporters*: they lose a segment, or retire)
  and those that take some (*importers*), and for an exporter which instance
  each of its keys goes to.
- :class:`StateHandoff` — the seam the parts travel through: in memory here
  (:class:`LocalHandoff`), over the data plane on a cluster.
- :class:`ActiveReconfiguration` — what every instance of the job reaches
  through ``Environment.reconfiguration`` while one runs: the plan, the
  handoff, and where each instance reports that its part is done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import anyio

from streamlet.core.model.record import Reconfigure
from streamlet.core.model.segments import SegmentTable, segment_of


@dataclass(frozen=True)
class ReconfigurationPlan:
    """Task ``task`` goes from segment table ``old`` to ``new`` (reconfiguration ``id`` of the job)."""

    id: int
    task: str
    old: SegmentTable
    new: SegmentTable
    #: Instances replaced by a new incarnation of the same index elsewhere (a migration): the old one hands
    #: all it holds to the new one and retires.
    relocated: frozenset[int] = frozenset()

    @property
    def marker(self) -> Reconfigure:
        """The marker senders put on their old channels into the task."""
        return Reconfigure(self.id, self.task, self.old.instances)

    def retiring(self, index: int) -> bool:
        """Instance ``index`` (its old incarnation) has no place in the new layout: it hands everything over
        and ends."""
        return index >= self.new.instances or index in self.relocated

    @cached_property
    def exporters(self) -> frozenset[int]:
        """Old instances that give state away: they lose a segment, or retire."""
        losing = {old for old, _ in self.old.changes(self.new).values()}
        return frozenset(losing | set(range(self.new.instances, self.old.instances)) | self.relocated)

    @cached_property
    def importers(self) -> frozenset[int]:
        """Instances of the new layout that take state: they gain a segment (or take a retiring
        instance's stray keys, when nobody gains one)."""
        gaining = {new for _, new in self.old.changes(self.new).values()}
        if not gaining and self.new.instances < self.old.instances:
            gaining = {0}
        return frozenset(gaining | self.relocated)

    def sources_of(self, importer: int) -> list[int]:
        """The exporters ``importer`` waits for (every exporter sends every importer a part, maybe empty); a
        relocated instance's new incarnation waits for its old one too."""
        others = self.exporters - {importer}
        return sorted(others | ({importer} if importer in self.relocated else set()))

    def targets_of(self, exporter: int) -> list[int]:
        """The importers ``exporter`` sends a part to (its own new incarnation too, when relocated)."""
        others = self.importers - {exporter}
        return sorted(others | ({exporter} if exporter in self.relocated else set()))

    @property
    def joining(self) -> list[int]:
        """Instances made new: those added, and the new incarnations of relocated ones."""
        return sorted(set(range(self.old.instances, self.new.instances)) | self.relocated)

    def target_function(self, exporter: int) -> Callable[[Any], int]:
        """Where each key held by ``exporter`` belongs after the change (``exporter`` itself: it stays).

        A key moves when its segment moves away from ``exporter``; a retiring
        exporter gives every key to its segment's new owner (or, for a key its
        segment table never sent it, to an importer: such state is the
        instance's own business and must not be lost).
        """
        owners, segments = self.segment_owners(exporter), self.old.segments
        return lambda key: owners[segment_of(key, segments)]

    def segment_owners(self, exporter: int) -> list[int]:
        """Where each segment's keys held by ``exporter`` belong after the change (see :meth:`target_function`):
        a key's place depends on its segment alone."""
        old, new = self.old.owners, self.new.owners
        retiring = self.retiring(exporter)
        fallback = min(self.importers) if self.importers else exporter

        def target(segment: int) -> int:
            owner = new[segment]
            if old[segment] == exporter and owner != exporter:
                return owner
            if retiring:
                return owner if owner in self.importers else fallback
            return exporter

        return [target(segment) for segment in range(self.old.segments)]

    @property
    def width(self) -> int:
        """Instance indices a part can go to: both layouts."""
        return max(self.old.instances, self.new.instances)


class StateHandoff(Protocol):
    """How one exporter's part of a task's state reaches an importer."""

    async def send(self, source: int, target: int, part: Any) -> None:
        """Hand ``part`` (a task snapshot holding only the keys moving to ``target``) over."""
        ...

    async def receive(self, target: int, sources: list[int]) -> list[Any]:
        """Wait until a part from every exporter in ``sources`` has arrived for ``target``; return them in order."""
        ...


class LocalHandoff:
    """Parts handed over in memory (every instance in one process)."""

    def __init__(self) -> None:
        self._parts: dict[int, dict[int, Any]] = {}
        self._arrived: dict[int, anyio.Event] = {}

    async def send(self, source: int, target: int, part: Any) -> None:
        """Leave ``part`` in ``target``'s mailbox and wake it."""
        self._parts.setdefault(target, {})[source] = part
        self._event(target).set()

    async def receive(self, target: int, sources: list[int]) -> list[Any]:
        """Every part from ``sources`` for ``target``, waiting as they come."""
        while not set(sources) <= set(self._parts.get(target, {})):
            await self._event(target).wait()
            self._arrived[target] = anyio.Event()
        box = self._parts.pop(target, {})
        return [box[source] for source in sources]

    def _event(self, target: int) -> anyio.Event:
        return self._arrived.setdefault(target, anyio.Event())


@dataclass
class ActiveReconfiguration:
    """The reconfiguration running now, as every instance of the job sees it."""

    plan: ReconfigurationPlan
    handoff: StateHandoff
    #: Instances that must report before it is over: ``(node, index)``.
    waiting: set[tuple[str, int]] = field(default_factory=set)
    over: anyio.Event = field(default_factory=anyio.Event)
    error: BaseException | None = None

    def expect(self, node: str, index: int) -> None:
        """Instance ``(node, index)`` has a part to play."""
        self.waiting.add((node, index))

    def done(self, node: str, index: int) -> None:
        """Instance ``(node, index)`` has played its part (aligned, handed over, taken its state)."""
        self.waiting.discard((node, index))
        if not self.waiting:
            self.over.set()
