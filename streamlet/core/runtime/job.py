"""The job: runs a physical plan inside the caller's event loop.

All instances of a job live in one anyio task group. The first error in any
instance cancels the others and is raised from :meth:`Job.wait`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from streamlet.core.model import world
from streamlet.core.model.clock import Clock
from streamlet.core.model.hooks import maybe_await
from streamlet.core.model.record import DeadLetter, Record
from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.sinks import check_attempt
from streamlet.core.model.sources import END_OF_FEED
from streamlet.core.model.state import StateBackend, check_state_backend
from streamlet.core.model.topology import Topology
from streamlet.core.model.validation import surprising_defaults, unconsumed_ports
from streamlet.core.runtime.channel import ChannelFactory
from streamlet.core.runtime.clock import SystemClock
from streamlet.core.runtime.cycles import Quiescence, refuse_checkpoints_with_cycles, refuse_cycles
from streamlet.core.runtime.instances import Environment, Instance, Receiver, SinkInstance, SourceInstance
from streamlet.core.runtime.lookup_join import LookupJoinInstance
from streamlet.core.runtime.loop_watch import LoopLag, default_loop_warning
from streamlet.core.runtime.offload import process_pool_for
from streamlet.core.runtime.plan import PhysicalPlan, Placement, build_plan, default_tables
from streamlet.core.runtime.reconfiguration import ReconfigurationPlan, StateHandoff
from streamlet.core.runtime.rescale import Reconfigurer
from streamlet.core.runtime.routing import segment_loads
from streamlet.core.runtime.shedding import Shedder
from streamlet.core.runtime.statistics import InstanceSnapshot, JobStatistics, NodeStatistics, queue_state
from streamlet.core.runtime.task_instance import TaskInstance
from streamlet.core.runtime.where import where
from streamlet.core.state.checkpoints import Coordinator
from streamlet.core.state.restore import layout_of, restore
from streamlet.core.state.savepoints import check_fits, read_savepoint, write_savepoint
from streamlet.core.state.store import CheckpointStore
from streamlet.errors import JobError, ReconfigurationError, TopologyError

DEFAULT_BATCH_SIZE = 1000
# Batches per channel: one in hand, one queued. In one event loop deeper queues buy no overlap,
# they only keep records alive long enough to be promoted by the garbage collector (measured).
DEFAULT_CHANNEL_CAPACITY = 2


@dataclass(frozen=True, slots=True, repr=False)
class JobResult:
    """What a finished job leaves: sink contents, dead letters and statistics."""

    statistics: JobStatistics
    dead_letters: list[DeadLetter]
    _sinks: dict[str, list[Record]]

    def __repr__(self) -> str:
        # Short on purpose: asyncio and debuggers repr results, and a sink may hold millions of records.
        kept = {name: len(records) for name, records in self._sinks.items()}
        return f"JobResult(job={self.statistics.job!r}, sinks={kept}, dead_letters={len(self.dead_letters)})"

    def collected(self) -> dict[str, list[Record]]:
        """Every collecting sink's records, by sink name."""
        return dict(self._sinks)

    def sink(self, name: str) -> list[Record]:
        """Records a ``CollectSink`` called ``name`` received, instance by instance."""
        try:
            return self._sinks[name]
        except KeyError:
            raise JobError(
                f"no collecting sink called '{name}'; sinks that keep records: {sorted(self._sinks)}"
            ) from None


