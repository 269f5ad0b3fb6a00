"""The built-in joins: interval, window, table and as-of (``Topology.interval_join`` and the others)."""

from __future__ import annotations

from streamlet.core.model.joins.asof import AsofJoin
from streamlet.core.model.joins.base import (
    LEFT,
    RIGHT,
    EventTimeJoin,
    JoinCounters,
    JoinFunction,
    JoinHooks,
    JoinTask,
)
from streamlet.core.model.joins.interval import IntervalJoin
from streamlet.core.model.joins.table import TableJoin
from streamlet.core.model.joins.window import WindowJoin

__all__ = (
    "LEFT",
    "RIGHT",
    "AsofJoin",
    "EventTimeJoin",
    "IntervalJoin",
    "JoinCounters",
    "JoinFunction",
    "JoinHooks",
    "JoinTask",
    "TableJoin",
    "WindowJoin",
)
