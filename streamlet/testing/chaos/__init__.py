"""A deterministic simulation of the whole cluster under seeded faults, every answer checked.

One seed decides everything: the cluster (masters, workers, the coordination
store) runs on one event loop with a virtual clock (:mod:`.loop`), in-memory
links between every pair of parties (:mod:`.network`), store sessions that
expire in virtual time (:mod:`.sessions`), ids and nonces drawn from the seed
(:class:`~streamlet.core.model.world.RealWorld` replaced), and faults drawn from
the seed (:mod:`.faults`): kills, pauses, partitions, lost disks, expired
sessions, slow links, crashes in the middle of a checkpoint, a commit or a live
change. The checker (:mod:`.checker`) compares what the sinks committed with the
same topology run in-process, follows every job and worker state move, every
leader's writes, and that the job ends once the faults heal. The same seed gives
the same run, event for event: :attr:`RunResult.trace_hash`.

From the command line: ``python -m streamlet.testing.chaos --seed S --runs N``.
For a topology of your own, :func:`check`:

Example:
    >>> import streamlet as sl
    >>> def build_topology() -> sl.Topology:
    ...     topology = sl.Topology("totals")
    ...     orders = topology.add_source("orders", [])
    ...     totals = topology.reduce("total", lambda a, b: a + b, emit="record", parallelism=2)
    ...     totals.set_input(orders, partitioning=sl.SAME_KEY)
    ...     topology.add_sink("out", sl.CollectSink()).set_input(totals)
    ...     return topology
    >>> orders = [sl.Record(f"customer-{n % 7}", n % 5, float(n)) for n in range(2000)]
    >>> report = check(build_topology, {"orders": orders}, seed=1, runs=2)
    >>> report.ok, len(report.results), sorted({result.state for result in report.results})
    (True, 2, ['FINISHED'])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.core.model.record import Record
from streamlet.core.model.topology import Topology
from streamlet.errors import TopologyError
from streamlet.testing.chaos.checker import tally
from streamlet.testing.chaos.faults import KINDS, Fault, check_kinds, schedule
from streamlet.testing.chaos.runner import RunResult, expected_output, run_once
from streamlet.testing.chaos.workloads import WORKLOADS, PacedSource, Workload

__all__ = (
    "KINDS",
    "WORKLOADS",
    "ChaosReport",
    "Fault",
    "PacedSource",
    "RunResult",
    "Workload",
    "check",
    "run_once",
    "schedule",
)


@dataclass(frozen=True)
class ChaosReport:
    """The runs :func:`check` made: each one's :class:`RunResult` (seed, faults, trace hash, violations)."""

    results: list[RunResult]

    @property
    def ok(self) -> bool:
        """No run broke a rule."""
        return not self.violations

    @property
    def violations(self) -> list[tuple[int, str]]:
        """(seed, what was wrong) for every rule any run broke."""
        return [(result.seed, violation) for result in self.results for violation in result.violations]

    def describe(self) -> str:
        """Each failing seed with its schedule and violations, and how to run it again."""
        lines = []
        for result in self.results:
            if result.violations:
                lines.append(f"seed {result.seed}: " + "; ".join(result.violations))
                lines += [f"  {fault}" for fault in result.faults]
        return "\n".join(lines) or f"{len(self.results)} runs, no violation"


def check(
    build_topology: Callable[[], Topology],
    inputs: dict[str, Iterable[Any]],
    *,
    seed: int = 0,
    runs: int = 10,
    faults: Sequence[str] = KINDS,
    checkpoint_interval: float | None = 0.5,
    per_read: int = 50,
    every: float = 0.05,
) -> ChaosReport:
    """Run your topology on a simulated cluster under the faults of seeds ``seed`` .. ``seed + runs - 1``.

    ``inputs`` feed the named sources (as ``run_topology`` takes them), ``per_read`` items every ``every``
    virtual seconds so the faults land while records flow; every sink is replaced by an exactly-once one,
    and what it commits must equal the in-process run of the same topology and input, record for record.
    ``faults``: the kinds drawn (see :data:`KINDS`). ``checkpoint_interval``: virtual seconds between
    checkpoints (``None`` for a topology with a loop, which takes none).

    A topology whose output is not the same in two in-process runs of the same input (it reads the clock,
    draws random numbers, depends on arrival order across inputs) is refused with a :class:`TopologyError`
    naming the first difference: nothing could tell its faults from its own variation.
    """
    kinds = tuple(check_kinds(list(faults)))
    frozen_inputs = {name: list(items) for name, items in inputs.items()}
    name = build_topology().name
    workload = Workload(
        name, build_topology, frozen_inputs, checkpoint_interval=checkpoint_interval, per_read=per_read, every=every
    )
    expected = _deterministic_output(workload)
    return ChaosReport([run_once(s, workload, kinds=kinds, expected=expected) for s in range(seed, seed + runs)])


def _deterministic_output(workload: Workload) -> dict[str, list[Record]]:
    """The in-process output, once it is known to come out the same twice."""
    first, second = expected_output(workload), expected_output(workload)
    for sink in sorted(set(first) | set(second)):
        once, again = tally(first.get(sink, [])), tally(second.get(sink, []))
        for item in sorted(set(once) | set(again), key=repr):
            if once[item] != again[item]:
                raise TopologyError(
                    f"topology '{workload.name}' gives different output in two in-process runs of the same input "
                    f"(sink '{sink}': {item!r} {once[item]} times, then {again[item]}): a chaos check needs a "
                    "deterministic topology"
                )
    return first
