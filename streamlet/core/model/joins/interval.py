"""The interval join (Flink's): records of the same key pair when ``left.ts + lower <= right.ts <= left.ts + upper``.

State per key is ``[lefts, rights]``, each a list of records sorted by
``ts`` (in arrival order among equal ``ts``), so the records that close
first are at the front: ``[ts, value, paired]`` on a side whose unpaired
records come out (an outer kind), else ``(ts, value)``.

Two rules, as in Flink's ``IntervalJoinOperator``, and kept apart on purpose:
a record is *late* when its own ``ts`` is behind the join's watermark (it
goes to ``LATE`` and pairs with nothing); an on-time record is *held* until
no on-time record of the other side can still pair with it: a left record
``a`` until the watermark passes ``a.ts + max(upper, 0)``, a right record
``b`` until it passes ``b.ts + max(-lower, 0)``. (When the interval lies
wholly on one side of ``a.ts``, the end of the interval is not when the
record turns useless: an on-time record of the other side at ``ts >= W`` can
still fall in it while ``W <= a.ts``.) Then it is dropped, and an unpaired
one of an outer kind is emitted with ``None`` on the other side.
"""

from __future__ import annotations

import bisect
import heapq
import math
from functools import partial
from operator import itemgetter
from typing import Any

from streamlet.core.model.joins.base import LEFT, RIGHT, EventTimeJoin, JoinFunction
from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.record import Element

_ts_of = itemgetter(0)
_NONE: list[list[Any]] = []  # no match (never changed)


