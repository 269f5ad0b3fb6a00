"""Spreading a running job's instances over the workers now present (seed 000: adding nodes with optional
rebalancing): a pure function from where the instances run to the migrations that even them out.

Each step moves one instance from the worker holding most of the job's
instances to the one holding fewest that may take it (it has room, and the
instance's task may run there), until the counts differ by at most one or
no move helps. Of the instances on the fullest worker, one of the task with
most instances there moves first (a task's instances spread out), the
highest index of it on a tie, so the same input always gives the same
moves. Only ``movable`` instances move (sources, sinks and tasks that
cannot be reconfigured stay), but every instance counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    """One instance (``"task.index"``) moving from one worker to another."""

    instance: str
    source: str
    target: str

    @property
    def index(self) -> int:
        """The instance's index within its task."""
        return int(self.instance.rsplit(".", 1)[1])


def rebalance(
    placed: dict[str, str],
    room: dict[str, int],
    movable: Callable[[str], bool],
    may_run: Callable[[str, str], bool] = lambda instance, worker: True,
) -> list[Migration]:
    """The migrations that spread ``placed`` (instance -> worker) over the workers of ``room``.

    ``room``: every worker that may take instances -> how many more it can take (a worker not in it takes
    none, e.g. one that is not live); ``movable(instance)`` says whether an instance may move at all, and
    ``may_run(instance, worker)`` whether it may run there (its task's ``workers=``/``labels=``).

    >>> placed = {"count.0": "w0", "count.1": "w0", "count.2": "w0", "words.0": "w0"}
    >>> [(m.instance, m.target) for m in rebalance(placed, {"w0": 0, "w1": 4}, lambda i: i.startswith("count"))]
    [('count.2', 'w1'), ('count.1', 'w1')]
    """
    where = dict(placed)
    free = dict(room)
    moves: list[Migration] = []
    for _ in range(len(where) ** 2):  # each move lowers the sum of squared counts by 2 or more: a bound
        step = _next_move(where, free, movable, may_run)
        if step is None:
            break
        moves.append(step)
        where[step.instance] = step.target
        free[step.target] -= 1
        if step.source in free:
            free[step.source] += 1
    return moves


def _next_move(
    where: dict[str, str],
    free: dict[str, int],
    movable: Callable[[str], bool],
    may_run: Callable[[str, str], bool],
) -> Migration | None:
    held = Counter(where.values())
    for worker in free:
        held.setdefault(worker, 0)
    for source in sorted(held, key=lambda worker: (-held[worker], worker)):
        lighter = [worker for worker in free if free[worker] > 0 and held[worker] + 1 < held[source]]
        for instance in _candidates(source, where, movable):
            targets = [worker for worker in lighter if may_run(instance, worker)]
            if targets:
                target = min(targets, key=lambda worker: (held[worker], worker))
                return Migration(instance, source, target)
    return None


def _candidates(source: str, where: dict[str, str], movable: Callable[[str], bool]) -> list[str]:
    """The movable instances on ``source``: of the task with most instances there first, highest index first."""
    here = [instance for instance, worker in where.items() if worker == source and movable(instance)]
    per_task = Counter(instance.rsplit(".", 1)[0] for instance in here)

    def order(instance: str) -> tuple[int, str, int]:
        task, index = instance.rsplit(".", 1)
        return -per_task[task], task, -int(index)

    return sorted(here, key=order)
