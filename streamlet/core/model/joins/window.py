"""The window join: when a window of a key fires, every (left, right) pair of that key in it.

The window itself is the task's (``TimeWindow`` or ``SessionWindow``, as any
windowed task has): it assigns both ports' records, sends late ones to the
``LATE`` port and fires by the watermark or the clock; this task only pairs
what a fired window holds. Sessions are per key over both inputs together.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from streamlet.core.model.joins.base import LEFT, RIGHT, JoinFunction, JoinTask
from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.record import Element


def _arrival(element: Element) -> int:
    number: int = element[1][0]
    return number


class WindowJoin(JoinTask):
    """``topology.window_join``: see :meth:`streamlet.Topology.window_join`."""

    kinds = ("inner", "left", "right", "outer")

    def __init__(self, how: str = "inner", fn: JoinFunction | None = None) -> None:
        super().__init__(how, fn)

    @staticmethod
    def stamped(batch: list[Element], first: int) -> list[Element]:
        """``batch`` as the window holds it: each value ``(arrival number, value)``, numbered from ``first``.
        A window merged from two sessions lists the earlier session's records first; the numbers give each
        side back its arrival order."""
        return [(element[0], (first + index, element[1]), element[2]) for index, element in enumerate(batch)]

    @staticmethod
    def unstamped(element: Element) -> Element:
        """The record :meth:`stamped` made ``element`` from."""
        return (element[0], element[1][1], element[2])

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """A fired window: per key (in the order keys first came), its pairs left-major, each side in
        arrival order; the unpaired records of an outer kind with ``None``."""
        sides: dict[Any, tuple[list[Element], list[Element]]] = {}
        for side in (LEFT, RIGHT):
            for element in sorted(inputs.elements(side), key=_arrival):
                sides.setdefault(element[0], ([], []))[side].append(self.unstamped(element))
        for key, (lefts, rights) in sides.items():
            for _key, value in self._joined(key, lefts, rights):
                outputs.emit(key, value)

    def _joined(self, key: Any, lefts: list[Element], rights: list[Element]) -> list[tuple[Any, Any]]:
        """One key's output: each left record's row of pairs under the error policy (a dead-lettered left
        record is left out of the window), then the unpaired side of an outer kind."""
        out: list[tuple[Any, Any]] = []
        paired = 0
        if rights:
            for left in lefts:
                row = self.outputs_of(left, partial(self._row, key, left, rights))
                if row is not None:
                    out.extend(row)
                    paired += 1
        if self.keeps_left and not rights:
            out.extend(self._unpaired(key, lefts, LEFT))
        if self.keeps_right and not paired:
            out.extend(self._unpaired(key, rights, RIGHT))
        return out

    def _row(self, key: Any, left: Element, rights: list[Element]) -> list[tuple[Any, Any]]:
        value = left[1]
        return [(key, self.value(key, value, right[1])) for right in rights]

    def _unpaired(self, key: Any, records: list[Element], side: int) -> list[tuple[Any, Any]]:
        out: list[tuple[Any, Any]] = []
        for element in records:
            value = element[1]
            build = partial(self._alone, key, value, side)
            results = self.outputs_of(element, build)
            if results is not None:
                out.extend(results)
        return out

    def _alone(self, key: Any, value: Any, side: int) -> list[tuple[Any, Any]]:
        left, right = (value, None) if side == LEFT else (None, value)
        return [(key, self.value(key, left, right))]
