"""What the leader side knows of a job's topology, built without running job code in the master.

The leader, the adaptation loop and the dashboard need a job's shape: its
nodes (kind, parallelism, placement constraints, key segments, whether a
window can be split), its edges and their partitioning, its loop limits and
QoS. Getting it means running the job's ``build_topology``, which is user
code: it may take seconds, hang, or worse. So a master never runs it on its
event loop, nor in its own process: :class:`Outlines` builds each signed spec
once, in a short-lived ``python -m streamlet.backends.cluster.tree.outline``
process that loads the job from its signed bytes, validates the topology and
prints its :func:`describe` as JSON. The process is killed at
``build_seconds`` and the job fails with that reason. The master keeps the
description and makes plain :func:`outline` topologies from it: the same
:class:`~streamlet.core.model.topology.Topology` type, whose nodes carry no
code (no task factory, source, sink, window object or partition function).

One kind of target is built in this process, in a worker thread: the
simulated cluster's (``streamlet.backends.cluster.simulated.targets``),
which exist only in the process that registered them.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from typing import Any

import anyio
import structlog

from streamlet.backends.cluster.tree.paths import JobSpec
from streamlet.backends.cluster.tree.sealed import with_secrets_opened
from streamlet.core.model import world
from streamlet.core.model.partition import Partitioning, PartitionSpec
from streamlet.core.model.qos import QoS
from streamlet.core.model.record import Record
from streamlet.core.model.topology import Edge, Node, Topology
from streamlet.core.state.regroup import unsplittable_window
from streamlet.errors import BuildFailed, TopologyError

log = structlog.get_logger("streamlet")
BUILD_SECONDS = 30.0
"""How long building a job's topology may take before the job fails."""
IN_PROCESS = "streamlet.backends.cluster.simulated.targets:"
Spec = JobSpec | dict[str, Any]
_ENVIRONMENT_DROPPED = ("STREAMLET_SECRET",)


class OutlinedTopology(Topology):
    """A topology made from a description: the shape alone. ``unsplittable`` says, per task with a window,
    why its state cannot be split by key (what the window object would have said)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.unsplittable: dict[str, str] = {}


def describe(topology: Topology) -> dict[str, Any]:
    """The shape of a validated ``topology`` as plain JSON data."""
    nodes = [
        {
            "name": node.name, "kind": str(node.kind), "parallelism": node.parallelism, "inputs": node.inputs,
            "outputs": node.outputs, "sync": node.sync, "on_error": node.on_error, "max_failures": node.max_failures,
            "workers": None if node.workers is None else list(node.workers), "labels": list(node.labels),
            "state_ttl": node.state_ttl, "max_parallelism": node.max_parallelism, "columnar": node.columnar,
            "windowed": node.window is not None, "unsplittable": unsplittable_window(node.window),
        }
        for node in topology.nodes.values()
    ]  # fmt: skip
    edges = [
        [edge.upstream, edge.out_port, edge.downstream, edge.in_port, _partitioning_name(edge.partitioning)]
        for edge in topology.edges
    ]
    return {
        "name": topology.name, "nodes": nodes, "edges": edges, "max_iterations": topology.max_iterations,
        "loop_limits": dict(topology.loop_limits), "qos": None if topology.qos is None else asdict(topology.qos),
    }  # fmt: skip


def outline(description: dict[str, Any]) -> OutlinedTopology:
    """A new topology of the described shape (each call a new one: callers change parallelism in place)."""
    topology = OutlinedTopology(str(description["name"]))
    for found in description["nodes"]:
        topology.nodes[found["name"]] = Node(
            name=found["name"], kind=found["kind"], parallelism=int(found["parallelism"]), inputs=found["inputs"],
            outputs=found["outputs"], sync=found["sync"], on_error=found["on_error"],
            max_failures=found["max_failures"], workers=None if found["workers"] is None else tuple(found["workers"]),
            labels=tuple(found["labels"]), state_ttl=found["state_ttl"], max_parallelism=found["max_parallelism"],
            columnar=found["columnar"],
        )  # fmt: skip
        if found["unsplittable"] is not None:
            topology.unsplittable[found["name"]] = found["unsplittable"]
    for upstream, out_port, downstream, in_port, partitioning in description["edges"]:
        topology.edges.append(Edge(upstream, out_port, downstream, in_port, _partitioning(partitioning)))
    topology.max_iterations = description["max_iterations"]
    topology.loop_limits = dict(description["loop_limits"])
    topology.qos = None if description["qos"] is None else QoS(**description["qos"])
    return topology


def window_reason(topology: Topology, task: str) -> str | None:
    """Why ``task``'s state cannot be split by key, whether ``topology`` is an outline or the real one."""
    if isinstance(topology, OutlinedTopology):
        return topology.unsplittable.get(task)
    return unsplittable_window(topology.nodes[task].window)


