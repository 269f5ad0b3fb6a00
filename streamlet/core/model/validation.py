"""Checks that a topology can run; every message names the node and the port.

:func:`validate` never changes the topology it is given: it returns a
*resolved* copy, in which every task carries the window it runs with (its
own, or that of the windowed sources feeding it) and which of its ports are
windowed. It reads the topology through the :class:`TopologyData` protocol,
so it imports nothing of ``topology.py`` (which imports it).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Protocol, TypeVar

from streamlet.core.model import graph
from streamlet.core.model.constants import LATE, SHED
from streamlet.core.model.partition import BROADCAST, ROUND_ROBIN, SAME_KEY
from streamlet.errors import TopologyError


class TopologyData(Protocol):
    """What validation reads of a topology."""

    name: str
    nodes: dict[str, Any]
    edges: list[Any]

    def successors(self) -> dict[str, list[str]]:
        """Downstream node names of every node."""
        ...

    def back_edges(self) -> set[tuple[str, str]]:
        """``(upstream, downstream)`` pairs that close a cycle."""
        ...

    def loop_limit(self, head: str) -> int | None:
        """Iteration limit of the loop whose back edge enters ``head``."""
        ...


T = TypeVar("T", bound=TopologyData)


def validate(topology: T) -> T:
    """A resolved copy of ``topology``, or a ``TopologyError`` for the first problem found."""
    if not any(node.kind == "source" for node in topology.nodes.values()):
        raise TopologyError(f"topology '{topology.name}' has no source")
    _check_parallelism(topology)
    _check_edges(topology)
    _check_inputs_connected(topology)
    _check_cycles(topology)
    _check_columnar_edges(topology)
    _check_keyed_inputs(topology)
    resolved = copy.copy(topology)
    # copies of the nodes too: a running job changes its own (a rescale), never the caller's
    resolved.nodes = {**{name: copy.copy(node) for name, node in topology.nodes.items()}, **_resolved_windows(topology)}
    resolved.edges = list(topology.edges)
    _check_columnar_nodes(resolved)
    return resolved


def _check_parallelism(topology: TopologyData) -> None:
    # add_* checks this too; parallelism overrides (submit -p, load_topology) meet it here
    for node in topology.nodes.values():
        if node.parallelism > node.max_parallelism:
            raise TopologyError(
                f"{node.describe()}: parallelism {node.parallelism} is more than max_parallelism "
                f"{node.max_parallelism} (the number of key segments, so the most instances it can have)"
            )


def _check_edges(topology: TopologyData) -> None:
    for edge in topology.edges:
        downstream = topology.nodes[edge.downstream]
        upstream = topology.nodes.get(edge.upstream)
        if upstream is None:
            raise TopologyError(
                f"{downstream.describe()} input port {edge.in_port}: unknown upstream '{edge.upstream}'"
            )
        if downstream.inputs == 0:
            raise TopologyError(
                f"{downstream.describe()} has no input ports but was given input from '{upstream.name}'"
            )
        if not 0 <= edge.in_port < downstream.inputs:
            raise TopologyError(
                f"{downstream.describe()} has {_ports(downstream.inputs, 'input')} but input port "
                f"{edge.in_port} was connected from '{upstream.name}'"
            )
        if upstream.outputs == 0:
            raise TopologyError(f"{upstream.describe()} has no output ports but feeds '{downstream.name}'")
        if (edge.out_port, upstream.kind) in ((LATE, "task"), (SHED, "source")):
            continue  # a task's late records, a source's shed ones
        if not 0 <= edge.out_port < upstream.outputs:
            raise TopologyError(
                f"{upstream.describe()} has {_ports(upstream.outputs, 'output')} but output port "
                f"{edge.out_port} was connected to '{downstream.name}'"
            )


def _check_inputs_connected(topology: TopologyData) -> None:
    connected = {(edge.downstream, edge.in_port) for edge in topology.edges}
    for node in topology.nodes.values():
        for port in range(node.inputs):
            if (node.name, port) not in connected:
                raise TopologyError(
                    f"{node.describe()} has {_ports(node.inputs, 'input')} but input port {port} is not connected"
                )


def _check_cycles(topology: TopologyData) -> None:
    successors = topology.successors()
    for upstream, head in sorted(topology.back_edges()):
        if topology.loop_limit(head) is None:
            cycle = " -> ".join(graph.cycle_through((upstream, head), successors))
            raise TopologyError(
                f"topology '{topology.name}' has a cycle {cycle} (back edge into input of "
                f"'{head}') without an iteration limit; call topology.set_max_iterations(n)"
            )
    for part in graph.strongly_connected(successors):
        for name in sorted(part):
            if getattr(topology.nodes[name], "async_calls", False):
                raise TopologyError(f"task '{name}': map_async cannot run inside a loop")


def _check_columnar_edges(topology: TopologyData) -> None:
    """Arrow batches between columnar nodes are routed whole or by key: never by a function of a record."""
    for edge in topology.edges:
        upstream, downstream = topology.nodes[edge.upstream], topology.nodes[edge.downstream]
        if upstream.columnar and downstream.columnar and edge.partitioning not in (ROUND_ROBIN, SAME_KEY, BROADCAST):
            raise TopologyError(
                f"{downstream.describe()} input port {edge.in_port}: the Arrow batches of {upstream.describe()} "
                "go by ROUND_ROBIN, SAME_KEY or BROADCAST, not by a partition function or SESSION_TABLE"
            )


def _check_keyed_inputs(topology: TopologyData) -> None:
    """A join pairs records of one key: each of its inputs must bring a key to one instance only."""
    for edge in topology.edges:
        downstream = topology.nodes[edge.downstream]
        if getattr(downstream, "keyed_inputs", False) and edge.partitioning is not SAME_KEY:
            name = getattr(edge.partitioning, "name", "a partition function")
            raise TopologyError(
                f"{downstream.describe()} input port {edge.in_port}: a join's inputs are partitioned by "
                f"SAME_KEY (set_input(..., partitioning=SAME_KEY)), not by {name}"
            )


def _check_columnar_nodes(topology: TopologyData) -> None:
    """Columnar tasks run neither on windows nor inside a cycle (their batches carry no iteration count)."""
    in_cycles = {name for component in graph.strongly_connected(topology.successors()) for name in component}
    for node in topology.nodes.values():
        if node.kind == "task" and node.columnar and node.window is not None:
            _check_columnar_window(node)
        if node.columnar and node.name in in_cycles:
            raise TopologyError(f"{node.describe()}: columnar nodes (where, aggregate) cannot be inside a cycle")


def _check_columnar_window(node: Any) -> None:
    """Of the columnar tasks only ``aggregate`` runs on a window, and only on one kind (its ``check_window``)."""
    assert node.make_task is not None
    check = getattr(node.make_task(), "check_window", None)
    if check is None:
        raise TopologyError(f"{node.describe()}: columnar tasks other than aggregate do not run on windows")
    check(node.describe(), node.window)


def _resolved_windows(topology: TopologyData) -> dict[str, Any]:
    """Windowed tasks, resolved: each with the window of its own, or of the windowed sources feeding it."""
    resolved: dict[str, Any] = {}
    for node in topology.nodes.values():
        feeding = [e for e in topology.edges if e.downstream == node.name]
        windowed = [(e, topology.nodes[e.upstream]) for e in feeding if topology.nodes[e.upstream].kind == "source"]
        windowed = [(e, source) for e, source in windowed if source.window is not None]
        if node.kind == "sink":
            if windowed:
                edge, source = windowed[0]
                raise TopologyError(
                    f"{node.describe()} input port {edge.in_port}: windowed {source.describe()} feeds a sink "
                    "directly; windows are applied by tasks"
                )
            continue
        if node.kind != "task":
            continue
        if node.windowed_ports and node.window is not None:
            continue  # resolved by an earlier validate()
        own = node.window
        if own is not None:
            if windowed:
                edge, source = windowed[0]
                raise TopologyError(
                    f"{node.describe()} input port {edge.in_port} is fed by windowed {source.describe()}, "
                    "but the task has a window of its own"
                )
            resolved[node.name] = dataclasses.replace(node, windowed_ports=tuple(range(node.inputs)))
            continue
        specs = {source.window for _, source in windowed}
        if len(specs) > 1:
            raise TopologyError(
                f"{node.describe()} is fed by sources with different windows: {sorted(map(repr, specs))}"
            )
        if specs:
            ports = tuple(sorted({edge.in_port for edge, _ in windowed}))
            resolved[node.name] = dataclasses.replace(node, window=specs.pop(), windowed_ports=ports)
    return resolved


def _ports(count: int, what: str) -> str:
    return f"{count} {what} port" + ("" if count == 1 else "s")


def unconsumed_ports(topology: TopologyData) -> list[tuple[str, int]]:
    """``(node, port)`` of every declared output port nothing is connected to (the late port aside):
    what is emitted there is dropped, so the job warns about them once when it starts."""
    wired = {(edge.upstream, edge.out_port) for edge in topology.edges}
    return [
        (node.name, port)
        for node in topology.nodes.values()
        if node.kind != "sink"
        for port in range(node.outputs)
        if (node.name, port) not in wired
    ]


def surprising_defaults(topology: TopologyData, checkpointed: bool) -> list[tuple[str, dict[str, str]]]:
    """What a job does by default that its topology suggests the user did not mean: ``(event, fields)`` for one
    warning each when it starts.

    - A window on processing time (``TimeWindow(60)``'s default) fed, through any path, by a source that gives
      event time (its ``watermarks`` set): its records are windowed by when they arrive, not by their ``ts``.
    - A sink that is exactly-once only with checkpoints (``FileSink``, ``PostgresSink``, a transactional
      ``KafkaSink``) in a job without them: its output is at-least-once.
    """
    found: list[tuple[str, dict[str, str]]] = []
    for node in topology.nodes.values():
        window = node.window
        if node.kind == "task" and window is not None and getattr(window, "time", None) == "processing":
            timed = sorted(
                name for name in _upstream(topology, node.name) if topology.nodes[name].watermarks is not None
            )
            if timed:
                found.append(("window on processing time fed by event time", {
                    "task": node.name, "sources": ", ".join(timed),
                    "effect": "records are windowed by when they arrive, not by their ts: pass time='event'",
                }))  # fmt: skip
        staged = node.kind == "sink" and node.sink is not None and node.sink.exactly_once_with_checkpoints()
        if staged and not checkpointed:
            found.append(("exactly-once sink without checkpoints", {
                "sink": node.name,
                "effect": "its output is at-least-once: give the job checkpoint_dir (or checkpoint_store) "
                "and checkpoint_interval to make it exactly-once",
            }))  # fmt: skip
    return found


def _upstream(topology: TopologyData, name: str) -> set[str]:
    """Every node with a path to ``name``."""
    seen: set[str] = set()
    waiting = [name]
    while waiting:
        current = waiting.pop()
        for edge in topology.edges:
            if edge.downstream == current and edge.upstream not in seen:
                seen.add(edge.upstream)
                waiting.append(edge.upstream)
    return seen
