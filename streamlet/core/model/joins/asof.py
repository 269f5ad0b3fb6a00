"""The as-of join (Flink's event-time temporal join, Quix's ``join_asof``): each left record meets the
right record of its key with the greatest ``ts <= left.ts``, once the watermark has passed ``left.ts``.

State per key is ``[lefts, versions]``: the left records waiting for the
watermark (``[ts, value]``, in arrival order) and the right records
(``[ts, value]``, sorted by ``ts``; among equal ``ts`` in arrival order, so
the last one wins). With watermark ``W`` the versions kept are those with
``ts > W - grace`` and the newest one at or before ``W - grace``; a timer at
``version.ts + grace`` drops the older ones once that version is the newest
such.
"""

from __future__ import annotations

import bisect
from functools import partial
from operator import itemgetter
from typing import Any

from streamlet.core.model.joins.base import LEFT, RIGHT, JoinFunction, StreamJoin, after
from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.record import Element
from streamlet.core.model.timers import TimeDomain

_ts_of = itemgetter(0)


class AsofJoin(StreamJoin):
    """``topology.asof_join``: see :meth:`streamlet.Topology.asof_join`."""

    kinds = ("inner", "left")

    def __init__(self, how: str = "inner", fn: JoinFunction | None = None, grace: float | None = None) -> None:
        super().__init__(how, fn)
        self.grace = 0.0 if grace is None else grace

    def on_right(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Insert each right record among its key's versions (a ``None`` value ends the row from its ts on)."""
        values, timers, counters, grace = self.state.values, self.timers, self.hooks.counters, self.grace
        for element in batch:
            ts = self.check_ts(element, RIGHT, inputs)
            key = element[0]
            entry = values.get(key)
            if entry is None:
                entry = values[key] = [[], []]
            versions = entry[RIGHT]
            at = bisect.bisect_right(versions, ts, key=_ts_of)
            versions.insert(at, [ts, element[1]])
            counters.hold(1)
            if len(versions) > 1:  # once the watermark passes ts + grace, the versions before it go
                timers.at(key, ts + grace)

    def on_left(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Hold each left record until the watermark passes its ts (join it now if it already has)."""
        values, timers, counters = self.state.values, self.timers, self.hooks.counters
        watermark, grace = timers.watermark, self.grace
        out: list[Element] = []
        for element in batch:
            ts = self.check_ts(element, LEFT, inputs)
            if ts < watermark - grace:  # further behind than grace: its versions may be gone
                self.send_late(element, outputs)
                continue
            key = element[0]
            entry = values.get(key)
            if watermark > ts:  # already due: what it meets cannot change any more by the rules
                versions = [] if entry is None else entry[RIGHT]
                results = self._join(key, element[1], ts, versions)
                if results is not None:
                    out.extend(results)
                continue
            if entry is None:
                entry = values[key] = [[], []]
            entry[LEFT].append([ts, element[1]])
            counters.hold(1)
            timers.at(key, after(ts))
        if out:
            outputs.emit_elements(out)

    def _join(self, key: Any, value: Any, ts: float, versions: list[list[Any]]) -> list[Element] | None:
        """The output of the left record ``(key, value, ts)`` against ``versions`` (``[]``: none)."""
        at = bisect.bisect_right(versions, ts, key=_ts_of)
        right = versions[at - 1][1] if at else None
        if right is None and not self.keeps_left:  # no version, or a tombstone: no match
            return []
        return self.outputs_of((key, value, ts), partial(self._joined, key, value, right, ts))

    def _joined(self, key: Any, value: Any, right: Any, ts: float) -> list[Element]:
        return [(key, self.value(key, value, right), ts)]

    def on_timer(self, key: Any, when: float, time: TimeDomain, outputs: Outputs) -> None:
        """The watermark reached ``when``: join the left records now due, then drop the versions no left
        record can meet any more."""
        entry = self.state.values.get(key)
        if entry is None:
            return
        lefts, versions = entry
        due = [left for left in lefts if after(left[0]) <= when]
        if due:
            entry[LEFT] = [left for left in lefts if after(left[0]) > when]
            self.hooks.counters.hold(-len(due))
            for ts, value in due:
                results = self._join(key, value, ts, versions)
                if results:
                    outputs.emit_elements(results)
        self._drop_versions(entry, when - self.grace)
        if not entry[LEFT] and not entry[RIGHT]:
            del self.state.values[key]

    def _drop_versions(self, entry: list[Any], cut: float) -> None:
        """Keep the versions after ``cut`` and the newest at or before it (not a tombstone: it matches nothing)."""
        versions = entry[RIGHT]
        newest = bisect.bisect_right(versions, cut, key=_ts_of) - 1
        if newest < 0:
            return
        if versions[newest][1] is None:
            newest += 1  # a tombstone as the oldest version kept means what no version means
        if newest:
            del versions[:newest]
            self.hooks.counters.hold(-newest)
