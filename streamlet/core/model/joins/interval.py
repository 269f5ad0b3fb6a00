"""The interval join (Flink's): records of the same key pair when ``left.ts + lower <= right.ts <= left.ts + upper``.

State per key is ``[lefts, rights]``, each a list in arrival order of
``[ts, value, paired]``. A left record ``a`` is held until the watermark
passes ``a.ts + upper`` (no right record it could pair with can come after
that), a right record ``b`` until it passes ``b.ts - lower``; one event-time
timer per such moment drops them then, emitting the unpaired ones of an
outer kind with ``None`` on the other side.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from streamlet.core.model.joins.base import LEFT, RIGHT, JoinFunction, StreamJoin, after
from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.record import Element
from streamlet.core.model.timers import TimeDomain


class IntervalJoin(StreamJoin):
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
        values, timers, counters = self.state.values, self.timers, self.hooks.counters
        watermark, other = timers.watermark, 1 - side
        out: list[Element] = []
        for element in batch:
            ts = self.check_ts(element, side, inputs)
            closes = ts + open_for
            if watermark > closes:  # its interval closed before it came: it can pair with nothing
                self.send_late(element, outputs)
                continue
            key, value = element[0], element[1]
            entry = values.get(key)
            matches = [] if entry is None else self._matches(entry[other], ts + low, ts + high)
            if matches:
                results = self.outputs_of(element, partial(self._pairs, key, value, ts, side, matches))
                if results is None:
                    continue  # dead-lettered: nothing of it is kept
                out.extend(results)
                for held in matches:
                    held[2] = True
            if entry is None:
                entry = values[key] = [[], []]
            entry[side].append([ts, value, bool(matches)])
            counters.hold(1)
            timers.at(key, after(closes))
        if out:
            outputs.emit_elements(out)

    @staticmethod
    def _matches(held: list[list[Any]], low: float, high: float) -> list[list[Any]]:
        return [record for record in held if low <= record[0] <= high]

    def _pairs(self, key: Any, value: Any, ts: float, side: int, matches: list[list[Any]]) -> list[Element]:
        """The output of one arriving record and the held ones it pairs with, in their arrival order."""
        if side == LEFT:
            return [(key, self.value(key, value, held[1]), max(ts, held[0])) for held in matches]
        return [(key, self.value(key, held[1], value), max(ts, held[0])) for held in matches]

    def on_timer(self, key: Any, when: float, time: TimeDomain, outputs: Outputs) -> None:
        """The watermark passed ``when``: drop the key's records that can pair no more (emitting the
        unpaired ones of an outer kind)."""
        entry = self.state.values.get(key)
        if entry is None:
            return
        lefts, rights = entry
        entry[LEFT] = self._expire(key, lefts, self.upper, when, self.keeps_left, LEFT, outputs)
        entry[RIGHT] = self._expire(key, rights, -self.lower, when, self.keeps_right, RIGHT, outputs)
        if not entry[LEFT] and not entry[RIGHT]:
            del self.state.values[key]

    def _expire(
        self, key: Any, held: list[list[Any]], open_for: float, when: float, emits: bool, side: int, outputs: Outputs
    ) -> list[list[Any]]:
        """``held`` without the records closed by ``when``; those never paired are emitted when ``emits``."""
        kept = [record for record in held if after(record[0] + open_for) > when]
        if len(kept) == len(held):
            return held
        self.hooks.counters.hold(len(kept) - len(held))
        if emits:
            for ts, value, paired in held:
                if not paired and after(ts + open_for) <= when:
                    self._emit_unpaired(key, value, ts, side, outputs)
        return kept

    def _emit_unpaired(self, key: Any, value: Any, ts: float, side: int, outputs: Outputs) -> None:
        element = (key, value, ts)
        if side == LEFT:
            results = self.outputs_of(element, lambda: [(key, self.value(key, value, None), ts)])
        else:
            results = self.outputs_of(element, lambda: [(key, self.value(key, None, value), ts)])
        if results is not None:
            outputs.emit_elements(results)
