"""The as-of join (Flink's event-time temporal join, Quix's ``join_asof``): each left record meets the
right record of its key with the greatest ``ts <= left.ts``, once the watermark has passed ``left.ts``.

State per key is ``[lefts, versions]``: the left records waiting for the
watermark (``[ts, value]``, in arrival order) and the right records
(``[ts, value]``, sorted by ``ts``; among equal ``ts`` in arrival order, so
the last one wins). With watermark ``W`` the versions kept are those with
``ts > W - grace`` and the newest one at or before ``W - grace``: once the
watermark reaches ``version.ts + grace``, the versions before it go (the
index wakes a key once the watermark *passes* a time, so that time is the
float just below).
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


class AsofJoin(EventTimeJoin):
    """``topology.asof_join``: see :meth:`streamlet.Topology.asof_join`."""

    kinds = ("inner", "left")

    def __init__(self, how: str = "inner", fn: JoinFunction | None = None, grace: float | None = None) -> None:
        super().__init__(how, fn)
        self.grace = 0.0 if grace is None else grace

    def on_right(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Insert each right record among its key's versions (a ``None`` value ends the row from its ts on)."""
        values, grace, scheduled = self.state.values, self.grace, self._next
        due, order, watermark = self._due, self._order, self.timers.watermark
        held = len(batch)
        for element in batch:
            key, ts = element[0], element[2]
            if (type(ts) is not float and type(ts) is not int) or ts != ts:  # not a number, or NaN
                self.check_ts(element, RIGHT, inputs)  # raises, naming the node and key
            entry = values.get(key)
            if entry is None:
                entry = values[key] = [[], []]
            versions = entry[RIGHT]
            if not versions or versions[-1][0] <= ts:  # in order, the common case: no search
                versions.append([ts, element[1]])
            else:
                versions.insert(bisect.bisect_right(versions, ts, key=_ts_of), [ts, element[1]])
            if len(versions) > 1:
                if versions[1][0] + grace <= watermark:  # behind the watermark: older versions go at once
                    held -= self._drop_versions(versions, watermark - grace)
                if len(versions) > 1:  # once the watermark reaches the second's ts + grace, the first goes
                    when = _just_below(versions[1][0] + grace)
                    if when < scheduled.get(key, math.inf):
                        scheduled[key] = when
                        heapq.heappush(due, (when, next(order), key))
        self.hooks.counters.hold(held)

    def on_left(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Hold each left record until the watermark passes its ts (join it now if it already has)."""
        values, scheduled = self.state.values, self._next
        due, order = self._due, self._order
        watermark, grace = self.timers.watermark, self.grace
        out: list[Element] = []
        held = 0
        for element in batch:
            key, ts = element[0], element[2]
            if (type(ts) is not float and type(ts) is not int) or ts != ts:  # not a number, or NaN
                self.check_ts(element, LEFT, inputs)  # raises, naming the node and key
            if watermark > ts:
                if ts < watermark - grace:  # further behind than grace: its versions may be gone
                    self.send_late(element, outputs)
                else:  # already due: what it meets cannot change any more by the rules
                    entry = values.get(key)
                    self._join(key, element[1], ts, [] if entry is None else entry[RIGHT], out)
                continue
            entry = values.get(key)
            if entry is None:
                entry = values[key] = [[], []]
            entry[LEFT].append([ts, element[1]])
            held += 1
            if ts < scheduled.get(key, math.inf):  # due once the watermark is past it
                scheduled[key] = ts
                heapq.heappush(due, (ts, next(order), key))
        self.hooks.counters.hold(held)
        if out:
            outputs.emit_elements(out)

    def _join(self, key: Any, value: Any, ts: float, versions: list[list[Any]], out: list[Element]) -> None:
        """Add to ``out`` the output of the left record ``(key, value, ts)`` against ``versions``."""
        if versions and versions[-1][0] <= ts:  # the newest qualifies, the common case: no search
            right = versions[-1][1]
        else:
            at = bisect.bisect_right(versions, ts, key=_ts_of)
            right = versions[at - 1][1] if at else None
        if right is None and not self.keeps_left:  # no version, or a tombstone: no match
            return
        if self.fn is None:  # the default pair cannot fail
            out.append((key, (value, right), ts))
            return
        results = self.outputs_of((key, value, ts), partial(self._joined, key, value, right, ts))
        if results is not None:
            out.extend(results)

    def _joined(self, key: Any, value: Any, right: Any, ts: float) -> list[Element]:
        return [(key, self.value(key, value, right), ts)]

    def expire(self, key: Any, entry: list[Any], watermark: float, out: list[Element]) -> float | None:
        """Join the key's left records now due (the watermark passed their ts), then drop the versions no
        left record can meet any more; when something is due next."""
        lefts, versions = entry
        due, counters = math.inf, self.hooks.counters
        if lefts:
            waiting = []
            plain = self.fn is None and not self.keeps_left
            for left in lefts:
                ts = left[0]
                if ts < watermark:
                    if plain and versions and versions[-1][0] <= ts and versions[-1][1] is not None:
                        out.append((key, (left[1], versions[-1][1]), ts))  # the newest version: no search
                    else:
                        self._join(key, left[1], ts, versions, out)
                else:
                    waiting.append(left)
                    if ts < due:
                        due = ts
            if len(waiting) < len(lefts):
                counters.held -= len(lefts) - len(waiting)
                entry[LEFT] = waiting
        if versions:
            self.hooks.counters.held -= self._drop_versions(versions, watermark - self.grace)
            if len(versions) > 1:
                due = min(due, _just_below(versions[1][0] + self.grace))
        return None if due == math.inf else due

    def next_due(self, entry: list[Any]) -> float | None:
        """When the first waiting left record is due, or the second version can retire the first."""
        lefts, versions = entry
        first = min((left[0] for left in lefts), default=math.inf)
        if len(versions) > 1:
            first = min(first, _just_below(versions[1][0] + self.grace))
        return None if first == math.inf else first

    def held_in(self, entry: list[Any]) -> int:
        """Its waiting left records and its versions."""
        return len(entry[LEFT]) + len(entry[RIGHT])

    @staticmethod
    def _drop_versions(versions: list[list[Any]], cut: float) -> int:
        """Keep the versions after ``cut`` and the newest at or before it (a tombstone too: a right record
        behind the watermark that came later must not become the row again for the left records after it);
        how many went."""
        if len(versions) < 2 or versions[1][0] > cut:
            return 0  # the common case: the oldest is the newest at or before the cut, nothing to drop
        newest = bisect.bisect_right(versions, cut, key=_ts_of) - 1  # >= 1: versions[1] is at or before the cut
        del versions[:newest]
        return newest


def _just_below(seconds: float) -> float:
    """The float below ``seconds``: the index wakes a key once the watermark is greater than a time, and a
    version goes once the watermark reaches ``seconds``."""
    return math.nextafter(seconds, -math.inf)
