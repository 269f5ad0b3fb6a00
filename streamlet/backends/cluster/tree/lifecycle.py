"""Job and worker lifecycles as data: every state, every legal move, in this one file.

Jobs::

    SUBMITTED -> SCHEDULED -> RUNNING <-> RECOVERING / RECONFIGURING
                     |            |
                     +-> STALLED <+   (no live worker can take it; resumes when one joins)
    any of those -> FINISHED | FAILED | KILLED   (ended: nothing moves on from there)

The leader writes a job's state (with a reason and a timestamp) to
``/jobs/<job>/state``; workers, clients and ``streamlet jobs`` read it. A move
that is not in :data:`JOB_MOVES` raises :class:`LifecycleError` naming both
states, so a bug in the leader cannot make a finished job run again.

Workers (SpeedStream): VOID (not registered), STANDBY (registered, nothing
assigned) or LIVE (running instances) in the store; *waiting* or *running*
locally.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from streamlet.backends.cluster.tree.paths import JobStateNode
from streamlet.core.model import world
from streamlet.errors import LifecycleError
from streamlet.redaction import scrub


class JobState(StrEnum):
    """Where a job is in its life."""

    SUBMITTED = "SUBMITTED"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    RECONFIGURING = "RECONFIGURING"
    STALLED = "STALLED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def ended(self) -> bool:
        """Nothing moves on from here."""
        return self in ENDED


ENDED = frozenset({JobState.FINISHED, JobState.FAILED, JobState.KILLED})
_ENDINGS = frozenset(ENDED)

JOB_MOVES: dict[JobState, frozenset[JobState]] = {
    JobState.SUBMITTED: frozenset({JobState.SCHEDULED, JobState.STALLED, JobState.FAILED, JobState.KILLED}),
    JobState.SCHEDULED: frozenset({JobState.RUNNING, JobState.RECOVERING, JobState.STALLED}) | _ENDINGS,
    JobState.RUNNING: frozenset({JobState.RECOVERING, JobState.RECONFIGURING, JobState.STALLED}) | _ENDINGS,
    JobState.RECOVERING: frozenset({JobState.RUNNING, JobState.RECOVERING, JobState.STALLED}) | _ENDINGS,
    JobState.RECONFIGURING: frozenset({JobState.RUNNING, JobState.RECOVERING, JobState.STALLED}) | _ENDINGS,
    JobState.STALLED: frozenset(
        {JobState.SCHEDULED, JobState.RECOVERING, JobState.STALLED, JobState.FAILED, JobState.KILLED}
    ),  # STALLED -> STALLED: the reason changed
    JobState.FINISHED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.KILLED: frozenset(),
}


def check_move(current: JobState, target: JobState) -> None:
    """Raise :class:`LifecycleError` unless a job may go from ``current`` to ``target``."""
    if target not in JOB_MOVES[current]:
        raise LifecycleError(f"a {current.value} job cannot become {target.value}")


def submitted(now: float | None = None) -> JobStateNode:
    """The state a job is born in."""
    at = world.wall_time() if now is None else now
    return {
        "state": JobState.SUBMITTED.value, "reason": "waiting for the leader to schedule it", "at": at,
        "attempt": 0, "started": None, "ended": None, "reconfigurations": 0,
    }  # fmt: skip


def moved(node: JobStateNode, target: JobState, reason: str, attempt: int, now: float | None = None) -> JobStateNode:
    """``node`` after a legal move to ``target`` (raises :class:`LifecycleError` otherwise)."""
    check_move(JobState(node["state"]), target)
    at = world.wall_time() if now is None else now
    return {
        **node,
        "state": target.value,
        "reason": scrub(reason),  # a failure's reason may quote a DSN: shown to anyone who lists jobs
        "at": at,
        "attempt": attempt,
        "started": node["started"] if node["started"] is not None or target != JobState.RUNNING else at,
        "ended": at if target.ended else None,
    }


def state_of(node: JobStateNode | dict[str, Any] | None) -> JobState:
    """The state a node holds (a job with no state node yet is SUBMITTED)."""
    return JobState.SUBMITTED if node is None else JobState(node["state"])


class WorkerState(StrEnum):
    """A worker as the cluster sees it."""

    VOID = "VOID"
    STANDBY = "STANDBY"
    LIVE = "LIVE"


class LocalState(StrEnum):
    """A worker as it sees itself."""

    WAITING = "waiting"
    RUNNING = "running"


WORKER_MOVES: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.VOID: frozenset({WorkerState.STANDBY}),
    WorkerState.STANDBY: frozenset({WorkerState.LIVE, WorkerState.VOID, WorkerState.STANDBY}),
    WorkerState.LIVE: frozenset({WorkerState.STANDBY, WorkerState.VOID, WorkerState.LIVE}),
}


def worker_states(running_jobs: int) -> tuple[WorkerState, LocalState]:
    """A registered worker's states given how many job parts it runs."""
    if running_jobs:
        return WorkerState.LIVE, LocalState.RUNNING
    return WorkerState.STANDBY, LocalState.WAITING
