"""Queue-state CPU scheduling (ETRI): how many batches an instance processes before it lets the others run.

All instances of a worker share one event loop. An instance whose input
queue is filling up (YELLOW, RED) is falling behind: it gets a larger share
of the loop (more batches per turn) so its queue, and the latency of what
waits there, come down; an instance with a NORMAL queue takes one batch and
yields. Nobody is starved: every instance yields after a bounded number of
batches. Pure functions: a queue's fill in, batches per turn out.
"""

from __future__ import annotations

from collections.abc import Callable

from streamlet.core.runtime.statistics import RED_FILL, YELLOW_FILL

TURNS = {"NORMAL": 1, "YELLOW": 2, "RED": 8}  # batches per turn by queue state


def queue_state_turns(fill: float) -> int:
    """Batches per turn for an instance whose fullest input channel is ``fill`` full (0..1)."""
    if fill >= RED_FILL:
        return TURNS["RED"]
    return TURNS["YELLOW"] if fill >= YELLOW_FILL else TURNS["NORMAL"]


def equal_turns(fill: float) -> int:
    """Plain turn-taking: one batch each, whatever the queues (the comparison for the policy above)."""
    return 1


SCHEDULING: dict[str, Callable[[float], int]] = {"queue-state": queue_state_turns, "turns": equal_turns}
