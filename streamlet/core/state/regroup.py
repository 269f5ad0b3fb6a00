"""Splitting and merging a task instance's snapshot by key: what moves when segments move.

A task snapshot (``TaskInstance.snapshot()``) holds keyed state, its write
times under a TTL, per-key timers and window state. All of it is per key,
so a snapshot splits into parts by an ``owner(key) -> instance`` function
and parts of disjoint keys merge back into one. A live rescale splits the
state of the instances that lose segments; a restore with a different layout
merges every old instance's snapshot and splits for the new one. Window kinds
that count an instance's records as a whole (not per key) cannot split while
they hold open windows: :func:`unsplittable_window` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.model.timers import Timers
from streamlet.core.model.windows import WindowSpec
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.rocks_sessions import window_form
from streamlet.core.state.rocks_timers import timer_list
from streamlet.core.windows.split import merge_window_snapshots, split_window_snapshot, unsplittable

Owner = Callable[[Any], int]


def unsplittable_window(spec: WindowSpec | None) -> str | None:
    """Why a task windowed by ``spec`` cannot hand state over by key (``None``: it can, or has no window)."""
    return None if spec is None else unsplittable(spec)


def split_task_snapshot(
    snapshot: dict[str, Any], owner: Owner, parts: int, home: int, window: WindowSpec | None
) -> list[dict[str, Any]]:
    """``snapshot`` as ``parts`` snapshots: part i holds the keys ``owner`` gives i (counters stay at ``home``)."""
    states = KeyedState.partition(snapshot["state"], parts, owner)
    timers = Timers.partition(timer_list(snapshot.get("timers")), parts, owner)
    windows: list[Any] = [None] * parts
    if window is not None and snapshot.get("window") is not None:
        windows = split_window_snapshot(window, window_form(window, snapshot["window"]), owner, parts, home)
    split = [
        {"state": states[i], "window": windows[i], "finished": snapshot["finished"], "timers": timers[i]}
        for i in range(parts)
    ]
    if "state_written" in snapshot:
        for entry, written in zip(split, KeyedState.partition(snapshot["state_written"], parts, owner), strict=True):
            entry["state_written"] = written
    if "arrivals" in snapshot:  # a window join's arrival numbers go on from the highest in every part
        for entry in split:
            entry["arrivals"] = snapshot["arrivals"]
    if snapshot.get("calls") is not None:  # map_async's entries: each goes with its record's key
        for entry, calls in zip(split, _split_calls(snapshot["calls"], owner, parts), strict=True):
            entry["calls"] = calls
    join = snapshot.get("join")
    if join is not None:  # a join's watermark holds for every part; its late count stays at home
        for index, entry in enumerate(split):
            entry["join"] = {"watermark": join["watermark"], "late": join["late"] if index == home else 0}
    return split


def merge_task_snapshots(snapshots: Sequence[dict[str, Any]], window: WindowSpec | None) -> dict[str, Any]:
    """One snapshot holding the keys of every one of ``snapshots`` (whose keys are disjoint)."""
    merged: dict[str, Any] = {
        "state": KeyedState.merge([snapshot["state"] for snapshot in snapshots]),
        "window": None,
        "finished": all(snapshot["finished"] for snapshot in snapshots),
        "timers": Timers.merge([timer_list(snapshot.get("timers")) for snapshot in snapshots]),
    }
    if window is not None:
        windows = [window_form(window, s["window"]) for s in snapshots if s.get("window") is not None]
        if windows:
            merged["window"] = merge_window_snapshots(window, windows)
    written = [snapshot["state_written"] for snapshot in snapshots if "state_written" in snapshot]
    if written:
        merged["state_written"] = KeyedState.merge(written)
    arrivals = [snapshot["arrivals"] for snapshot in snapshots if "arrivals" in snapshot]
    if arrivals:
        merged["arrivals"] = max(arrivals)
    calls = [snapshot["calls"] for snapshot in snapshots if snapshot.get("calls") is not None]
    if calls:  # map_async's entries, each instance's in its input order
        merged["calls"] = pack_exact([entry for part in calls for entry in unpackb(part)], "map_async entries")
    joins = [snapshot["join"] for snapshot in snapshots if snapshot.get("join") is not None]
    if joins:  # every instance saw the same watermark at the barrier; the least of them is the safe one
        merged["join"] = {"watermark": min(j["watermark"] for j in joins), "late": sum(j["late"] for j in joins)}
    return merged


def _split_calls(packed: bytes, owner: Owner, parts: int) -> list[bytes]:
    """``map_async``'s stored entries ``(key, value, ts, answer)`` split by ``owner(key)``, order kept."""
    split: list[list[Any]] = [[] for _ in range(parts)]
    for entry in unpackb(packed):
        split[owner(entry[0])].append(entry)
    return [pack_exact(part, "map_async entries") for part in split]


def regroup(
    snapshots: Sequence[dict[str, Any]], owner: Owner, parts: int, window: WindowSpec | None
) -> list[dict[str, Any]]:
    """Snapshots of any number of instances, regrouped for ``parts`` instances by ``owner``."""
    return split_task_snapshot(merge_task_snapshots(snapshots, window), owner, parts, 0, window)
