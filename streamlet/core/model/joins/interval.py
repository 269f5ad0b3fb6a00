"""The interval join (Flink's): records of the same key pair when ``left.ts + lower <= right.ts <= left.ts + upper``.

State per key is ``[lefts, rights]``, each a list in arrival order of
``[ts, value, paired]``. A left record ``a`` is held until the watermark
passes ``a.ts + upper`` (no right record it could pair with can come after
that), a right record ``b`` until it passes ``b.ts - lower``; then it is
dropped, and an unpaired one of an outer kind is emitted with ``None`` on
the other side.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from functools import partial
from typing import Any

from streamlet.core.model.joins.base import LEFT, RIGHT, EventTimeJoin, JoinFunction
from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.record import Element


class IntervalJoin(EventTimeJoin):
    """``topology.interval_join``: see :meth:`streamlet.Topology.interval_join`."""

    kinds = ("inner", "left", "right", "outer")

    def __init__(self, lower: float, upper: float, how: str = "inner", fn: JoinFunction | None = None) -> None:
        super().__init__(how, fn)
        self.lower = lower
        self.upper = upper

    def on_left(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Pair each left record with the right ones held in its interval, then hold it until it closes."""
        self._arrive(batch, LEFT, self.lower, self.upper, self.upper, inputs, outputs)

    def on_right(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Pair each right record with the left ones whose interval holds it, then hold it until none can."""
        # b pairs with a when b.ts - upper <= a.ts <= b.ts - lower; it can pair until the watermark passes b.ts - lower
        self._arrive(batch, RIGHT, -self.upper, -self.lower, -self.lower, inputs, outputs)

    def _arrive(
        self,
        batch: list[Element],
        side: int,
        low: float,
        high: float,
        open_for: float,
        inputs: Inputs,
        outputs: Outputs,
    ) -> None:
        """Records of ``side``: a record at ``ts`` pairs with the other side's held records in
        ``[ts + low, ts + high]`` and can still pair until the watermark passes ``ts + open_for``."""
        values, due, order = self.state.values, self._due, self._order
        watermark, other = self.timers.watermark, 1 - side
        out: list[Element] = []
        held = 0
        for element in batch:
            ts = element[2]
            if type(ts) is not float and type(ts) is not int:
                self.check_ts(element, side, inputs)  # raises, naming the node and key
            closes = ts + open_for
            if watermark > closes:  # its interval closed before it came: it can pair with nothing
                self.send_late(element, outputs)
                continue
            key, value = element[0], element[1]
            entry = values.get(key)
            if entry is None:
                matches = []
            else:
                low_ts, high_ts = ts + low, ts + high
                matches = [record for record in entry[other] if low_ts <= record[0] <= high_ts]
            if matches:
                results = self.outputs_of(element, partial(self._pairs, key, value, ts, side, matches))
                if results is None:
                    continue  # dead-lettered: nothing of it is kept
                out.extend(results)
                for record in matches:
                    record[2] = True
            if entry is None:
                entry = values[key] = [[], []]
            entry[side].append([ts, value, bool(matches)])
            held += 1
            heapq.heappush(due, (closes, next(order), key))  # due once the watermark is past it
        self.hooks.counters.hold(held)
        if out:
            outputs.emit_elements(out)

    def _pairs(self, key: Any, value: Any, ts: float, side: int, matches: list[list[Any]]) -> list[Element]:
        """The output of one arriving record and the held ones it pairs with, in their arrival order."""
        if self.fn is None:  # the default pair
            if side == LEFT:
                return [(key, (value, held[1]), max(ts, held[0])) for held in matches]
            return [(key, (held[1], value), max(ts, held[0])) for held in matches]
        if side == LEFT:
            return [(key, self.value(key, value, held[1]), max(ts, held[0])) for held in matches]
        return [(key, self.value(key, held[1], value), max(ts, held[0])) for held in matches]

    def expire(self, key: Any, entry: list[Any], watermark: float, out: list[Element]) -> None:
        """Drop the key's records that can pair no more, adding the unpaired ones of an outer kind to ``out``."""
        entry[LEFT] = self._expire(key, entry[LEFT], self.upper, watermark, self.keeps_left, LEFT, out)
        entry[RIGHT] = self._expire(key, entry[RIGHT], -self.lower, watermark, self.keeps_right, RIGHT, out)

    def whens(self, entry: list[Any]) -> Iterator[float]:
        """When each held record's interval closes."""
        yield from (record[0] + self.upper for record in entry[LEFT])
        yield from (record[0] - self.lower for record in entry[RIGHT])

    def _expire(
        self,
        key: Any,
        held: list[list[Any]],
        open_for: float,
        watermark: float,
        emits: bool,
        side: int,
        out: list[Element],
    ) -> list[list[Any]]:
        """``held`` without the records closed by ``watermark``; those never paired are emitted when ``emits``."""
        kept = [record for record in held if record[0] + open_for >= watermark]
        if len(kept) == len(held):
            return held
        self.hooks.counters.hold(len(kept) - len(held))
        if emits:
            for ts, value, paired in held:
                if not paired and ts + open_for < watermark:
                    self._unpaired(key, value, ts, side, out)
        return kept

    def _unpaired(self, key: Any, value: Any, ts: float, side: int, out: list[Element]) -> None:
        """Add to ``out`` the record that never paired, with ``None`` on the other side."""
        left, right = (value, None) if side == LEFT else (None, value)
        results = self.outputs_of((key, value, ts), lambda: [(key, self.value(key, left, right), ts)])
        if results is not None:
            out.extend(results)
