"""Watermarks at run time: made by each source instance after every batch, combined by every receiver.

A source instance's :class:`WatermarkGenerator` turns the batches it reads
into a rising watermark; a receiver's :class:`InputWatermarks` keeps one per
incoming channel and takes the minimum over the channels that still hold it
back (open, not idle, not a loop's back edge). See ``core.model.watermarks``.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any

from streamlet.core.model.record import Batch
from streamlet.core.model.sources import SourceReader
from streamlet.core.model.views import RecordViews
from streamlet.core.model.watermarks import Watermarks

_ts = itemgetter(2)


class WatermarkGenerator:
    """One source instance's watermark: after each batch, the new value if it rose."""

    __slots__ = ("bound", "current", "fn", "reader", "regressions", "top", "views")

    def __init__(self, spec: Watermarks, reader: SourceReader) -> None:
        self.bound = spec.out_of_orderness
        self.fn = spec.fn
        self.views = RecordViews()  # the records the timestamp function reads, refilled batch after batch
        self.reader = reader
        self.current = -math.inf  # the last watermark sent
        self.top = -math.inf  # the largest event time read so far
        self.regressions = 0  # values below the current watermark, ignored

    def after_batch(self, batch: Batch) -> float | None:
        """The watermark to send after ``batch``, or ``None`` when it did not rise."""
        progress = self.reader.event_time_progress()
        if self.fn is not None:
            candidate = _largest(map(self.fn, self.views.records_of(batch)))  # user code: it sees records
        elif progress is not None:
            candidate = progress - self.bound
        else:
            candidate = self._largest_ts(batch) - self.bound
        if candidate is None or candidate <= self.current:
            if candidate is not None and candidate < self.current:
                self.regressions += 1  # only a user's function or a reader can go back: the largest ts cannot
            return None
        self.current = candidate
        return float(candidate)

    def _largest_ts(self, batch: Batch) -> float:
        try:
            top = max(map(_ts, batch))  # the fast path: every record has a ts
        except TypeError:  # some ts is None: those do not move event time
            top = None
        if top is None:
            top = _largest(element[2] for element in batch)
            if top is None:
                return self.top
        if top > self.top:
            self.top = top
        return self.top


def _largest(values: Any) -> Any:
    return max((value for value in values if value is not None), default=None)


class InputWatermarks:
    """Per incoming channel the last watermark and whether it is idle; their minimum is the input's watermark."""

    __slots__ = ("any_idle", "counted", "current", "idle", "values")

    def __init__(self, channels: int, back_channels: set[int]) -> None:
        self.values = [-math.inf] * channels
        self.idle = [False] * channels
        # back edges of loops carry no watermarks: they must not hold the loop's head back
        self.counted = [channel not in back_channels for channel in range(channels)]
        self.current = -math.inf  # the combined watermark, never going back
        self.any_idle = False  # some channel is idle: data on it must wake it (checked per batch, so kept flat)

    def add_channel(self) -> None:
        """A channel added while running (a rescale wired a new sender in): it counts from its first watermark."""
        self.values.append(-math.inf)
        self.idle.append(False)
        self.counted.append(True)

    def activate(self, channel: int) -> None:
        """Data arrived on ``channel``: if it was idle, it holds the watermark back again from now on."""
        self.idle[channel] = False
        self.any_idle = any(self.idle)

    def update(self, channel: int, ts: float, idle: bool) -> float | None:
        """A watermark (or an idle mark) arrived on ``channel``: the new combined watermark if it rose."""
        self.idle[channel] = idle
        self.any_idle = any(self.idle)
        if not idle and ts > self.values[channel]:
            self.values[channel] = ts
        return self._combine()

    def close(self, channel: int) -> float | None:
        """``channel`` ended: it holds nothing back any more."""
        self.counted[channel] = False
        return self._combine()

    def all_idle(self) -> bool:
        """Every channel that could hold the watermark back is idle (so this receiver is idle too)."""
        active = [c for c, counted in enumerate(self.counted) if counted]
        return bool(active) and all(self.idle[c] for c in active)

    def _combine(self) -> float | None:
        active = [self.values[c] for c, counted in enumerate(self.counted) if counted and not self.idle[c]]
        if not active:
            return None  # nothing holds it back, nothing moves it: wait for a channel to speak
        combined = min(active)
        if combined <= self.current:
            return None
        self.current = combined
        return combined
