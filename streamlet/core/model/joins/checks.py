"""What the join operators refuse when a topology is built (each message names the node)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from streamlet.core.model.windows import SessionWindow, TimeWindow
from streamlet.errors import TopologyError


def _seconds(value: Any) -> bool:
    return type(value) is not bool and isinstance(value, int | float) and math.isfinite(value)


def check_interval(name: str, lower: Any, upper: Any) -> None:
    """``lower`` and ``upper`` are finite seconds with ``lower <= upper``."""
    for label, bound in (("lower", lower), ("upper", upper)):
        if not _seconds(bound):
            raise TopologyError(f"task '{name}': {label} must be a number of seconds, got {bound!r}")
    if lower > upper:
        raise TopologyError(f"task '{name}': lower ({lower!r}) must be at most upper ({upper!r})")


def check_grace(name: str, grace: Any) -> None:
    """``grace`` is ``None`` or seconds >= 0."""
    if grace is not None and not (_seconds(grace) and grace >= 0):
        raise TopologyError(f"task '{name}': grace must be None or a number of seconds >= 0, got {grace!r}")


def join_window(name: str, window: Any) -> TimeWindow | SessionWindow:
    """The window a window join runs on: a ``TimeWindow`` or a ``SessionWindow`` firing once per window (a
    window fired again, early or late, would emit its pairs again), on event time refusing records without
    ``ts`` (as every event-time join does)."""
    if not isinstance(window, TimeWindow | SessionWindow):
        raise TopologyError(f"task '{name}': window_join needs a TimeWindow or a SessionWindow, got {window!r}")
    window.validate(f"task '{name}'")
    if window.allowed_lateness or getattr(window, "early_firing", None) is not None:
        raise TopologyError(
            f"task '{name}': window_join fires each window once (its pairs would come out again): "
            "no allowed_lateness or early_firing; late records go to the LATE port"
        )
    if window.time == "event" and window.missing_ts == "clock":
        return dataclasses.replace(window, missing_ts="fail")
    return window