class IntervalJoin(EventTimeJoin):
    """``topology.interval_join``: see :meth:`streamlet.Topology.interval_join`."""

    kinds = ("inner", "left", "right", "outer")

    def __init__(self, lower: float, upper: float, how: str = "inner", fn: JoinFunction | None = None) -> None:
        super().__init__(how, fn)
        self.lower = lower
        self.upper = upper
        # per side: how long after its ts a held record can still pair with an on-time one, and whether an
        # unpaired one is emitted
        self._left_open, self._right_open = max(upper, 0.0), max(-lower, 0.0)
        self._sides = ((LEFT, self._left_open, self.keeps_left), (RIGHT, self._right_open, self.keeps_right))

    def on_left(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Pair each left record with the right ones held in its interval, then hold it until it closes."""
        self._arrive(batch, LEFT, self._left_open, inputs, outputs)

    def on_right(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Pair each right record with the left ones whose interval holds it, then hold it until none can."""
        self._arrive(batch, RIGHT, self._right_open, inputs, outputs)

    def _arrive(
        self,
        batch: list[Element],
        side: int,
        open_for: float,
        inputs: Inputs,
        outputs: Outputs,
    ) -> None:
        """Records of ``side``: a record at ``ts`` pairs with the other side's held records ``r`` for which
        ``a.ts + lower <= b.ts <= a.ts + upper`` (computed as written, whichever side comes second: in floats
        ``b.ts - upper <= a.ts`` is not the same test); it is late when the watermark is past ``ts``, else it
        is held until the watermark passes ``ts + open_for``."""
        lower, upper = self.lower, self.upper
        values, scheduled = self.state.values, self._next
        due, order = self._due, self._order
        watermark, other, plain = self.timers.watermark, 1 - side, self.fn is None
        keeps, marks = (self.keeps_left, self.keeps_right) if side == LEFT else (self.keeps_right, self.keeps_left)
        out: list[Element] = []
        held = 0
        for element in batch:
            key, value, ts = element[0], element[1], element[2]
            if (type(ts) is not float and type(ts) is not int) or ts != ts:  # not a number, or NaN
                self.check_ts(element, side, inputs)  # raises, naming the node and key
            if watermark > ts:  # behind the watermark: late, whether or not its interval is still open
                self.send_late(element, outputs)
                continue
            closes = ts + open_for
            entry = values.get(key)
            if entry is None:  # the common case with few records per key: nothing to pair with yet
                record = [ts, value, False] if keeps else (ts, value)
                values[key] = [[record], []] if side == LEFT else [[], [record]]
                held += 1
                scheduled[key] = closes  # a new entry: nothing of the key was scheduled
                heapq.heappush(due, (closes, next(order), key))
                continue
            others = entry[other]
            if not others:
                matches = others
            elif side == LEFT:
                low_ts, high_ts = ts + lower, ts + upper
                if len(others) == 1:  # the common case with few records per key: no comprehension to run
                    matches = others if low_ts <= others[0][0] <= high_ts else _NONE
                else:
                    matches = [record for record in others if low_ts <= record[0] <= high_ts]
            elif len(others) == 1:
                matches = others if others[0][0] + lower <= ts <= others[0][0] + upper else _NONE
            else:
                matches = [record for record in others if record[0] + lower <= ts <= record[0] + upper]
            if matches:
                if plain and side == LEFT:  # the default pair cannot fail
                    out += [(key, (value, record[1]), ts if ts >= record[0] else record[0]) for record in matches]
                elif plain:
                    out += [(key, (record[1], value), ts if ts >= record[0] else record[0]) for record in matches]
                else:
                    results = self.outputs_of(element, partial(self._pairs, key, value, ts, side, matches))
                    if results is None:
                        continue  # dead-lettered: nothing of it is kept
                    out += results
                if marks:
                    for record in matches:
                        record[2] = True
            own, record = entry[side], [ts, value, bool(matches)] if keeps else (ts, value)
            if not own or own[-1][0] <= ts:  # in order, the common case
                own.append(record)
            else:
                own.insert(bisect.bisect_right(own, ts, key=_ts_of), record)
            held += 1
            if closes < scheduled.get(key, math.inf):  # due once the watermark is past it
                scheduled[key] = closes
                heapq.heappush(due, (closes, next(order), key))
        self.hooks.counters.hold(held)
        if out:
            outputs.emit_elements(out)

    def _pairs(self, key: Any, value: Any, ts: float, side: int, matches: list[list[Any]]) -> list[Element]:
        """The output of one arriving record and the held ones it pairs with, in their ``ts`` order."""
        if side == LEFT:
            return [(key, self.value(key, value, held[1]), max(ts, held[0])) for held in matches]
        return [(key, self.value(key, held[1], value), max(ts, held[0])) for held in matches]

    def expire(self, key: Any, entry: list[Any], watermark: float, out: list[Element]) -> float | None:
        """Drop the key's records that can pair no more, adding the unpaired ones of an outer kind to
        ``out``; when the next held record closes."""
        due, counters = math.inf, self.hooks.counters
        for side, open_for, emits in self._sides:
            held = entry[side]
            if not held:
                continue
            closed, count = 0, len(held)
            while closed < count and held[closed][0] + open_for < watermark:  # sorted: the closed ones first
                closed += 1
            if closed:
                counters.held -= closed
                if emits:
                    for ts, value, paired in held[:closed]:
                        if not paired:
                            self._unpaired(key, value, ts, side, out)
                del held[:closed]
            if held and held[0][0] + open_for < due:
                due = held[0][0] + open_for
        return None if due == math.inf else due

    def next_due(self, entry: list[Any]) -> float | None:
        """When the first held record can pair no more."""
        lefts, rights = entry
        if not lefts and not rights:
            return None
        return min(
            min((record[0] for record in lefts), default=math.inf) + self._left_open,
            min((record[0] for record in rights), default=math.inf) + self._right_open,
        )

    def held_in(self, entry: list[Any]) -> int:
        """Its left and right records."""
        return len(entry[LEFT]) + len(entry[RIGHT])

    def _unpaired(self, key: Any, value: Any, ts: float, side: int, out: list[Element]) -> None:
        """Add to ``out`` the record that never paired, with ``None`` on the other side."""
        left, right = (value, None) if side == LEFT else (None, value)
        results = self.outputs_of((key, value, ts), lambda: [(key, self.value(key, left, right), ts)])
        if results is not None:
            out.extend(results)
