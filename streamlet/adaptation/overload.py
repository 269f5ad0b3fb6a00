"""Overload migration (ETRI): an OVERLOADED worker hands its hottest instance to the least loaded worker.

A worker is OVERLOADED when its process uses nearly a whole core and some of
its instances' input queues are full (its heartbeat says so: ``load``). The
hottest instance is the one that was busy the largest share of the window
(records processed take CPU; waiting does not). It goes to the worker with
the lowest CPU share that is not overloaded, has room and may run it (task
``workers=``/``labels=``), provided that worker stays below the overloaded
one after taking it, so the move cannot just swap the overload.

Pure: loads and placements in, at most one migration out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from streamlet.adaptation.rebalance import Migration


@dataclass(frozen=True, slots=True)
class HandOff:
    """A decision: ``migration``, and why."""

    migration: Migration
    reason: str


def hand_off(
    cpu: Mapping[str, float],
    overloaded: Collection[str],
    placed: Mapping[str, str],
    busy: Mapping[str, float],
    room: Mapping[str, int],
    movable: Callable[[str], bool],
    may_run: Callable[[str, str], bool] = lambda instance, worker: True,
) -> HandOff | None:
    """``cpu``: live worker -> CPU share of the window; ``overloaded``: the workers that said so;
    ``placed``: instance (``"task.index"``) -> worker; ``busy``: instance -> share of the window it was busy;
    ``room``: worker -> instances it can still take. The hand-off to make, if any."""
    for source in sorted(overloaded, key=lambda worker: (-cpu.get(worker, 0.0), worker)):
        hottest = sorted(
            (instance for instance, worker in placed.items() if worker == source and movable(instance)),
            key=lambda instance: (-busy.get(instance, 0.0), instance),
        )
        for instance in hottest:
            share = busy.get(instance, 0.0)
            targets = [
                worker
                for worker in cpu
                if worker != source
                and worker not in overloaded
                and room.get(worker, 0) > 0
                and may_run(instance, worker)
                and cpu[worker] + share < cpu.get(source, 0.0)
            ]
            if targets:
                target = min(targets, key=lambda worker: (cpu[worker], worker))
                reason = (
                    f"{source} is overloaded (CPU {cpu.get(source, 0.0):.0%}, full queues): its hottest instance "
                    f"{instance} (busy {share:.0%}) goes to {target} (CPU {cpu[target]:.0%})"
                )
                return HandOff(Migration(instance, source, target), reason)
    return None
