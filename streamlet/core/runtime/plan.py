"""The physical plan: instances, inboxes, channels and routes derived from a topology."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.abc

from streamlet.core.model import graph
from streamlet.core.model.constants import LATE, SHED
from streamlet.core.model.record import Element
from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.sources import QueueSource, SourceContext
from streamlet.core.model.topology import Edge, Node, Topology
from streamlet.core.runtime.channel import Channel, ChannelFactory, Inbox
from streamlet.core.runtime.cycles import CycleTracker, Quiescence
from streamlet.core.runtime.instances import Environment, Instance, Receiver, SinkInstance, SourceInstance
from streamlet.core.runtime.outputs import RoutedOutputs, WindowOutputs, fan_out
from streamlet.core.runtime.routing import DiscardRoute, Route, in_loop_adder, make_route
from streamlet.core.runtime.task_kinds import task_instance


@dataclass
class PhysicalPlan:
    """Every instance of a job, grouped by node, and what a reconfiguration needs to rewire it.

    ``tables`` holds the segment table of every receiving node (what its
    ``SAME_KEY`` inputs route by); ``retired`` the instances a rescale took
    out (their counters still count); ``builder`` wires instances added later.
    """

    instances: dict[str, list[Instance]]
    trackers: list[CycleTracker]
    discards: list[DiscardRoute]
    feeds: dict[str, asyncio.Queue[Any]]
    tables: dict[str, SegmentTable] = field(default_factory=dict)
    retired: list[Instance] = field(default_factory=list)
    builder: _Builder | None = None

    def all(self) -> list[Instance]:
        """Every instance, sinks first so receivers are waiting before data flows."""
        rank = {"sink": 0, "task": 1, "source": 2}
        ordered = sorted(self.instances.values(), key=lambda group: rank[group[0].node.kind])
        return [instance for group in ordered for instance in group]

    def sources(self) -> list[SourceInstance]:
        """Every source instance."""
        return [i for group in self.instances.values() for i in group if isinstance(i, SourceInstance)]


@dataclass
class Placement:
    """Which instances run here, and how to reach the others (the cluster backend fills it in).

    ``local(node, index)`` says whether an instance runs in this process.
    ``remote(channel_id, node, index)`` opens a channel to an instance that
    does not; ``expose(channel_id, inbox, channel)`` lets senders elsewhere
    reach a local inbox channel under ``channel_id``.

    A job whose shape changed while it ran (live reconfiguration) says so:
    ``tables`` are the segment tables it routes by now (they win over a
    checkpoint's, whose state is then regrouped to them), ``incarnations``
    the live change that put each instance where it runs (channel names carry
    it), and ``hold_open``, for a process joining the running job with
    nothing of its own yet, keeps its part open until it returns.
    """

    job: str
    local: Callable[[str, int], bool]
    remote: Callable[[str, str, int], Channel]
    expose: Callable[[str, Inbox, int], None]
    tables: dict[str, SegmentTable] = field(default_factory=dict)
    incarnations: dict[tuple[str, int], int] = field(default_factory=dict)
    hold_open: Callable[[], Awaitable[None]] | None = None


class _Builder:
    def __init__(
        self,
        topology: Topology,
        channel_factory: ChannelFactory,
        capacity: int,
        placement: Placement | None = None,
        quiescence: Quiescence | None = None,
        tables: dict[str, SegmentTable] | None = None,
    ) -> None:
        self.topology = topology
        self.tables = {**default_tables(topology), **(tables or {})}
        self.channel_factory = channel_factory
        self.capacity = capacity
        self.placement = placement
        self.back = topology.back_edges()
        parts = graph.strongly_connected(topology.successors())
        self.trackers = [CycleTracker(part, quiescence) for part in parts]
        self.tracker_of = {name: t for t in self.trackers for name in t.members}
        self.inboxes: dict[str, list[Inbox]] = {}
        # (edge index, sender index, receiver index) -> channel index in the receiver's inbox
        self.channel_ids: dict[tuple[int, int, int], int] = {}
        self.discards: list[DiscardRoute] = []
        self.routes: dict[tuple[int, int], Route] = {}  # (edge index, sender index) -> its route
        # (node, index) -> the live change that added it
        self.incarnations: dict[tuple[str, int], int] = {} if placement is None else dict(placement.incarnations)

    def in_loop(self, edge: Edge) -> bool:
        tracker = self.tracker_of.get(edge.upstream)
        return tracker is not None and tracker is self.tracker_of.get(edge.downstream)

    def is_local(self, node: str, index: int) -> bool:
        return self.placement is None or self.placement.local(node, index)

    def channel_name(self, edge_index: int, sender: int, receiver: int) -> str:
        """The name a channel is served under in other processes. An instance a live change added carries
        the change's id, so its channels never take the name of a retired one's (whose last frames may still
        be on the wire)."""
        assert self.placement is not None
        edge = self.topology.edges[edge_index]
        sending = self._incarnation(edge.upstream, sender)
        receiving = self._incarnation(edge.downstream, receiver)
        return f"{self.placement.job}/{edge_index}/{sender}{sending}/{receiver}{receiving}"

    def _incarnation(self, node: str, index: int) -> str:
        change = self.incarnations.get((node, index))
        return "" if change is None else f"~{change}"

    def make_inboxes(self, node: Node) -> None:
        tracker = self.tracker_of.get(node.name)
        inboxes = self.inboxes[node.name] = [Inbox(self.capacity) for _ in range(node.parallelism)]
        for edge_index, edge in enumerate(self.topology.edges):
            if edge.downstream != node.name:
                continue
            back_edge = (edge.upstream, edge.downstream) in self.back
            for receiver, inbox in enumerate(inboxes):
                # a tracker counts only this process's members: the others count in their own process
                counted = self.is_local(node.name, receiver)
                for sender in range(self.topology.nodes[edge.upstream].parallelism):
                    # a back edge is never full, so a loop cannot deadlock on itself
                    channel = inbox.add_channel(edge.in_port, unbounded=back_edge, sender=(edge.upstream, sender))
                    self.channel_ids[edge_index, sender, receiver] = channel
                    self._expose_if_remote(edge_index, edge, sender, receiver, channel)
                    if self.in_loop(edge):
                        inbox.loop_channels.add(channel)
                    if tracker is None or not counted:
                        continue
                    if self.in_loop(edge):
                        tracker.add_in_loop_channel(inbox, channel)
                    else:
                        tracker.external_open += 1

    def _expose_if_remote(self, edge_index: int, edge: Edge, sender: int, receiver: int, channel: int) -> None:
        # a local receiver fed by a sender in another process: let that sender reach it by name
        if self.placement is None or not self.is_local(edge.downstream, receiver):
            return
        if not self.is_local(edge.upstream, sender):
            inbox = self.inboxes[edge.downstream][receiver]
            self.placement.expose(self.channel_name(edge_index, sender, receiver), inbox, channel)

    def make_outputs(self, node: Node, sender: int) -> RoutedOutputs:
        side = {"task": LATE, "source": SHED}.get(node.kind)  # the side output, last: late or shed records
        port_count = node.outputs + (0 if side is None else 1)
        routes: list[list[Route]] = [[] for _ in range(port_count)]
        edges: list[list[Edge | None]] = [[] for _ in range(port_count)]
        for edge_index, edge in enumerate(self.topology.edges):
            if edge.upstream == node.name:
                port = port_count - 1 if edge.out_port == side else edge.out_port
                routes[port].append(self._route(edge_index, edge, sender))
                edges[port].append(edge)
        for port in range(port_count):
            if not routes[port]:
                discard = DiscardRoute()
                self.discards.append(discard)
                routes[port].append(discard)
                edges[port].append(None)
        where = f"{node.describe()} instance {sender}"
        outputs = (WindowOutputs if node.window is not None else RoutedOutputs)(
            routes, late=side is not None, side=LATE if side is None else side, where=where
        )
        adders = [
            [self._adder(edge, route, outputs) for edge, route in zip(edges[port], routes[port], strict=True)]
            for port in range(port_count)
        ]
        outputs.set_adders([fan_out(port_adders) for port_adders in adders])
        return outputs

    def _adder(self, edge: Edge | None, route: Route, sender: RoutedOutputs) -> Callable[[Element], None]:
        if edge is None or not self.in_loop(edge):
            return route.add
        tracker = self.tracker_of[edge.downstream]
        limit = self.topology.loop_limit(edge.downstream) if (edge.upstream, edge.downstream) in self.back else None
        return in_loop_adder(route.add, sender, limit, tracker.flow)

    def _route(self, edge_index: int, edge: Edge, sender: int) -> Route:
        receivers = range(len(self.inboxes[edge.downstream]))
        channels = [self._channel_to(edge_index, edge, sender, receiver) for receiver in receivers]
        label = f"edge '{edge.upstream}' -> '{edge.downstream}' input port {edge.in_port}"
        route = self.routes[edge_index, sender] = make_route(
            channels, edge.partitioning, label, self.tables[edge.downstream], edge.downstream
        )
        route.columnar = self.topology.nodes[edge.downstream].columnar  # else columnar batches become elements
        tracker = self.tracker_of.get(edge.downstream)
        if tracker is not None:
            route.cycle = tracker.flow
            route.send_eos = route.send_watermarks = not self.in_loop(edge)
        return route

    # -- wiring an instance added while the job runs (in one process) ------------------------

    def add_inbox(self, node: Node, index: int | None = None) -> Inbox:
        """The inbox of a new instance of ``node`` (the next index, or ``index``: a relocated instance's new
        incarnation): a channel from every current sender.

        Made for an instance in another process too (it keeps the indices in step); only a local one lets
        senders elsewhere reach its channels."""
        inbox = Inbox(self.capacity)
        if index is None:
            receiver = len(self.inboxes[node.name])
            self.inboxes[node.name].append(inbox)
        else:
            receiver = index
            self.inboxes[node.name][index] = inbox
        for edge_index, edge in enumerate(self.topology.edges):
            if edge.downstream == node.name:
                for sender in range(self.topology.nodes[edge.upstream].parallelism):
                    channel = inbox.add_channel(edge.in_port, sender=(edge.upstream, sender))
                    self.channel_ids[edge_index, sender, receiver] = channel
                    self._expose_if_remote(edge_index, edge, sender, receiver, channel)
        return inbox

    def connect_downstream(self, node: Node, sender: int, receivers: dict[str, list[Receiver]]) -> None:
        """Channels from new instance ``sender`` of ``node`` into every local receiver it feeds, held until
        the reconfiguration aligns there."""
        for edge_index, edge in enumerate(self.topology.edges):
            if edge.upstream == node.name:
                for receiver in receivers.get(edge.downstream, []):
                    channel = receiver.add_channel(edge.in_port, (node.name, sender), held=True)
                    self.channel_ids[edge_index, sender, receiver.index] = channel
                    self._expose_if_remote(edge_index, edge, sender, receiver.index, channel)

    def switched_channels(
        self, edge_index: int, sender: int, instances: int, renewed: frozenset[int] = frozenset()
    ) -> list[Channel]:
        """The channels ``sender``'s route on edge ``edge_index`` uses after a change to ``instances``: the
        same objects for instances that stay, new ones for instances added or ``renewed`` (relocated)."""
        edge = self.topology.edges[edge_index]
        current = self.routes[edge_index, sender].channels
        return [
            current[receiver]
            if receiver < len(current) and receiver not in renewed
            else self._channel_to(edge_index, edge, sender, receiver)
            for receiver in range(instances)
        ]

    def _channel_to(self, edge_index: int, edge: Edge, sender: int, receiver: int) -> Channel:
        if self.is_local(edge.downstream, receiver):
            inbox = self.inboxes[edge.downstream][receiver]
            return self.channel_factory(inbox, self.channel_ids[edge_index, sender, receiver])
        assert self.placement is not None
        return self.placement.remote(self.channel_name(edge_index, sender, receiver), edge.downstream, receiver)

    def retire(self, node: str, instances: int) -> None:
        """Forget the inboxes of instances past ``instances`` (a rescale down took them out)."""
        del self.inboxes[node][instances:]


def default_tables(topology: Topology) -> dict[str, SegmentTable]:
    """Every receiving node's segment table before any change: contiguous ranges over its instances."""
    return {
        name: SegmentTable.contiguous(node.max_parallelism, node.parallelism)
        for name, node in topology.nodes.items()
        if node.kind != "source"
    }


def fitting(tables: dict[str, SegmentTable], topology: Topology) -> dict[str, SegmentTable]:
    """The ``tables`` that fit ``topology`` as it is: a receiving node's, over its instances and segments."""
    return {
        name: table
        for name, table in tables.items()
        if (node := topology.nodes.get(name)) is not None
        and node.kind != "source"
        and (table.instances, table.segments) == (node.parallelism, node.max_parallelism)
    }


def build_plan(
    topology: Topology,
    env: Environment,
    *,
    channel_factory: ChannelFactory,
    channel_capacity: int,
    task_group: anyio.abc.TaskGroup,
    placement: Placement | None = None,
    quiescence: Quiescence | None = None,
    tables: dict[str, SegmentTable] | None = None,
) -> PhysicalPlan:
    """Instances and channels for ``topology`` (which must be valid); with ``placement``, only the local ones.

    ``quiescence`` ends the loops instead of their trackers (needed when a loop is split between processes).
    ``tables`` gives nodes a segment table other than the default contiguous ranges (a restored layout).
    """
    builder = _Builder(topology, channel_factory, channel_capacity, placement, quiescence, tables)
    for node in topology.nodes.values():
        if node.kind != "source":
            builder.make_inboxes(node)
    feeds: dict[str, asyncio.Queue[Any]] = {
        name: asyncio.Queue(maxsize=node.source.maxsize)
        for name, node in topology.nodes.items()
        if isinstance(node.source, QueueSource)
    }
    instances: dict[str, list[Instance]] = {}
    for name, node in topology.nodes.items():
        group: list[Instance] = []
        for index in range(node.parallelism):
            if not builder.is_local(name, index):
                continue
            outputs = builder.make_outputs(node, index)
            if node.kind == "source":
                context = SourceContext(
                    name, index, node.parallelism, env.clock, task_group, feeds.get(name), env.dead_letters
                )
                group.append(SourceInstance(node, index, outputs, env, context))
                continue
            inbox = builder.inboxes[name][index]
            receiver: Receiver
            if node.kind == "sink":
                receiver = SinkInstance(node, index, outputs, env, inbox)
            else:
                receiver = task_instance(node, index, outputs, env, inbox)
            receiver.cycle = builder.tracker_of.get(name)
            group.append(receiver)
        if group:
            instances[name] = group
    return PhysicalPlan(instances, builder.trackers, builder.discards, feeds, builder.tables, builder=builder)
