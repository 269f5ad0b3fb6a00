"""Building and validating topologies: every TopologyError names the node and the port."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

import streamlet as sl
from tests.conftest import values


class Echo(sl.Task):
    """Passes records on."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit_batch(inputs.get())


class TwoInputs(Echo):
    """Two input ports."""

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_inputs(2)


class NoInputPorts(Echo):
    """Declares zero input ports."""

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_inputs(0)


class WhoAmI(sl.Task):
    """Emits ``id(self)`` once, from ``finish``; keeps the records it saw in ``seen``."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        self.seen.extend(record.value for record in inputs.get())

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit(None, id(self))


def source_and_task(task: Any = Echo, **options: Any) -> tuple[sl.Topology, sl.NodeHandle, sl.NodeHandle]:
    """Topology 't' with source 'src' (not yet connected) and task 'x'."""
    topology = sl.Topology("t")
    return topology, topology.add_source("src", [1, 2]), topology.add_task("x", task, **options)


def loop() -> tuple[sl.Topology, sl.NodeHandle, sl.NodeHandle]:
    """src -> a -> b -> a: one loop whose back edge enters 'a'."""
    topology = sl.Topology("t")
    source = topology.add_source("src", [1])
    a = topology.add_task("a", Echo).set_input(source)
    b = topology.add_task("b", Echo).set_input(a)
    a.set_input(b)
    return topology, a, b


LOOP_WITHOUT_LIMIT = (
    "topology 't' has a cycle a -> b -> a (back edge into input of 'a') without an iteration limit; "
    "call topology.set_max_iterations(n)"
)


def raises(message: str) -> pytest.RaisesExc[sl.TopologyError]:
    """Expect a TopologyError whose message is exactly ``message``."""
    return pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$")


def test_duplicate_node_name_is_rejected() -> None:
    """A second node called 'x' names the node and the topology."""
    topology, _, _ = source_and_task()
    with raises("sink 'x': topology 't' already has a node with that name"):
        topology.add_sink("x", sl.CollectSink())


def test_unknown_upstream_is_named() -> None:
    """set_input('nope') fails validation naming the node, port and upstream."""
    topology, _, task = source_and_task()
    task.set_input("nope")
    with raises("task 'x' input port 0: unknown upstream 'nope'"):
        topology.validate()


@pytest.mark.parametrize("in_port", [1, -1])
def test_input_port_out_of_range_is_rejected(in_port: int) -> None:
    """Connecting an input port the task did not declare names both nodes and the port."""
    topology, source, task = source_and_task()
    task.set_input(source, in_port=in_port)
    with raises(f"task 'x' has 1 input port but input port {in_port} was connected from 'src'"):
        topology.validate()


def test_output_port_out_of_range_is_rejected() -> None:
    """Reading an output port the upstream did not declare names both nodes and the port."""
    topology, source, task = source_and_task()
    task.set_input(source, out_port=2)
    with raises("source 'src' has 1 output port but output port 2 was connected to 'x'"):
        topology.validate()


def test_unconnected_input_port_of_two_input_task_is_named() -> None:
    """A 2-input task fed only on port 0 reports port 1 as not connected."""
    topology = sl.Topology("t")
    source = topology.add_source("src", [1])
    topology.add_task("count", TwoInputs).set_input(source)
    with raises("task 'count' has 2 input ports but input port 1 is not connected"):
        topology.validate()


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (lambda t, s, x: s.set_input(x.set_input(s)), "source 'src' has no input ports but was given input from 'x'"),
        (
            lambda t, s, x: x.set_input(t.add_sink("out", sl.CollectSink()).set_input(s)),
            "sink 'out' has no output ports but feeds 'x'",
        ),
        (
            lambda t, s, x: t.add_sink("out", sl.CollectSink()) and x.set_input(s),
            "sink 'out' has 1 input port but input port 0 is not connected",
        ),
    ],
    ids=["source-given-input", "sink-as-upstream", "sink-not-fed"],
)
def test_ports_a_node_kind_lacks_are_rejected(wire: Any, message: str) -> None:
    """Sources have no inputs and sinks no outputs; a sink's input must be connected."""
    topology, source, task = source_and_task()
    wire(topology, source, task)
    with raises(message):
        topology.validate()


def test_cycle_without_iteration_limit_is_rejected() -> None:
    """A loop needs a limit; the message spells out the cycle and its head."""
    topology, _, _ = loop()
    with raises(LOOP_WITHOUT_LIMIT):
        topology.validate()


@pytest.mark.parametrize("at", [None, "a"], ids=["global", "per-loop"])
def test_iteration_limit_makes_cycle_valid(at: str | None) -> None:
    """set_max_iterations(n) for every loop, or with ``at=`` the loop's head, makes the loop valid."""
    topology, _, _ = loop()
    topology.set_max_iterations(3, at=at)
    topology.validate()
    assert topology.loop_limit("a") == 3


def test_limit_at_a_node_that_is_not_the_loop_head_leaves_cycle_invalid() -> None:
    """A per-loop limit on 'b' does not cover the back edge into 'a'."""
    topology, _, b = loop()
    topology.set_max_iterations(2, at=b)
    with raises(LOOP_WITHOUT_LIMIT):
        topology.validate()


def test_iteration_limit_below_one_is_rejected() -> None:
    """max_iterations 0 names the topology."""
    with raises("topology 't': max_iterations must be >= 1, got 0"):
        sl.Topology("t").set_max_iterations(0)