class Job:
    """One run of a topology. Create it with :func:`start` or :func:`run`.

    ``job_id`` names the job the same way in every run (default
    ``"local.<topology name>"``); ``attempt`` is a token unique to this run
    (default: a new random one). Both reach sinks through ``SinkContext``,
    and checkpoints record the attempt that took them, so a restore
    publishes what that run staged. A cluster passes its own, and its job's
    ``name`` for the log lines (default: the topology's name), and a
    ``lineage`` its attempts of one submission share (see ``SinkContext``).

    ``cpu_turns(fill)`` schedules the instances on the event loop: how many
    batches an instance takes before the others run, given its input queue's
    fill (0..1); ``None`` (the default) lets each run until it waits. The
    policies are in ``streamlet.adaptation.cpu``.

    A job split between processes (``placement``) runs loops only with a
    ``quiescence``, which decides when each loop is quiet in every process
    (see ``core.runtime.cycles``); in one process the loops end by themselves.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        channel_factory: ChannelFactory,
        clock: Clock | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        channel_capacity: int = DEFAULT_CHANNEL_CAPACITY,
        checkpoint_store: CheckpointStore | None = None,
        checkpoint_interval: float | None = None,
        placement: Placement | None = None,
        coordinator: Coordinator | None = None,
        job_id: str | None = None,
        attempt: str | None = None,
        quiescence: Quiescence | None = None,
        from_savepoint: str | os.PathLike[str] | None = None,
        cpu_turns: Callable[[float], int] | None = None,
        name: str | None = None,
        loop_warning: float | None = None,
        lineage: str | None = None,
        state_backend: StateBackend | None = None,
    ) -> None:
        if not isinstance(topology, Topology):
            raise TopologyError(f"a job runs a streamlet.Topology, got {type(topology).__name__}: {topology!r:.80}")
        _check_whole("batch_size", batch_size)
        _check_whole("channel_capacity", channel_capacity)
        topology = topology.validate()  # a resolved copy: the caller's topology stays as it was
        self.job_id = job_id or f"local.{topology.name}"
        self.attempt = new_attempt() if attempt is None else check_attempt(attempt)
        self._where = where(placement)
        self._quiescence = quiescence
        if placement is not None and quiescence is None:
            # no process sees all of a split loop's counters: ending it by local counts could end it early
            refuse_cycles(topology, "a loop split between processes needs a quiescence detector (quiescence=...)")
        self.topology = topology
        self.decisions: list[dict[str, Any]] = []  # what an adaptation loop decided for this job, in order
        self.endpoints: dict[str, str] = {}  # where the job can be watched, set by whoever serves it ("monitor")
        self.shed_ratio = 0.0  # the share of records the sources shed now (see ``shed``)
        self.clock = clock or SystemClock()
        self._channel_factory = channel_factory
        self._channel_capacity = channel_capacity
        self.name = name or topology.name  # what its log lines call it (a cluster job may be named apart)
        self._env = Environment(
            batch_size,
            self.clock,
            job_id=self.job_id,
            attempt=self.attempt,
            turns=cpu_turns,
            job=self.name,
            lineage=lineage,
        )
        self._env.event_time = topology.uses_event_time()
        self._env.loop_warning = _loop_warning(default_loop_warning() if loop_warning is None else loop_warning)
        self._env.process_pool = process_pool_for(topology, self.job_id)
        check_state_backend("the job", state_backend)
        self._env.state_backend = state_backend
        self._coordinator: Coordinator | None = None
        start_from = None  # read and checked before anything that must be closed is made
        if from_savepoint is not None:
            if checkpoint_store is None or coordinator is not None:
                raise JobError("from_savepoint needs checkpoint_dir= (where the job keeps its own checkpoints)")
            start_from = read_savepoint(from_savepoint)
            check_fits(start_from[1], topology, f"savepoint {from_savepoint}")
        if checkpoint_store is not None or coordinator is not None:
            refuse_checkpoints_with_cycles(topology)
        if checkpoint_store is not None and coordinator is None:
            coordinator = Coordinator(topology.name, checkpoint_store, self.clock, checkpoint_interval)
        if coordinator is not None:
            self._coordinator = coordinator
            self._env.checkpoints = coordinator
            self._env.incremental_checkpoints = coordinator.incremental
        elif checkpoint_interval is not None:
            raise JobError("checkpoint_interval needs a checkpoint store (checkpoint_dir=...)")
        if start_from is not None:
            assert self._coordinator is not None
            self._coordinator.start_from = start_from
        self._plan: PhysicalPlan | None = None
        self._reconfigurer: Reconfigurer | None = None
        self._outer: anyio.abc.TaskGroup | None = None  # the job's own tasks (the coordinator, reconfigurations)
        self._error: BaseException | None = None
        self._finished = anyio.Event()
        self._started = anyio.Event()
        self._closed_feeds: set[str] = set()
        self._went_idle: anyio.Event | None = None  # while settle() waits: set when an instance goes idle or ends
        self._began = self._ended = 0.0
        self._loop_lag: LoopLag | None = None  # how late this job's event loop runs (a real loop only)
        self.log = structlog.get_logger("streamlet").bind(job=self.name)
        if placement is None:  # a part of a job placed over processes or workers: its launcher warns, once
            self._warn_unconsumed_ports()
            for event, fields in surprising_defaults(topology, checkpointed=self._coordinator is not None):
                self.log.warning(event, **fields)

    def _warn_unconsumed_ports(self) -> None:
        for node, port in unconsumed_ports(self.topology):
            self.log.warning(
                "output port has no consumer", node=node, port=port,
                effect="records emitted there are dropped (counted in statistics.discarded)",
            )  # fmt: skip

    # -- running ------------------------------------------------------------

    async def run(self) -> JobResult:
        """Run to completion in the current event loop and return the result."""
        await self._run_plan()
        return await self.wait()

    async def _run_plan(self) -> None:
        self._began = world.monotonic()
        if world.current().watches_loop():
            self._loop_lag = LoopLag()
            self._loop_lag.start()
        try:
            async with anyio.create_task_group() as outer:
                async with anyio.create_task_group() as instances:
                    if not await self._start(instances, outer):
                        return
                if self._coordinator is not None and self._error is None:
                    # guarded: a sink failing to stage the final checkpoint is the job's error, not an exception group
                    await self._guarded(self._coordinator.finish, outer)
                outer.cancel_scope.cancel()  # the coordinator's loop runs until the job is over
        finally:
            self._ended = world.monotonic()
            if self._loop_lag is not None:
                self._loop_lag.stop()
            if self._env.process_pool is not None:
                self._env.process_pool.shutdown()
            for backend in self._state_backends():
                backend.close()
            if self._coordinator is not None:
                self._coordinator.close()
            if self._error is not None or not self._started.is_set() or self._unfinished():
                await self._abort_sinks()
            self._started.set()
            self._finished.set()
            self._instance_idle()

    def _state_backends(self) -> list[StateBackend]:
        """The job's state backend and its tasks' own, each once."""
        found = [self._env.state_backend, *(node.state_backend for node in self.topology.nodes.values())]
        return list({id(backend): backend for backend in found if backend is not None}.values())

    async def _start(self, instances: anyio.abc.TaskGroup, outer: anyio.abc.TaskGroup) -> bool:
        self._outer = outer
        try:
            point = None if self._coordinator is None else await self._coordinator.restore_point()
            document = None if point is None else point[1]
            tables = layout_of(document, default_tables(self.topology))  # state stays where a checkpoint left it
            tables.update(self._where.tables(self.topology))  # a live change's layout wins
            self._plan = build_plan(
                self.topology, self._env, channel_factory=self._channel_factory,
                channel_capacity=self._channel_capacity, task_group=instances, placement=self._where.placement,
                quiescence=self._quiescence, tables=tables,
            )  # fmt: skip
            plan = self._plan
            self._attach_shedders(plan)

            def start_instance(instance: Instance) -> None:
                instances.start_soon(self._guarded, instance.run, outer)

            self._reconfigurer = Reconfigurer(self.topology, plan, self._env, start_instance, self._coordinator)
            if self._coordinator is not None:
                await restore(plan.instances, document, plan.tables)
                self._coordinator.layout = lambda: {name: table.to_data() for name, table in plan.tables.items()}
                self._coordinator.attach(plan.all(), None if point is None else point[0], self.attempt)
                outer.start_soon(self._guarded, self._coordinator.run, outer)  # a failed commit stops the job
        except Exception as exc:  # noqa: BLE001 - e.g. a sink that cannot open: raised by wait()
            self._error = exc
            return False
        for tracker in self._plan.trackers:
            tracker.check()  # a loop nothing feeds is over before it starts
        self._started.set()
        for instance in self._plan.all():
            instances.start_soon(self._guarded, instance.run, outer)
        if self._where.hold_open is not None:
            instances.start_soon(self._guarded, self._where.hold_open, outer)  # joining: open until given work
        if self._quiescence is not None and self._plan.trackers:
            # among the instances: this part of the job ends only once its loops have ended everywhere
            instances.start_soon(self._guarded, partial(self._quiescence.run, self._plan.trackers), outer)
        return True

    async def _guarded(self, run: Any, group: anyio.abc.TaskGroup) -> None:
        try:
            await run()
        except Exception as exc:  # noqa: BLE001 - the first failure stops the job and is re-raised by wait()
            if self._error is None:
                self._error = exc  # raised by wait(); logging it as well would report it twice
            group.cancel_scope.cancel()
        self._instance_idle()  # an instance that ended may be the last one settle() waited for

    def _unfinished(self) -> bool:
        return self._plan is not None and not all(i.completed for i in self._plan.all())

    async def _abort_sinks(self) -> None:
        if self._plan is None:
            return
        with anyio.CancelScope(shield=True):  # a cancelled job still lets its sinks let go of connections
            for instance in self._plan.all():
                if isinstance(instance, SinkInstance):
                    await self._abort_sink(instance)

    async def _abort_sink(self, instance: SinkInstance) -> None:
        try:
            await maybe_await(instance.writer.abort())
        except Exception as exc:  # noqa: BLE001 - logged: it must not hide why the job stopped, nor skip other sinks
            self.log.warning("sink abort failed", sink=instance.node.name, instance=instance.index, error=repr(exc))

    async def wait(self) -> JobResult:
        """Wait until the job has finished; raise the error that stopped it, if any."""
        await self._finished.wait()
        if self._error is not None:
            raise self._error
        return self._result()

    async def ended(self) -> None:
        """Return once the job has ended, however it ended (see :meth:`wait` for how)."""
        await self._finished.wait()

    async def built(self) -> PhysicalPlan | None:
        """Return once the job's instances exist (built, maybe not yet running): its physical plan, or ``None``
        when it failed before building them. What a harness watching instances waits for."""
        await self._started.wait()
        return self._plan

    async def checkpoint(self) -> int:
        """Take a checkpoint now and wait until it is complete; returns its epoch."""
        if self._coordinator is None:
            raise JobError(f"job '{self.topology.name}' has no checkpoint store (pass checkpoint_dir=...)")
        await self._started.wait()
        return await self._coordinator.checkpoint()

    # -- changing shape while running ----------------------------------------------

    async def rescale(self, task: str, instances: int) -> None:
        """Give ``task`` ``instances`` instances while the job runs, and return once it runs with them.

        Its key segments are spread over the new instances in contiguous
        ranges; only the segments that change owner move, with their keyed
        state, timers and open windows. Senders switch at a marker, so no
        record is lost or doubled and a key's records keep their order; other
        instances keep running. One change at a time; checkpoints wait for it.
        Raises :class:`ReconfigurationError` (and changes nothing) for a task
        that does not exist or has finished, a count outside 1..max_parallelism,
        a job that is not running, or while another change runs.
        """
        reconfigurer = await self._running_reconfigurer()
        await self._reconfigure(reconfigurer.rescale_plan(task, instances))

    async def move_segments(self, task: str, moves: dict[int, int]) -> None:
        """Give segments of ``task`` new owners (``{segment: instance}``) while the job runs, with their state.

        What a load balancer does: the keys of a moved segment go to the new
        instance, nothing else changes (see :meth:`rescale` for the guarantees).
        """
        reconfigurer = await self._running_reconfigurer()
        await self._reconfigure(reconfigurer.move_plan(task, moves))

    def segment_table(self, task: str) -> SegmentTable:
        """The segment table ``task`` routes by now (which instance owns each key segment)."""
        if self._plan is None or task not in self._plan.tables:
            raise JobError(f"job '{self.topology.name}' has no running task called '{task}'")
        return self._plan.tables[task]

    async def savepoint(self, path: str | os.PathLike[str]) -> Path:
        """Take a consistent snapshot without stopping and keep it at ``path``; returns the path.

        A checkpoint like the others (the job needs ``checkpoint_dir``), then
        written as a file of its own: ``start(topology, checkpoint_dir=...,
        from_savepoint=path)`` runs a job from it, with changed code or
        parallelism as long as task names and state shapes match.
        """
        coordinator = self._coordinator
        if coordinator is None or coordinator.agreement is not None:
            raise JobError(f"job '{self.topology.name}' has no checkpoint store of its own (pass checkpoint_dir=...)")
        epoch = await self.checkpoint()
        found = await world.blocking(coordinator.store.latest)
        if found is None or found[0] < epoch:
            raise JobError(f"checkpoint {epoch} of job '{self.topology.name}' cannot be read back for the savepoint")
        return await world.blocking(write_savepoint, path, found[1])

    @property
    def reconfigurations(self) -> int:
        """Reconfigurations (rescales, segment moves) completed so far."""
        return 0 if self._reconfigurer is None else self._reconfigurer.count

    async def _running_reconfigurer(self) -> Reconfigurer:
        await self._started.wait()
        if self._reconfigurer is None or self._finished.is_set() or self._error is not None:
            raise ReconfigurationError(f"job '{self.topology.name}' is not running")
        self._where.check_live_change(self.topology.name)
        return self._reconfigurer

    async def reconfigure_part(
        self, plan: ReconfigurationPlan, handoff: StateHandoff, ready: Callable[[], Awaitable[None]]
    ) -> None:
        """This process's part of a reconfiguration of a job split between processes (a cluster worker calls
        it for every worker of the job at once; see ``core.runtime.rescale``)."""
        await self._started.wait()
        if self._reconfigurer is None or self._finished.is_set():
            raise ReconfigurationError(f"job '{self.topology.name}' is not running here")
        active = self._reconfigurer.claim(plan, handoff)
        if active is not None:
            await self._reconfigurer.carry_out(active, ready)
        else:
            await ready()

    async def _reconfigure(self, plan: ReconfigurationPlan) -> None:
        """Run ``plan`` in the job's own task group: a caller that gives up waiting (a timeout) leaves it to
        finish, never half done; the job ending cancels it."""
        assert self._reconfigurer is not None
        assert self._outer is not None
        active = self._reconfigurer.claim(plan)
        if active is None:
            return
        over = anyio.Event()

        async def carry_out() -> None:
            assert self._reconfigurer is not None
            try:
                await self._reconfigurer.carry_out(active)
            finally:
                over.set()

        self._outer.start_soon(self._guarded, carry_out, self._outer)  # a failure in it fails the job
        await over.wait()
        if self._reconfigurer.count < plan.id:
            raise ReconfigurationError(
                f"job '{self.topology.name}' stopped during the reconfiguration"
            ) from self._error

    async def settle(self) -> None:
        """Wait until every record sent or read so far has been processed: the topology is idle.

        Idle means every ``QueueSource`` has taken all it was sent, and every
        instance waits for input with its inbox taken and its partial batches
        sent, or has ended (a source other than a ``QueueSource`` must have
        ended). It holds until the next ``send``, or until a timer falls due:
        windows keep their open windows, so with a ``ManualClock`` a test
        sends, settles, advances the clock past a window's end and settles
        again to see the window's result. A task with sync inputs waiting for
        its other ports counts as idle. Returns at once when the job is idle
        or has finished; raises the error that stopped the job, if any.
        Waits on the instances going idle, never polls.

        Only for a job in this process: a placed (cluster) job raises
        :class:`JobError` ("settle() works for in-process jobs").
        """
        self._where.check_settle()
        await self._started.wait()
        while not self._finished.is_set() and not self._idle():
            went_idle = self._went_idle
            if went_idle is None:
                self._went_idle = went_idle = anyio.Event()
                self._env.on_idle = self._instance_idle
            await went_idle.wait()
        if self._error is not None:
            raise self._error

    def _instance_idle(self) -> None:
        went_idle = self._went_idle
        if went_idle is not None:
            self._went_idle = self._env.on_idle = None  # one wake-up per wait: the hot path stays free after
            went_idle.set()

    def _idle(self) -> bool:
        plan = self._plan
        if plan is None:
            return True
        for instance in plan.all():
            if instance.completed:
                continue
            if isinstance(instance, Receiver):
                if not instance.quiet():
                    return False
            elif isinstance(instance, SourceInstance):
                feed = plan.feeds.get(instance.node.name)
                if feed is None or not feed.empty() or not instance.reading():
                    return False
        return True

    # -- feeding and stopping ---------------------------------------------

    async def send(self, source: str, key: Any, value: Any, ts: float | None = None) -> None:
        """Push one record into the ``QueueSource`` called ``source`` (waits while it is full)."""
        feed = self._feed(source)
        await feed.put(Record(key, value, self.clock.now() if ts is None else ts))

    async def close_source(self, source: str) -> None:
        """End the ``QueueSource`` called ``source``; the job drains and finishes."""
        feed = self._feed(source)
        self._closed_feeds.add(source)
        await feed.put(END_OF_FEED)

    async def stop(self) -> None:
        """Stop every source, let what is in flight drain, and wait for the end."""
        await self._started.wait()
        if self._plan is not None and not self._finished.is_set():
            for name in self._plan.feeds:
                if name not in self._closed_feeds:
                    await self.close_source(name)
            for instance in self._plan.sources():
                if instance.node.name not in self._plan.feeds:
                    instance.stop()
        await self._finished.wait()

    def _feed(self, source: str) -> Any:
        if self._plan is None:
            raise JobError(f"job '{self.topology.name}' has not started")
        feed = self._plan.feeds.get(source)
        if feed is None:
            raise JobError(f"job '{self.topology.name}' has no QueueSource called '{source}'")
        if source in self._closed_feeds:
            raise JobError(f"source '{source}' of job '{self.topology.name}' is closed")
        return feed

    # -- reporting ----------------------------------------------------------

    def queue_depths(self) -> dict[tuple[str, int], tuple[int, bool]]:
        """Per receiving instance: items queued in its inbox, and whether the inbox is full."""
        if self._plan is None:
            return {}
        return {
            (i.node.name, i.index): (i.inbox.depth(), i.inbox.full())
            for i in self._plan.all()
            if isinstance(i, Receiver)
        }

    def instance_statistics(self) -> list[InstanceSnapshot]:
        """Every running instance's counters now: records, batches, busy and blocked seconds, queue fill and
        state, latency histogram (cumulative; the rate over a while is the difference of two snapshots).
        Cheap enough to take every second: a few reads per instance."""
        snapshots = []
        for instance in [] if self._plan is None else self._plan.all():
            counters = instance.counters
            inbox = instance.inbox if isinstance(instance, Receiver) else None
            fill = 0.0 if inbox is None else inbox.fill()
            snapshot = InstanceSnapshot(
                instance.node.name, instance.index, instance.node.kind, counters.records_in,
                instance.records_out(), counters.batches, counters.busy, counters.blocked,
                0 if inbox is None else inbox.depth(), fill, queue_state(fill).value, list(counters.latency.counts),
                segment_loads(instance.outputs.routes), counters.shed,
                [] if inbox is None else inbox.queued_by_port(instance.node.inputs), counters.loop_held,
            )  # fmt: skip
            snapshots.append(snapshot)
        return snapshots

    def _attach_shedders(self, plan: PhysicalPlan) -> None:
        qos = self.topology.qos
        if qos is not None:  # every source can shed, at the share the shed policy sets (0 to begin with)
            for instance in plan.all():
                if isinstance(instance, SourceInstance):
                    instance.shedder = Shedder(qos.recover, qos.preserve_order)
                    instance.shedder.ratio = self.shed_ratio  # a share set before the plan was built

    def shed(self, ratio: float) -> None:
        """Shed ``ratio`` (0..the QoS's ``max_shed_ratio``) of every source's records from now on; 0 stops
        shedding (and, with ``recover``, starts the replay of what was held)."""
        qos = self.topology.qos
        if qos is None:
            raise JobError(f"job '{self.topology.name}' has no QoS: topology.set_qos(sl.QoS(...)) lets it shed")
        if not 0 <= ratio <= qos.max_shed_ratio:
            raise JobError(f"shed ratio must be within 0..{qos.max_shed_ratio} (the QoS's max_shed_ratio), not {ratio}")
        self.shed_ratio = ratio
        for instance in [] if self._plan is None else self._plan.all():
            if isinstance(instance, SourceInstance) and instance.shedder is not None:
                instance.shedder.ratio = ratio
                instance.wake()  # a replay starts without waiting for the next read to return

    def segment_loads(self, task: str) -> list[int]:
        """Records sent so far into each key segment of ``task`` (cumulative), over its ``SESSION_TABLE``
        inputs from every sender running here: the load the session-table balancer weighs segments by."""
        table = self.segment_table(task)
        totals = [0] * table.segments
        for instance in [] if self._plan is None else self._plan.all():
            for segment, count in enumerate(segment_loads(instance.outputs.routes).get(task, ())):
                totals[segment] += count
        return totals

    def statistics(self) -> JobStatistics:
        """A snapshot of the job's counters (also while it runs)."""
        plan = self._plan
        nodes: dict[str, NodeStatistics] = {}
        everything = [*plan.all(), *plan.retired] if plan is not None else []
        if plan is not None:
            names = [*plan.instances, *sorted({i.node.name for i in plan.retired} - set(plan.instances))]
            for name in names:  # a node all of whose instances here moved away still counts what they did
                group = [*plan.instances.get(name, []), *(i for i in plan.retired if i.node.name == name)]
                node = group[0].node
                queued = sum(i.inbox.depth() for i in group if isinstance(i, Receiver))
                nodes[name] = NodeStatistics(
                    name, node.kind, node.parallelism,
                    sum(i.counters.records_in for i in group), sum(i.records_out() for i in group), queued,
                    *_held(group), *_looked_up(group),
                )  # fmt: skip
        end = self._ended if self._finished.is_set() else world.monotonic()
        coordinator = self._coordinator
        return JobStatistics(
            job=self.topology.name,
            nodes=nodes,
            dropped=sum(t.flow.dropped for t in plan.trackers) if plan else 0,
            dead_lettered=len(self._env.dead_letters),
            discarded=sum(d.sent for d in plan.discards) if plan else 0,
            late=sum(i.late_records() for i in everything if isinstance(i, TaskInstance)),
            shed=sum(i.counters.shed for i in everything if isinstance(i, SourceInstance)),
            restarts=sum(i.failures for i in everything if isinstance(i, TaskInstance)),
            checkpoints=coordinator.completed if coordinator else 0,
            last_checkpoint=coordinator.last if coordinator else None,
            checkpoint_durations=list(coordinator.durations.counts) if coordinator else [],
            wall_time=end - self._began if self._began else 0.0,
            running=self._started.is_set() and not self._finished.is_set(),
            loop_lag=self._loop_lag.seconds() if self._loop_lag is not None and not self._finished.is_set() else 0.0,
            loop_lag_max=0.0 if self._loop_lag is None else self._loop_lag.worst,
        )

    def _result(self) -> JobResult:
        sinks: dict[str, list[Record]] = {}
        assert self._plan is not None
        for name, group in self._plan.instances.items():
            writers = [i.writer for i in group if isinstance(i, SinkInstance)]
            kept = [w.result() for w in writers]
            if kept and all(r is not None for r in kept):
                sinks[name] = [record for records in kept if records is not None for record in records]
        return JobResult(self.statistics(), list(self._env.dead_letters), sinks)


def _held(group: list[Any]) -> tuple[int, int]:
    """A join's records held now and the sum of its instances' peaks (0, 0 for any other node)."""
    counters = [i.join_counters for i in group if isinstance(i, TaskInstance)]
    return sum(c.held for c in counters), sum(c.peak for c in counters)


def _looked_up(group: list[Any]) -> tuple[int, int]:
    """A lookup join's lookups and cache hits (0, 0 for any other node)."""
    counters = [i.lookup_counters for i in group if isinstance(i, LookupJoinInstance)]
    return sum(c.lookups for c in counters), sum(c.cache_hits for c in counters)


def new_attempt() -> str:
    """A token for one run of a job, unique in practice (12 hex digits)."""
    return world.token_hex(6)


@asynccontextmanager
async def open_job(topology: Topology, **options: Any) -> AsyncIterator[Job]:
    """Run ``topology`` in the background of the current event loop.

    Leaving the block stops the sources, drains and waits; an error inside the
    block cancels the job instead.
    """
    job = Job(topology, **options)
    body_error: BaseException | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(_run_quietly, job)
        await job._started.wait()
        try:
            yield job
        except BaseException as exc:  # noqa: BLE001 - re-raised below, unwrapped from the task group
            body_error = exc
            group.cancel_scope.cancel()
        else:
            await job.stop()
    if body_error is not None:
        raise body_error
    await job.wait()


async def _run_quietly(job: Job) -> None:
    # The error is kept by the job and raised from wait(), not from the task group.
    await job._run_plan()


def _check_whole(name: str, value: Any) -> None:
    if type(value) is not int or value < 1:
        raise JobError(f"{name} must be a whole number >= 1, got {value!r}")


def _loop_warning(seconds: Any) -> float:
    """``loop_warning``: how long one call of user code may hold the event loop before it is reported."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise JobError(f"loop_warning must be a number of seconds above 0, got {seconds!r}")
    return float(seconds)
