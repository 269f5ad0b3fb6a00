"""What adaptation a job asks for (``streamlet submit --adapt autoscale,rebalance``): policies, bounds, pace."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamlet.errors import JobError

# what each does: docs/cluster/adaptation.md
POLICIES = ("autoscale", "balance", "migrate", "rebalance", "shed", "spread")
DEFAULT_POLICIES = frozenset({"spread"})  # what a cluster job runs under when it names none (``--adapt none``: nothing)


@dataclass(frozen=True, slots=True)
class AdaptSettings:
    """The policies a job runs under, and how.

    ``bounds``: per task, the fewest and most instances autoscaling may give it (a task not named keeps 1 to
    its ``max_parallelism``); ``interval``: seconds between looks at the statistics (one window of rates);
    ``cooldown``: seconds after a decision before the next one for the same job (the change settles, and
    the rates after it are measured afresh).
    """

    policies: frozenset[str]
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    interval: float = 2.0
    cooldown: float = 6.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.policies) - set(POLICIES))
        if unknown:
            raise JobError(f"no adaptation policy called {', '.join(map(repr, unknown))} (there are {list(POLICIES)})")
        for task, (low, high) in self.bounds.items():
            if not 1 <= low <= high:
                raise JobError(f"autoscale bounds of task '{task}' must be 1 <= low <= high, not {low}:{high}")
        if self.interval <= 0 or self.cooldown < 0:
            raise JobError(f"adaptation interval must be > 0 and cooldown >= 0, not {self.interval}, {self.cooldown}")

    def to_data(self) -> dict[str, Any]:
        """What the job's spec holds."""
        return {
            "policies": sorted(self.policies),
            "bounds": {task: list(bound) for task, bound in self.bounds.items()},
            "interval": self.interval,
            "cooldown": self.cooldown,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> AdaptSettings:
        """The settings a spec holds."""
        bounds = {str(task): (int(low), int(high)) for task, (low, high) in (data.get("bounds") or {}).items()}
        return cls(
            frozenset(data.get("policies") or ()),
            bounds,
            float(data.get("interval", 2.0)),
            float(data.get("cooldown", 6.0)),
        )


def default_settings() -> AdaptSettings:
    """What a cluster job that asked for no adaptation runs under: ``spread`` (a CPU-bound task's instances do
    not share a core), looking at every heartbeat with no cooldown to wait out (one change at a time still)."""
    return AdaptSettings(DEFAULT_POLICIES, interval=1.0, cooldown=1.0)


def settings_of(adapt: Mapping[str, Any] | None) -> AdaptSettings:
    """The settings a spec's ``adapt`` holds; the defaults when it holds none (a spec from before the default)."""
    return default_settings() if not adapt else AdaptSettings.from_data(adapt)


def parse_policies(text: str) -> frozenset[str]:
    """``"autoscale,rebalance"`` -> the policies (an unknown one is a :class:`JobError` naming the known);
    ``"none"`` -> no policy at all (not even the default ``spread``)."""
    if text.strip() == "none":
        return frozenset()
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    AdaptSettings(names)  # checks them
    return names


def parse_bounds(items: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``["count=1:8"]`` -> ``{"count": (1, 8)}``."""
    bounds = {}
    for item in items:
        task, _, span = item.partition("=")
        low, _, high = span.partition(":")
        if not task or not low.isdigit() or not high.isdigit():
            raise JobError(f"autoscale bounds are TASK=LOW:HIGH (e.g. count=1:8), not {item!r}")
        bounds[task] = (int(low), int(high))
    return bounds
