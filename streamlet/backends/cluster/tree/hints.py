"""CPU hints: which tasks of a topology the spread policy found CPU-bound, kept in ``/cpu-hints`` so that the
scheduler spreads their instances from the start the next time the topology is placed (a resubmission, a
recovery).

One node holds every topology's hints (few: one entry per CPU-bound task), written by the leader only,
fenced on its term like every decision.
"""

from __future__ import annotations

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.paths import CpuHint, CpuHints
from streamlet.backends.cluster.tree.store import ClusterStore, Create, Op, SetData


async def cpu_bound_tasks(store: ClusterStore, topology: str) -> set[str]:
    """The tasks of ``topology`` a CPU hint says to spread."""
    found = await store.get(paths.CPU_HINTS)
    hints: CpuHints = {} if found is None else found.data
    return set(hints.get(topology, {}))


async def hint_step(store: ClusterStore, topology: str, task: str, hint: CpuHint) -> Op:
    """The write that records ``hint`` for ``task`` of ``topology`` (conditional on the node as read now)."""
    found = await store.get(paths.CPU_HINTS)
    if found is None:
        return Create(paths.CPU_HINTS, {topology: {task: hint}})
    hints: CpuHints = found.data
    updated = {**hints, topology: {**hints.get(topology, {}), task: hint}}
    return SetData(paths.CPU_HINTS, updated, found.version)