class Outlines:
    """The outlines of signed specs, each built once (see the module docstring).

    :meth:`ready` answers at once (``None`` while a spec has not been built);
    :meth:`build` builds one, or waits for the build under way. A build's
    answer is the description, or the reason the job cannot run.
    """

    def __init__(self, build_seconds: float = BUILD_SECONDS, secret: bytes | None = None) -> None:
        self.build_seconds = build_seconds
        self.secret = secret  # opens a job's sealed parameters for its build (handed to the build over a pipe)
        self._built: dict[str, dict[str, Any] | str] = {}
        self._building: dict[str, anyio.Event] = {}

    def ready(self, spec: Spec) -> OutlinedTopology | str | None:
        """The spec's topology, the reason it has none, or ``None`` before it was built."""
        found = self._built.get(_key(spec))
        if found is None or isinstance(found, str):
            return found
        return outline(found)

    async def build(self, spec: Spec) -> OutlinedTopology | str:
        """Build the (verified) spec's outline unless that is done or under way; its topology or why none."""
        key = _key(spec)
        while key not in self._built:
            waiting = self._building.get(key)
            if waiting is not None:
                await waiting.wait()
                continue
            self._building[key] = done = anyio.Event()
            try:
                self._built[key] = await self._described(spec)
            finally:
                del self._building[key]
                done.set()
        found = self.ready(spec)
        assert found is not None
        return found

    def forget(self, spec: Spec) -> None:
        """Drop a spec's outline (its job is gone)."""
        self._built.pop(_key(spec), None)

    async def _described(self, spec: Spec) -> dict[str, Any] | str:
        try:
            built = with_secrets_opened(spec, self.secret)
            if str(spec.get("target", "")).startswith(IN_PROCESS):
                return await world.blocking(_describe_spec, built)
            return await _describe_in_a_process(built, self.build_seconds)
        except BuildFailed as exc:  # the build's own words
            return f"cannot load the job: {exc}"
        except Exception as exc:  # noqa: BLE001 - user code: whatever it raised fails this job, not the master
            return f"cannot load the job: {type(exc).__name__}: {exc}"


def _key(spec: Spec) -> str:
    return str(spec.get("signature") or json.dumps(spec, sort_keys=True, default=str))


def _describe_spec(spec: Spec) -> dict[str, Any]:
    from streamlet.backends.cluster.tree.jobs import topology_of  # the job code's loader: only where code runs

    return describe(topology_of(spec))


_FUNCTION = "function"  # a user's partition function: the outline knows it is one, not what it does


def _partitioning_name(spec: PartitionSpec) -> str:
    return spec.name if isinstance(spec, Partitioning) else _FUNCTION


def _partitioning(name: str) -> PartitionSpec:
    return _partitioned_by_a_function if name == _FUNCTION else Partitioning[name]


def _partitioned_by_a_function(record: Record, instances: int) -> int:
    """Where a user's partition function stands in an outline: the master routes no record."""
    raise TopologyError("an outline of a topology carries no partition function: it routes no record")


async def _describe_in_a_process(spec: Spec, seconds: float) -> dict[str, Any]:
    """Run :func:`main` in a new process on ``spec``; its description, or :class:`BuildFailed`."""
    environment = {key: value for key, value in os.environ.items() if key not in _ENVIRONMENT_DROPPED}
    environment["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)  # where this process finds code
    # -P: the master's working directory (where job files are kept) must not shadow the standard library
    command = [sys.executable, "-P", "-m", "streamlet.backends.cluster.tree.outline"]
    with anyio.move_on_after(seconds) as scope:
        done = await anyio.run_process(
            command, input=json.dumps(spec).encode(), check=False, env=environment, start_new_session=True
        )
    if scope.cancelled_caught:  # anyio killed the process when the scope was cancelled
        raise BuildFailed(f"building its topology took longer than {seconds:g} s (killed)")
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise BuildFailed(lines[-1] if lines else f"the build process exited with {done.returncode}")
    description: dict[str, Any] = json.loads(done.stdout)
    return description


def main() -> None:
    """The build process: a signed spec (JSON) on stdin, its description (JSON) on stdout, or one line of
    error on stderr and exit status 1."""
    spec = json.loads(sys.stdin.buffer.read())
    try:
        description = _describe_spec(spec)
    except Exception as exc:  # noqa: BLE001 - reported to the master as the job's reason
        print(f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        sys.exit(1)
    sys.stdout.write(json.dumps(description))


if __name__ == "__main__":
    main()
