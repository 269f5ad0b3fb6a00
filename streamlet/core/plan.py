"""The physical plan: instances, inboxes and routes derived from a topology."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.abc

from streamlet.core import graph
from streamlet.core.channel import ChannelFactory, Inbox
from streamlet.core.clock import Clock
from streamlet.core.cycles import CycleTracker
from streamlet.core.instance import Instance, Receiver, SinkInstance, SourceInstance, TaskInstance
from streamlet.core.ports import Outputs
from streamlet.core.record import Record
from streamlet.core.routing import DiscardRoute, Route, in_loop_adder, make_route
from streamlet.core.sources import QueueSource, SourceContext
from streamlet.core.statistics import DeadLetter
from streamlet.core.topology import Edge, Topology


@dataclass
class PlanOptions:
    """How to build instances: channels, batch sizes, time."""

    channel_factory: ChannelFactory
    batch_size: int
    channel_capacity: int
    clock: Clock
    task_group: anyio.abc.TaskGroup
    dead_letters: list[DeadLetter] = field(default_factory=list)


@dataclass
class PhysicalPlan:
    """Every instance of a job, grouped by node."""

    instances: dict[str, list[Instance]]
    trackers: list[CycleTracker]
    discards: list[DiscardRoute]
    feeds: dict[str, asyncio.Queue[Any]]

    def all(self) -> list[Instance]:
        """Every instance, sinks first so receivers are waiting before data flows."""
        ordered = sorted(
            self.instances.values(), key=lambda group: {"sink": 0, "task": 1, "source": 2}[group[0].node.kind]
        )
        return [instance for group in ordered for instance in group]


class _Builder:
    def __init__(self, topology: Topology, options: PlanOptions) -> None:
        self.topology = topology
        self.options = options
        self.back = topology.back_edges()
        self.trackers = [CycleTracker(part) for part in graph.strongly_connected(topology.successors())]
        self.tracker_of = {name: t for t in self.trackers for name in t.members}
        self.inboxes: dict[str, list[Inbox]] = {}
        self.senders: dict[str, list[list[int]]] = {}
        self.discards: list[DiscardRoute] = []

    def in_loop(self, edge: Edge) -> bool:
        tracker = self.tracker_of.get(edge.upstream)
        return tracker is not None and tracker is self.tracker_of.get(edge.downstream)

    def make_inboxes(self, name: str) -> None:
        node = self.topology.nodes[name]
        incoming = [e for e in self.topology.edges if e.downstream == name]
        tracker = self.tracker_of.get(name)
        self.inboxes[name], self.senders[name] = [], []
        for _ in range(node.parallelism):
            inbox = Inbox(node.inputs, self.options.channel_capacity)
            senders, looped = [0] * node.inputs, set()
            for edge in incoming:
                if self.in_loop(edge):
                    looped.add(edge.in_port)
                else:
                    senders[edge.in_port] += self.topology.nodes[edge.upstream].parallelism
                    if tracker is not None:
                        tracker.external_open += self.topology.nodes[edge.upstream].parallelism
                if (edge.upstream, edge.downstream) in self.back:
                    inbox.make_unbounded(edge.in_port)  # a loop must not deadlock on its own back edge
            for port in looped:
                senders[port] += 1  # the tracker's CycleEnd closes the in-loop senders at once
                assert tracker is not None
                tracker.add_in_loop_port(inbox, port)
            self.inboxes[name].append(inbox)
            self.senders[name].append(senders)

    def make_outputs(self, name: str) -> Outputs:
        node = self.topology.nodes[name]
        routes: list[list[Route]] = [[] for _ in range(node.outputs)]
        edges = [e for e in self.topology.edges if e.upstream == name]
        for out_edge in edges:
            routes[out_edge.out_port].append(self._route(out_edge))
        for port in range(node.outputs):
            if not routes[port]:
                discard = DiscardRoute()
                self.discards.append(discard)
                routes[port].append(discard)
        outputs = Outputs(routes)
        adders: list[list[Callable[[Record], None]]] = [[] for _ in range(node.outputs)]
        for port, port_routes in enumerate(routes):
            port_edges: list[Edge | None] = [e for e in edges if e.out_port == port] or [None]
            for edge, route in zip(port_edges, port_routes, strict=True):
                adders[port].append(self._adder(edge, route, outputs))
        outputs.set_adders([_fan_out(port_adders) for port_adders in adders])
        return outputs

    def _adder(self, edge: Edge | None, route: Route, sender: Outputs) -> Callable[[Record], None]:
        if edge is None or not self.in_loop(edge):
            return route.add
        tracker = self.tracker_of[edge.downstream]
        limit = self.topology.loop_limit(edge.downstream) if (edge.upstream, edge.downstream) in self.back else None
        return in_loop_adder(route.add, sender, limit, tracker.flow)

    def _route(self, edge: Edge) -> Route:
        factory = self.options.channel_factory
        channels = [factory(inbox, edge.in_port) for inbox in self.inboxes[edge.downstream]]
        route = make_route(channels, edge.partitioning)
        tracker = self.tracker_of.get(edge.downstream)
        if tracker is not None:
            route.cycle = tracker.flow
            route.send_eos = not self.in_loop(edge)
        return route


def _fan_out(adders: list[Callable[[Record], None]]) -> Callable[[Record], None]:
    if len(adders) == 1:
        return adders[0]

    def add_to_all(record: Record) -> None:
        for add in adders:
            add(record)

    return add_to_all


def build_plan(topology: Topology, options: PlanOptions) -> PhysicalPlan:
    """Instances and channels for ``topology`` (which must be valid)."""
    builder = _Builder(topology, options)
    for name, node in topology.nodes.items():
        if node.kind != "source":
            builder.make_inboxes(name)
    feeds: dict[str, asyncio.Queue[Any]] = {
        name: asyncio.Queue(maxsize=node.source.maxsize)
        for name, node in topology.nodes.items()
        if isinstance(node.source, QueueSource)
    }
    instances: dict[str, list[Instance]] = {}
    for name, node in topology.nodes.items():
        group: list[Instance] = []
        for index in range(node.parallelism):
            outputs = builder.make_outputs(name)
            if node.kind == "source":
                context = SourceContext(
                    name, index, node.parallelism, options.clock, options.task_group, feeds.get(name)
                )
                group.append(SourceInstance(node, index, outputs, options.batch_size, context))
                continue
            inbox, senders = builder.inboxes[name][index], builder.senders[name][index]
            receiver: Receiver
            if node.kind == "sink":
                receiver = SinkInstance(node, index, outputs, options.batch_size, inbox, senders)
            else:
                receiver = TaskInstance(node, index, outputs, options.batch_size, inbox, senders, options.dead_letters)
            receiver.cycle = builder.tracker_of.get(name)
            group.append(receiver)
        instances[name] = group
    return PhysicalPlan(instances, builder.trackers, builder.discards, feeds)