@pytest.mark.parametrize("parallelism", [0, -1])
@pytest.mark.parametrize("kind", ["source", "task", "sink"])
def test_parallelism_below_one_is_rejected(kind: str, parallelism: int) -> None:
    """Every node kind needs parallelism >= 1; the message names the node."""
    topology = sl.Topology("t")
    add: dict[str, Callable[[], sl.NodeHandle]] = {
        "source": lambda: topology.add_source("n", [1], parallelism=parallelism),
        "task": lambda: topology.add_task("n", Echo, parallelism=parallelism),
        "sink": lambda: topology.add_sink("n", sl.CollectSink(), parallelism=parallelism),
    }
    with raises(f"{kind} 'n': parallelism must be >= 1, got {parallelism}"):
        add[kind]()


def test_bad_on_error_is_rejected() -> None:
    """on_error must be fail, skip or restart."""
    with raises("task 'x': on_error must be one of ('fail', 'skip', 'restart'), got 'ignore'"):
        sl.Topology("t").add_task("x", Echo, on_error="ignore")  # type: ignore[arg-type]


def test_bad_partitioning_is_rejected() -> None:
    """A partitioning that is neither a scheme nor a function names the node and port."""
    _, source, task = source_and_task()
    with raises(
        "task 'x' input port 0: partitioning must be ROUND_ROBIN, SAME_KEY, SESSION_TABLE, BROADCAST or a function, "
        "got 'hash'"
    ):
        task.set_input(source, partitioning="hash")  # type: ignore[arg-type]


def test_topology_without_source_is_rejected() -> None:
    """Validation of a topology with no source names the topology."""
    topology = sl.Topology("t")
    topology.add_task("x", Echo)
    with raises("topology 't' has no source"):
        topology.validate()


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (lambda: 42, "task 'x': the factory returned 42, not a Task"),
        (42, "task 'x': expected a Task subclass or a factory, got 42"),
    ],
    ids=["factory-returns-int", "not-callable"],
)
def test_task_that_is_not_a_task_is_rejected(task: Any, message: str) -> None:
    """add_task checks a factory's result, and rejects what is neither a Task nor callable."""
    with raises(message):
        sl.Topology("t").add_task("x", task)


def test_task_instance_is_copied_per_parallel_instance() -> None:
    """A Task object is a prototype: each of 2 instances runs its own copy, the prototype is untouched."""
    prototype = WhoAmI()
    topology, source, task = source_and_task(prototype, parallelism=2)
    task.set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(task)
    used = values(sl.run(topology).sink("out"))
    assert len(used) == 2
    assert len(set(used)) == 2
    assert id(prototype) not in used
    assert prototype.seen == []


def test_port_declarer_rejects_zero_ports() -> None:
    """PortDeclarer needs at least one input and one output port."""
    ports = sl.PortDeclarer()
    with raises("a task needs at least one input port, got 0"):
        ports.set_inputs(0)
    with raises("a task needs at least one output port, got 0"):
        ports.set_outputs(0)


def test_zero_input_ports_error_names_the_task() -> None:
    """A task declaring 0 input ports is reported with the task's name, like every TopologyError."""
    with raises("task 'join': a task needs at least one input port, got 0"):
        sl.Topology("t").add_task("join", NoInputPorts)


def test_describe_returns_plain_data() -> None:
    """describe() lists nodes and edges as plain dicts, in insertion order."""
    topology = sl.Topology("t")
    source = topology.add_source("src", [1])
    task = topology.add_task("x", TwoInputs, parallelism=3, on_error="skip")
    task.set_input(source, partitioning=sl.SAME_KEY).set_input(source, in_port=1, partitioning=lambda r, n: 0)
    topology.add_sink("out", sl.CollectSink()).set_input(task, partitioning=sl.BROADCAST)
    keys = ("name", "kind", "parallelism", "inputs", "outputs", "sync", "on_error")
    rows = [
        ("src", "source", 1, 0, 1, False, "fail"),
        ("x", "task", 3, 2, 1, False, "skip"),
        ("out", "sink", 1, 1, 0, False, "fail"),
    ]
    assert topology.describe() == {
        "name": "t",
        "nodes": [dict(zip(keys, row, strict=True)) for row in rows],
        "edges": [
            {"from": "src", "out_port": 0, "to": "x", "in_port": 0, "partitioning": "SAME_KEY"},
            {"from": "src", "out_port": 0, "to": "x", "in_port": 1, "partitioning": "custom"},
            {"from": "x", "out_port": 0, "to": "out", "in_port": 0, "partitioning": "BROADCAST"},
        ],
    }


def test_back_edges_of_two_node_loop() -> None:
    """In src -> a -> b -> a the edge b -> a closes the loop."""
    topology, _, _ = loop()
    assert topology.back_edges() == {("b", "a")}


def test_validate_returns_a_resolved_copy_and_leaves_the_topology_alone() -> None:
    """A windowed source's window reaches the task it feeds in the copy validate() returns, not in the original."""
    window = sl.CountWindow(2)
    topology = sl.Topology("t")
    source = topology.add_source("s", [("a", 1), ("a", 2)], window=window)
    summed = topology.window_reduce("sum", "sum", window=sl.CountWindow(5)).set_input(topology.add_source("t", [1]))
    passed = topology.map("pass", lambda r: (r.key, r.value)).set_input(source)
    topology.add_sink("o", sl.CollectSink()).set_input(passed)
    topology.add_sink("o2", sl.CollectSink()).set_input(summed)
    resolved = topology.validate()
    assert resolved is not topology
    assert resolved.nodes is not topology.nodes
    assert (resolved.node("pass").window, resolved.node("pass").windowed_ports) == (window, (0,))
    assert (topology.node("pass").window, topology.node("pass").windowed_ports) == (None, ())
    assert resolved.validate().node("pass").windowed_ports == (0,)  # validating a resolved copy changes nothing
