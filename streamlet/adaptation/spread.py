"""Spreading a CPU-bound task (Flink spreads a task's subtasks over slots): its instances should not share a core.

Dispatch co-locates an instance with its upstream while a worker has room
(seed 000: edges in memory), which is right for cheap stages and wrong for
a CPU-bound one: every instance of it then shares one worker's event loop,
one core, and ``parallelism=2`` runs at the speed of one. The statistics
say which case a job is in. A task is **CPU-bound on a worker** when two or
more of its instances run there and together take at least
:data:`CPU_BOUND` of a core: the worker's process CPU split over its
instances by their busy time (busy time alone would count an ``await`` on
a slow service as work; the process's CPU says what the core really did).
One of its instances, the highest index, then moves to the worker with
room, idle CPU (below the source's, after taking the instance's share) and
fewest instances of that task. A cheap stage, or one that waits on I/O,
stays where dispatch put it.

What the policy finds is kept at once as a **CPU hint** per topology and
task, so that the next time the topology is placed (a resubmission, a
recovery) the task's instances are spread from the start
(``dispatch.assign(spread=...)``). The move itself waits until the source
worker's part has run :data:`SETTLED` seconds: a live change off a worker
whose core is saturated takes seconds (its control plane shares the event
loop with the CPU-bound instances: about 200 ms a coordination step, 2.5
to 3.5 s a migration, measured on the parallel benchmark's job), and a job
whose input runs out during a change restarts its attempt from the last
checkpoint. Moved at 3 s, the benchmark's 4 s job lost its first attempt
that way (measured); a part that has run 10 s has run several times as long
as the move takes, and a job that short gains little from the move anyway.

Pure: placements and loads in, at most one migration out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from streamlet.adaptation.rebalance import Migration

CPU_BOUND = 0.75  # a share of one core: a task's co-located instances taking this much of it are CPU-bound
SETTLED = 10.0  # seconds a worker's part runs before an instance moves off it (see above)


@dataclass(frozen=True, slots=True)
class Spreading:
    """A decision: ``migration`` moves an instance of CPU-bound ``task`` (its instances on the source worker
    take ``cpu`` of a core together), and why."""

    migration: Migration
    task: str
    cpu: float
    reason: str


@dataclass(frozen=True, slots=True)
class CpuBound:
    """A finding: ``task``'s ``instances`` (by index) on ``worker`` take ``cpu`` of its core together."""

    task: str
    worker: str
    instances: tuple[str, ...]
    cpu: float


def cpu_bound(
    placed: Mapping[str, str], busy: Mapping[str, float], cpu: Mapping[str, float], movable: Callable[[str], bool]
) -> list[CpuBound]:
    """Every task CPU-bound on a worker (see the module docstring), the busiest worker first.

    ``placed``: instance (``"task.index"``) -> worker; ``busy``: instance -> share of its measured time it was
    busy; ``cpu``: live worker -> its process's share of a core; only ``movable`` instances count as crowding.
    """
    found = []
    for worker in sorted(cpu, key=lambda worker: (-cpu[worker], worker)):
        if cpu[worker] < CPU_BOUND:
            break  # sorted: no worker further on burns enough of a core either
        everything = sum(busy.get(instance, 0.0) for instance, where in placed.items() if where == worker)
        for task, instances in _crowded_tasks(placed, worker, movable) if everything > 0.0 else []:
            taken = cpu[worker] * sum(busy.get(instance, 0.0) for instance in instances) / everything
            if taken >= CPU_BOUND:
                found.append(CpuBound(task, worker, tuple(instances), taken))
    return found


def spread(
    placed: Mapping[str, str],
    busy: Mapping[str, float],
    cpu: Mapping[str, float],
    room: Mapping[str, int],
    movable: Callable[[str], bool],
    may_run: Callable[[str, str], bool] = lambda instance, worker: True,
    settled: Callable[[str], bool] = lambda worker: True,
) -> Spreading | None:
    """The first move that spreads a CPU-bound task (:func:`cpu_bound`), if any: from a worker ``settled`` says
    may hand one over, to one with room (``room``: worker -> instances it can still take) that may run it.

    >>> placed = {"feed.0": "w0", "work.0": "w0", "work.1": "w0"}
    >>> busy = {"feed.0": 0.05, "work.0": 0.45, "work.1": 0.45}
    >>> found = spread(placed, busy, {"w0": 0.98, "w1": 0.02}, {"w0": 5, "w1": 8}, lambda i: i.startswith("work"))
    >>> (found.migration.instance, found.migration.target)
    ('work.1', 'w1')
    """
    for finding in cpu_bound(placed, busy, cpu, movable):
        if not settled(finding.worker):
            continue
        source, instances, taken = finding.worker, list(finding.instances), finding.cpu
        moving = instances[-1]  # the highest index: the same input always gives the same move
        target = _target(finding.task, moving, source, taken / len(instances), placed, cpu, room, may_run)
        if target is not None:
            reason = _reason(finding.task, instances, taken, source, cpu, target)
            return Spreading(Migration(moving, source, target), finding.task, taken, reason)
    return None


def _crowded_tasks(
    placed: Mapping[str, str], worker: str, movable: Callable[[str], bool]
) -> list[tuple[str, list[str]]]:
    """The tasks with two or more movable instances on ``worker``: (task, its instances there by index)."""
    here: dict[str, list[str]] = {}
    for instance, where in placed.items():
        if where == worker and movable(instance):
            here.setdefault(instance.rsplit(".", 1)[0], []).append(instance)
    by_index = {task: sorted(found, key=lambda i: int(i.rsplit(".", 1)[1])) for task, found in here.items()}
    return sorted((task, found) for task, found in by_index.items() if len(found) >= 2)


def _target(
    task: str,
    instance: str,
    source: str,
    share: float,
    placed: Mapping[str, str],
    cpu: Mapping[str, float],
    room: Mapping[str, int],
    may_run: Callable[[str, str], bool],
) -> str | None:
    """The worker ``instance`` goes to: room, allowed, idle CPU even after taking ``share`` (below the source's);
    of those, the one with fewest instances of ``task``, then the lowest CPU."""
    held = Counter(worker for name, worker in placed.items() if name.rsplit(".", 1)[0] == task)
    targets = [
        worker
        for worker in cpu
        if worker != source
        and room.get(worker, 0) > 0
        and may_run(instance, worker)
        and cpu[worker] + share < cpu[source]
        and held[worker] + 1 < held[source]  # the move must even the task out, never swap the crowd
    ]
    return min(targets, key=lambda worker: (held[worker], cpu[worker], worker), default=None)


def _reason(task: str, instances: list[str], taken: float, source: str, cpu: Mapping[str, float], target: str) -> str:
    return (
        f"{task} is CPU-bound on {source}: its {len(instances)} instances there take {taken:.0%} of a core "
        f"(the process at {cpu[source]:.0%}); {instances[-1]} goes to {target} (CPU {cpu[target]:.0%})"
    )
