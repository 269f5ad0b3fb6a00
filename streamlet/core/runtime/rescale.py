"""Live reconfiguration of a job running in this process: rescale a task, move its segments.

The steps, for task ``T`` going from segment table ``old`` to ``new``
(``core.runtime.reconfiguration`` has the plan; the instances run the
protocol):

1. Checkpoints pause: none in flight, none begins (a reconfiguration is a
   cut of its own, and barriers must not cross changing channels).
2. New instances of ``T`` are wired in: an inbox with a channel from every
   sender, channels into every receiver downstream (held there until the
   change has aligned), and they wait for their state before running.
3. Every sender into ``T`` is asked to switch at its next batch boundary:
   what it buffered goes out by the old table, then a ``Reconfigure`` marker
   on each old channel, then it routes by the new table.
4. Each old instance of ``T``, aligned on the marker, hands the keys that
   move to their new owners, passes the marker downstream, and then retires
   or takes the keys moving to it. Downstream receivers align on the marker,
   so a key's results from before the move come before those after it.
5. When every instance has played its part, the layout is the new one:
   retired instances are gone (their counters still count), checkpoints go
   on with the new layout.

Nothing is lost or doubled, and instances that are not involved keep running
with their state in memory. Only jobs in one process, not inside a loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from streamlet.core.model.partition import KEYED
from streamlet.core.model.record import END_OF_STREAM
from streamlet.core.model.topology import Node, Topology
from streamlet.core.runtime.instances import Environment, Instance, Receiver
from streamlet.core.runtime.reconfiguration import (
    ActiveReconfiguration,
    LocalHandoff,
    ReconfigurationPlan,
    StateHandoff,
)  # fmt: skip
from streamlet.core.runtime.routing import Switch
from streamlet.core.runtime.task_instance import TaskInstance
from streamlet.core.runtime.task_kinds import task_instance
from streamlet.core.state.regroup import unsplittable_window
from streamlet.errors import ReconfigurationError

if TYPE_CHECKING:
    from streamlet.core.runtime.plan import PhysicalPlan, _Builder
    from streamlet.core.state.checkpoints import Coordinator


class Reconfigurer:
    """Carries out one reconfiguration at a time on a running in-process job."""

    def __init__(
        self,
        topology: Topology,
        plan: PhysicalPlan,
        env: Environment,
        start: Callable[[Instance], None],
        coordinator: Coordinator | None,
    ) -> None:
        self.topology = topology
        self.plan = plan
        self.env = env
        self.start = start  # runs a new instance in the job's task group
        self.coordinator = coordinator
        self.count = 0  # reconfigurations completed

    # -- what callers ask -------------------------------------------------------------

    def rescale_plan(self, task: str, instances: int) -> ReconfigurationPlan:
        """The plan for giving ``task`` ``instances`` instances (checked; nothing changes yet)."""
        node = self._check(task)
        if type(instances) is not int or not 1 <= instances <= node.max_parallelism:
            raise ReconfigurationError(
                f"task '{task}' can run with 1 to {node.max_parallelism} instances (its max_parallelism, "
                f"the number of key segments), not {instances!r}"
            )
        old = self.plan.tables[task]
        return ReconfigurationPlan(self.count + 1, task, old, old.rescaled(instances))

    def move_plan(self, task: str, moves: Mapping[int, int]) -> ReconfigurationPlan:
        """The plan for giving segments of ``task`` new owners (``segment -> instance``; checked)."""
        self._check(task)
        old = self.plan.tables[task]
        for segment, owner in moves.items():
            if type(segment) is not int or not 0 <= segment < old.segments:
                raise ReconfigurationError(f"task '{task}' has segments 0 to {old.segments - 1}, not {segment!r}")
            if type(owner) is not int or not 0 <= owner < old.instances:
                raise ReconfigurationError(
                    f"task '{task}' has instances 0 to {old.instances - 1}: segment {segment} cannot go to {owner!r}"
                )
        return ReconfigurationPlan(self.count + 1, task, old, old.moved_to(moves))

    def claim(self, plan: ReconfigurationPlan, handoff: StateHandoff | None = None) -> ActiveReconfiguration | None:
        """Take the job for ``plan`` (``None``: nothing would move); refused while another change runs.

        ``handoff`` carries state between instances (default: in memory; a cluster worker passes one that
        reaches the other workers)."""
        if self.env.reconfiguration is not None:
            raise ReconfigurationError(
                f"task '{self.env.reconfiguration.plan.task}' is being reconfigured: one change at a time"
            )
        if not plan.relocated and plan.old.owners == plan.new.owners and plan.old.instances == plan.new.instances:
            return None  # nothing moves (a relocation moves an instance, not segments: its table stays)
        active = ActiveReconfiguration(plan, handoff or LocalHandoff())
        self.env.reconfiguration = active  # taken at once: a second caller is refused from here on
        return active

    async def carry_out(
        self, active: ActiveReconfiguration, ready: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Run a claimed reconfiguration to its end (the job's new layout); checkpoints wait meanwhile.

        This process's part, when the job is split between processes: ``ready`` is awaited once the part is
        wired (new instances' inboxes and held channels in place) and must return once every process's part
        is, so that no sender switches to a channel its receiver does not serve yet.
        """
        try:
            if self.coordinator is None:
                await self._carry_out(active, ready)
            else:
                async with self.coordinator.paused():
                    await self._carry_out(active, ready)
        finally:
            self.env.reconfiguration = None

    # -- checks -------------------------------------------------------------------------

    def _check(self, task: str) -> Node:
        node = self.topology.nodes.get(task)
        if node is None or node.kind != "task":
            tasks = sorted(name for name, n in self.topology.nodes.items() if n.kind == "task")
            raise ReconfigurationError(f"job '{self.topology.name}' has no task called '{task}' (tasks: {tasks})")
        if self.plan.builder is None:
            raise ReconfigurationError(f"job '{self.topology.name}' has not started")
        if any(task in t.members or _feeds(self.topology, t.members, task) for t in self.plan.trackers):
            raise ReconfigurationError(f"task '{task}' is in or next to a loop: loops cannot be reconfigured live")
        reason = unsplittable_window(node.window)
        if reason is not None:
            raise ReconfigurationError(f"task '{task}' cannot be reconfigured: {reason}")
        if any(instance.completed for instance in self.plan.instances.get(task, [])):
            raise ReconfigurationError(f"task '{task}' has finished: its input ended")
        return node

    # -- the steps ------------------------------------------------------------------------

    async def _carry_out(self, active: ActiveReconfiguration, ready: Callable[[], Awaitable[None]] | None) -> None:
        plan, topology = active.plan, self.topology
        node = topology.nodes[plan.task]
        builder = self.plan.builder
        assert builder is not None
        old_instances = list(self.plan.instances.get(plan.task, []))  # this process's
        if any(instance.completed for instance in old_instances):
            raise ReconfigurationError(f"task '{plan.task}' has finished: its input ended")
        for instance in old_instances:
            active.expect(plan.task, instance.index)
        for receiver in self._downstream(plan.task):
            active.expect(receiver.node.name, receiver.index)
        added = self._add_instances(node, builder, plan, active)
        if ready is not None:
            await ready()  # the input may end meanwhile: then no marker comes to align on, and the change fails
            self._refuse_an_ended_input(plan.task, old_instances, active)
        await self._switch_senders(builder, plan, active)
        node.parallelism = plan.new.instances  # what restores, statistics and later wiring read from here on
        for instance in added:
            self.start(instance)
        if active.waiting:
            await active.over.wait()
        kept = [instance for instance in old_instances if not plan.retiring(instance.index)]
        self.plan.retired.extend(instance for instance in old_instances if plan.retiring(instance.index))
        if kept or added:
            self.plan.instances[plan.task] = sorted([*kept, *added], key=lambda instance: instance.index)
        else:
            self.plan.instances.pop(plan.task, None)  # none of its instances runs here
        self.plan.tables[plan.task] = plan.new
        builder.retire(plan.task, plan.new.instances)
        if self.coordinator is not None:
            self.coordinator.instances = self.plan.all()
        self.count += 1

    def _refuse_an_ended_input(self, task: str, old_instances: list[Instance], active: ActiveReconfiguration) -> None:
        """Between processes: a sender into ``task`` here, or an instance of it here that ended before playing
        its part, ended because its input did while the processes wired their parts: no marker comes any
        more, so the change could never complete. It fails before anything switches; the cluster runs the next
        attempt from the last checkpoint. (An instance that played its part and retired is no such case:
        another process may have switched first.)"""
        senders = [
            sender
            for edge in self.topology.edges
            if edge.downstream == task
            for sender in self.plan.instances.get(edge.upstream, [])
        ]
        unplayed = [instance for instance in old_instances if (instance.node.name, instance.index) in active.waiting]
        ended = [instance for instance in [*senders, *unplayed] if instance.completed]
        if ended:
            names = ", ".join(sorted(f"{instance.node.name}[{instance.index}]" for instance in ended))
            raise ReconfigurationError(f"the input of task '{task}' ended during the change ({names} finished)")

    def _add_instances(
        self, node: Node, builder: _Builder, plan: ReconfigurationPlan, active: ActiveReconfiguration
    ) -> list[TaskInstance]:
        """New instances wired in (an inbox each, held channels into every local receiver they feed); the
        local ones made, waiting for their state (not started yet)."""
        receivers = {name: [i for i in group if isinstance(i, Receiver)] for name, group in self.plan.instances.items()}
        new = plan.joining  # added instances, and relocated ones' new incarnations
        for index in new:
            builder.incarnations[node.name, index] = plan.id
        inboxes = {index: builder.add_inbox(node, index if index in plan.relocated else None) for index in new}
        for index in new:
            builder.connect_downstream(node, index, receivers)
        added = []
        for index in new:
            if builder.is_local(node.name, index):
                instance = task_instance(node, index, builder.make_outputs(node, index), self.env, inboxes[index])
                instance.joining = active
                active.expect(node.name, index)
                added.append(instance)
        return added

    async def _switch_senders(
        self, builder: _Builder, plan: ReconfigurationPlan, active: ActiveReconfiguration
    ) -> None:
        """Ask every sender into the task to switch routes at its next batch boundary."""
        for edge_index, edge in enumerate(self.topology.edges):
            if edge.downstream != plan.task:
                continue
            table = plan.new if edge.partitioning in KEYED else None
            for sender in self.plan.instances.get(edge.upstream, []):
                channels = builder.switched_channels(edge_index, sender.index, plan.new.instances, plan.relocated)
                if sender.completed:  # it sends its end on the old channels: the new ones must not wait for it
                    for index in plan.joining:
                        await channels[index].send(END_OF_STREAM)  # a new, empty channel: never waits
                    continue
                route = builder.routes[edge_index, sender.index]
                name = (f"switch {edge_index}", sender.index)
                active.expect(*name)
                route.switch = Switch(channels, table, plan.marker, _switched(sender, active, name))
                sender.wake()

    def _downstream(self, task: str) -> list[Receiver]:
        """Every receiving instance fed by ``task`` (they align on the marker)."""
        names = {edge.downstream for edge in self.topology.edges if edge.upstream == task}
        return [i for name in sorted(names) for i in self.plan.instances.get(name, []) if isinstance(i, Receiver)]


def _switched(sender: Instance, active: ActiveReconfiguration, name: tuple[str, int]) -> Callable[[], None]:
    def done() -> None:
        sender.outputs.refresh_adders()  # a keyed route's add changes between one instance and several
        active.done(*name)

    return done


def _feeds(topology: Topology, members: Any, task: str) -> bool:
    return any(
        (edge.upstream in members and edge.downstream == task) or (edge.upstream == task and edge.downstream in members)
        for edge in topology.edges
    )
