"""A job's quality of service: the latency it must keep, and what it may give up to keep it (ETRI).

When the job's latency passes ``max_latency`` and no capacity can be added,
the ``shed`` policy drops a share of the sources' records, never more than
``max_shed_ratio``. Shed records are counted per source and go to its
``SHED`` output port when something is connected there; with ``recover``
they are held instead and replayed once the load falls, and with
``preserve_order`` the replay comes before any newer record of that source
instance (otherwise it is mixed in with them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamlet.errors import TopologyError


@dataclass(frozen=True, slots=True)
class QoS:
    """``max_latency`` seconds; ``max_shed_ratio`` the largest share of records shed (0..1)."""

    max_latency: float
    max_shed_ratio: float = 0.0
    recover: bool = False
    preserve_order: bool = False

    def __post_init__(self) -> None:
        if not self.max_latency > 0:
            raise TopologyError(f"QoS max_latency must be > 0 seconds, got {self.max_latency!r}")
        if not 0 <= self.max_shed_ratio <= 1:
            raise TopologyError(f"QoS max_shed_ratio must be within 0..1, got {self.max_shed_ratio!r}")
        if self.preserve_order and not self.recover:
            raise TopologyError("QoS preserve_order orders the replay of shed records: it needs recover=True")

    def to_data(self) -> dict[str, Any]:
        """Plain data (a spec, ``jobs --json``)."""
        return {
            "max_latency": self.max_latency,
            "max_shed_ratio": self.max_shed_ratio,
            "recover": self.recover,
            "preserve_order": self.preserve_order,
        }
