"""Which of the N processes runs which instance: a pure function of the topology, the same in every process.

Each node's instances go to the processes in contiguous blocks (instance
``i`` of ``p`` to block ``i * N // p``), and every node starts where the
previous one left off, one process further per instance. So:

- a task with parallelism ``N`` has one instance on every process (a
  CPU-bound task runs on N cores), one with parallelism ``k * N`` has ``k``
  on each, and any other parallelism is spread as evenly as it divides;
- the nodes with one instance (most sources and sinks) do not all pile
  onto process 0: they take turns;
- every process holds one contiguous run of each node's instances, so a
  collecting sink's records come back instance by instance, as in one
  process, by taking the processes in the order of the first instance each
  holds (:func:`holders`).

Example:
    >>> import streamlet as sl
    >>> t = sl.Topology("spread")
    >>> numbers = t.add_source("numbers", range(10))
    >>> work = t.map("work", lambda r: (r.key, r.value), parallelism=2).set_input(numbers)
    >>> _ = t.add_sink("out", sl.CollectSink()).set_input(work)
    >>> spread(t, 2)
    {('numbers', 0): 0, ('work', 0): 1, ('work', 1): 0, ('out', 0): 1}
"""

from __future__ import annotations

from streamlet.core.model.topology import Topology

Where = dict[tuple[str, int], int]  # (node, instance index) -> process index


def spread(topology: Topology, processes: int) -> Where:
    """The process of every instance of ``topology`` (a valid one) over ``processes`` processes."""
    where: Where = {}
    start = 0
    for name, node in topology.nodes.items():
        parallelism = node.parallelism
        for index in range(parallelism):
            where[name, index] = (start + index * processes // parallelism) % processes
        start = (start + parallelism) % processes
    return where


def holders(where: Where, node: str) -> list[int]:
    """The processes holding instances of ``node``, in the order of the instances they hold."""
    first: dict[int, int] = {}
    for (name, index), process in where.items():
        if name == node:
            first[process] = min(index, first.get(process, index))
    return sorted(first, key=first.__getitem__)
