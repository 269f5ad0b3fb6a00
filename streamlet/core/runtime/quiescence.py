"""When a loop whose instances run in several processes is quiet for good: the pure rules of the four-counter
method that the cluster's termination detector (and processes=N) apply to the counters each process reports,
round after round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamlet.core.runtime.cycles import LoopCounters

ROUND_PAUSE = 0.02  # seconds between rounds while a loop runs; doubles each busy round ...
MAX_ROUND_PAUSE = 0.5  # ... up to this, so a long-running loop costs ZooKeeper two rounds a second

LoopView = dict[str, LoopCounters]  # one loop in one round: worker -> its counters


def looks_quiet(view: LoopView) -> bool:
    """One round shows nothing in flight, nothing busy and no sender outside the loop still open."""
    counters = view.values()
    balanced = sum(c.sent for c in counters) == sum(c.received for c in counters)
    return balanced and all(c.external_open == 0 and not c.busy for c in counters)


def quiet(previous: LoopView | None, current: LoopView) -> bool:
    """Two successive rounds with the same counters that look quiet: the loop is quiet for good."""
    return previous == current and looks_quiet(current)


def loop_views(answers: Mapping[str, Mapping[str, Any]]) -> dict[str, LoopView]:
    """Per loop, every worker's counters, from the workers' answers to one round."""
    views: dict[str, LoopView] = {}
    for worker, answer in answers.items():
        for loop, counters in answer["loops"].items():
            views.setdefault(loop, {})[worker] = LoopCounters(
                int(counters["sent"]), int(counters["received"]), int(counters["external_open"]),
                bool(counters["busy"]),
            )  # fmt: skip
    return views
