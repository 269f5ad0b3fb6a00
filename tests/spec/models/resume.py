"""A brute-force model of what a job with checkpoints leaves after crashes and resumes (docs/state.md).

State is exactly-once and ``sl.FileSink`` output is exactly-once across crashes, so a job that crashed any
number of times after any checkpoints and was resumed (with the same or another parallelism, after live
rescales) must leave what one run without a crash leaves. That answer is recomputed here from the whole
input, a list of records ``(key, value, ts)`` in the order the source reads them, with plain loops:

* ``totals``: each key's sum (a task's ``self.state`` emitted by ``finish``; ``aggregate("sum", emit="end")``);
* ``running``: each key's running sum after every one of its records, in order (``reduce(emit="record")``);
* ``windows``: each key's ``(sum, ts)`` per tumbling event-time window, in the order of the windows, stamped
  with the window's last tick (``window_reduce("sum")`` and ``aggregate("sum", window=...)``). The inputs are
  made so that no record can be late whatever the source's batches (every record is at most the source's
  ``out_of_orderness`` behind the newest before it: ``on_time``), so every record counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

Rec = tuple[Any, int, float]  # (key, value, ts)


def totals(records: Sequence[Rec]) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for key, value, _ in records:
        out[key] = out.get(key, 0) + value
    return out


def running(records: Sequence[Rec]) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = {}
    for key, value, _ in records:
        values = out.setdefault(key, [])
        values.append((values[-1] if values else 0) + value)
    return out


def on_time(records: Sequence[Rec], out_of_orderness: float) -> bool:
    """No record is more than ``out_of_orderness`` behind the newest event time before it."""
    newest = None
    for _, _, ts in records:
        if newest is not None and ts < newest - out_of_orderness:
            return False
        newest = ts if newest is None else max(newest, ts)
    return True


def windows(records: Sequence[Rec], size: float, ticks_per_second: int = 1000) -> dict[Any, list[tuple[int, float]]]:
    """Each key's ``(sum, ts of the window's last tick)`` per tumbling window of ``size`` seconds, by window."""
    size_ticks = round(Fraction(size) * ticks_per_second)
    sums: dict[Any, dict[int, int]] = {}
    for key, value, ts in records:
        tick = round(Fraction(ts) * ticks_per_second)
        start = tick // size_ticks * size_ticks
        per_key = sums.setdefault(key, {})
        per_key[start] = per_key.get(start, 0) + value
    return {
        key: [(total, (start + size_ticks - 1) / ticks_per_second) for start, total in sorted(per_key.items())]
        for key, per_key in sums.items()
    }
