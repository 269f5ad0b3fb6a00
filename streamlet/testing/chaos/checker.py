"""The checks of a chaos run: answers, state moves, leadership, and that the job ends.

Pure functions over what a run observed, so a nemesis against real processes
checks its runs with the same rules:

- :func:`compare_outputs`: what the sinks committed equals the in-process run
  of the same topology and input, record for record (key and value, each as
  often as in-process: none lost, none twice); with shedding, a record is in
  the output or counted as shed, never both.
- :func:`illegal_job_moves` / :func:`illegal_worker_moves`: every state the
  job and each worker went through follows the lifecycle tables.
- :class:`LeadershipWatch`: at most one master writes what the leader owns in
  an epoch, and only the master that won it.
- :func:`liveness`: once the last fault healed, the job FINISHED within the
  bound.

Example:
    >>> from streamlet.core.model.record import Record
    >>> compare_outputs({"out": [Record("a", 1), Record("a", 2)]}, {"out": [Record("a", 2), Record("a", 2)]})
    ["sink 'out': ('a', 1) committed 0 times, in-process 1", "sink 'out': ('a', 2) committed 2 times, in-process 1"]
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamlet.backends.cluster.tree.lifecycle import JOB_MOVES, WORKER_MOVES, JobState, WorkerState
from streamlet.core.model.record import Record

# a job FAILED or STALLED with one of these in its reason broke on the cluster's own code, not on a fault it
# explains (a lost copy, a worker gone): a violation, even though it did not hang
INTERNAL_ERRORS = (
    "ExceptionGroup", "CoordinationError", "AssertionError", "RuntimeError", "TypeError", "KeyError",
    "AttributeError", "IndexError", "NameError", "UnboundLocalError", "ZeroDivisionError",
)  # fmt: skip
MOST_REPORTED = 6  # differences listed per sink: the first few say enough


def frozen(value: Any) -> Any:
    """``value`` as something hashable and comparable (lists and tuples alike, dicts by sorted items)."""
    if isinstance(value, list | tuple):
        return tuple(frozen(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), frozen(v)) for k, v in value.items()))
    return value


def tally(records: Iterable[Record]) -> Counter[tuple[Any, Any]]:
    """How often each (key, value) occurs (event times aside: processing-time stamps differ run to run)."""
    return Counter((frozen(record.key), frozen(record.value)) for record in records)


def compare_outputs(
    expected: Mapping[str, Sequence[Record]],
    committed: Mapping[str, Sequence[Record]],
    shed: Mapping[str, Counter[tuple[Any, Any]]] | None = None,
    *,
    finished: bool = True,
) -> list[str]:
    """One line per (key, value) committed a different number of times than in-process (``shed``: those
    counted as shed on the way to each sink make up the difference, never more). A job that did not finish
    (``finished=False``: it failed, with its reason) may have committed less, never more."""
    problems = []
    for sink in sorted(set(expected) | set(committed)):
        want, got = tally(expected.get(sink, [])), tally(committed.get(sink, []))
        dropped = (shed or {}).get(sink, Counter())
        wrong = [
            item for item in sorted(set(want) | set(got), key=repr)
            if got[item] + dropped[item] > want[item] or (finished and got[item] + dropped[item] != want[item])
        ]  # fmt: skip
        for item in wrong[:MOST_REPORTED]:
            line = f"sink '{sink}': {item!r} committed {got[item]} times, in-process {want[item]}"
            problems.append(line + (f", shed {dropped[item]}" if dropped[item] else ""))
        if len(wrong) > MOST_REPORTED:
            problems.append(f"sink '{sink}': {len(wrong) - MOST_REPORTED} more (key, value) pairs differ")
    return problems


def illegal_job_moves(states: Sequence[str]) -> list[str]:
    """Each move between consecutive job states that ``JOB_MOVES`` does not allow."""
    problems = []
    for before, after in itertools.pairwise(states):
        if JobState(after) not in JOB_MOVES[JobState(before)]:
            problems.append(f"job moved {before} -> {after}: not a move the lifecycle allows")
    return problems


def illegal_worker_moves(worker: str, states: Sequence[str | None]) -> list[str]:
    """Each move of a worker's registration (``None``: its node gone, VOID) that ``WORKER_MOVES`` does not
    allow."""
    problems = []
    named = [WorkerState.VOID.value if state is None else state for state in states]
    for before, after in itertools.pairwise(named):
        if WorkerState(after) not in WORKER_MOVES[WorkerState(before)] and before != after:
            problems.append(f"worker '{worker}' moved {before} -> {after}: not a move the lifecycle allows")
    return problems


@dataclass
class LeadershipWatch:
    """Follows ``/leader`` and every write to what the leader owns, by the master that wrote it."""

    epoch: int | None = None
    leader: str | None = None
    winners: dict[int, str] = field(default_factory=dict)  # epoch -> the master that won it
    writers: dict[int, set[str]] = field(default_factory=dict)  # epoch -> masters that wrote in it
    problems: list[str] = field(default_factory=list)

    def leader_node(self, data: Mapping[str, Any] | None) -> None:
        """``/leader`` now holds ``data`` (``None``: nobody leads)."""
        if data is None:
            self.leader = None
            return
        self.epoch, self.leader = int(data["epoch"]), str(data["name"])
        self.winners[self.epoch] = self.leader

    def leader_write(self, master: str, path: str) -> None:
        """``master`` wrote ``path``, a node only the leader writes."""
        epoch = self.epoch
        if epoch is None:
            self.problems.append(f"{master} wrote {path} before any master led")
            return
        writers = self.writers.setdefault(epoch, set())
        writers.add(master)
        if self.winners.get(epoch) != master:
            self.problems.append(f"{master} wrote {path} in epoch {epoch}, led by {self.winners.get(epoch)}")
        elif len(writers) > 1:
            self.problems.append(f"epoch {epoch} has {len(writers)} writers: {', '.join(sorted(writers))}")


def liveness(final: tuple[str, str], healed_at: float, ended_at: float | None, bound: float) -> list[str]:
    """Within ``bound`` seconds of the last fault healing, the job FINISHED, or is FAILED or STALLED with a
    reason that names the cause: anything else (still running, recovering; no reason) is a silent hang."""
    state, reason = final
    internal = [name for name in INTERNAL_ERRORS if name in reason]
    if state in (JobState.FAILED.value, JobState.STALLED.value) and internal:
        return [f"the job is {state} on an internal error, not a cause a user can act on: {reason}"]
    if state in (JobState.FAILED.value, JobState.STALLED.value) and reason.strip():
        return []
    if state == JobState.FINISHED.value and ended_at is not None and ended_at <= healed_at + bound:
        return []
    if ended_at is None:
        return [f"the job is {state} ({reason}) {bound:g} s after the last fault healed: a silent hang"]
    return [f"the job ended {state} ({reason or 'no reason'}) {ended_at - healed_at:.1f} s after the last heal"]
