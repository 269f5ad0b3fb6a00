"""Per-instance loops: one asyncio task per source, task or sink instance.

A receiving instance takes the next item from its inbox (any channel in
async mode), hands data batches to :meth:`Receiver.process`, and handles
markers: end-of-stream closes a channel, a barrier blocks its channel until
every open channel has delivered the same barrier (alignment), then the
instance snapshots and forwards it. Full output buffers are sent after each
batch; partial ones as soon as the inbox is idle, so batching costs no
latency on a quiet stream.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import structlog

from streamlet.core.model.clock import Clock
from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.constants import SHED
from streamlet.core.model.hooks import maybe_await
from streamlet.core.model.items import Item
from streamlet.core.model.record import (
    Barrier,
    Batch,
    CaughtUp,
    CycleEnd,
    DeadLetter,
    EndOfStream,
    Marker,
    Reconfigure,
    Watermark,
    records_of,
)  # fmt: skip
from streamlet.core.model.sinks import ElementWriter, RestorePoint, SinkContext, WriteFailed, Writer
from streamlet.core.model.sources import SourceContext, SourceReader, read_elements
from streamlet.core.model.state import StateBackend
from streamlet.core.model.watermarks import Watermarks
from streamlet.core.model.world import monotonic
from streamlet.core.runtime.catch_up import InputCatchUp
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.loop_watch import DEFAULT_LOOP_WARNING
from streamlet.core.runtime.outputs import RoutedOutputs
from streamlet.core.runtime.shedding import REPLAY_PATIENCE, Shedder, split_snapshot
from streamlet.core.runtime.statistics import InstanceCounters
from streamlet.core.runtime.watermarks import InputWatermarks, WatermarkGenerator
from streamlet.core.state.participant import Section
from streamlet.errors import NotReplayable, SinkError, SourceError, StreamletError

if TYPE_CHECKING:
    from streamlet.core.model.topology import Node
    from streamlet.core.runtime.cycles import CycleTracker
    from streamlet.core.runtime.offload import ProcessPool
    from streamlet.core.runtime.reconfiguration import ActiveReconfiguration


class CheckpointAcks(Protocol):
    """Where instances report their part of a checkpoint (see ``core.state.checkpoints.Coordinator``)."""

    def ack(self, epoch: int, node: str, index: int, snapshot: Any) -> None:
        """Instance ``(node, index)`` has taken its snapshot for ``epoch``."""
        ...

    async def report_completed(self, instance: Instance, epoch: int | None = None) -> None:
        """``instance`` has completed; it answers pending and later checkpoints with its final snapshot."""
        ...

    def unanswered(self, node: str, index: int) -> list[int]:
        """The checkpoints under way that instance ``(node, index)`` has not answered, oldest first."""
        ...


@dataclass
class Environment:
    """What every instance of one job shares."""

    batch_size: int
    clock: Clock
    dead_letters: list[DeadLetter] = field(default_factory=list)
    checkpoints: CheckpointAcks | None = None
    job_id: str = "local"  # the job, the same in every run (see ``SinkContext``)
    attempt: str = "0"  # this run of the job
    lineage: str | None = None  # what the attempts of one submission share (a cluster's: see ``SinkContext``)
    on_idle: Callable[[], None] | None = None  # set while ``Job.settle`` waits: an instance went idle
    event_time: bool = False  # watermarks flow: the job has event-time windows or sources that declare them
    reconfiguration: ActiveReconfiguration | None = None  # a rescale or segment move under way
    # CPU scheduling: batches an instance takes before letting the others run, by its input queue's fill
    # (``None``: it runs until it waits for input or for room downstream)
    turns: Callable[[float], int] | None = None
    job: str = ""  # the job's name, on every line its instances log
    loop_warning: float = DEFAULT_LOOP_WARNING  # seconds one call of user code may hold the loop unreported
    process_pool: ProcessPool | None = None  # where run_in="process" tasks run (a job with one makes it)
    state_backend: StateBackend | None = None  # where tasks keep keyed state (None: in memory)
    #: Checkpoints may hold what changed in a task's state since the previous one (a store that keeps chunks).
    incremental_checkpoints: bool = False
    yielded: float = 0.0  # monotonic() when an instance last let the loop run others (it waited, or it yielded)


class Instance(ABC):
    """What every instance has: its node, index, counters and outputs."""

    def __init__(self, node: Node, index: int, outputs: RoutedOutputs, env: Environment) -> None:
        self.node = node
        self.index = index
        self.outputs = outputs
        self.env = env
        self.counters = InstanceCounters()
        self.completed = False
        self.log = structlog.get_logger("streamlet").bind(job=env.job, task=node.name, instance=index)

    @abstractmethod
    async def run(self) -> None:
        """Run until the input ends (or the job is cancelled)."""

    def records_out(self) -> int:
        """Records emitted so far."""
        return self.outputs.sent()

    def final_snapshot(self) -> Any:
        """This instance's checkpoint data once it has completed."""
        return None

    # -- what checkpoints need (``core.state.participant``): nothing, unless a kind says otherwise --------

    #: Where this instance's snapshot goes in a checkpoint document (``None``: nowhere).
    section: Section | None = None

    def request_barrier(self, epoch: int) -> None:
        """Only a source injects barriers; the others receive them."""

    def pause(self) -> None:
        """Only a source reads: nothing to pause."""

    async def prepare_commit(self, epoch: int) -> None:
        """Only a sink stages output."""

    async def publish(self, epoch: int) -> None:
        """Only a sink publishes output."""

    async def acknowledge(self, epoch: int, snapshot: Any) -> None:
        """Only a source's reader hears of completed checkpoints."""

    async def close_output(self) -> None:
        """Only a sink has a writer to close."""

    async def restore_output(self, point: RestorePoint | None) -> None:
        """Only a sink restores its output."""

    def restore(self, snapshot: Any) -> None:
        """An instance without a section keeps nothing to restore."""

    def drain(self) -> list[tuple[int, Item]]:
        """Take what is queued for this stopped instance: nothing, unless it has an inbox."""
        return []

    @abstractmethod
    def wake(self) -> None:
        """Get to a batch boundary soon, even when idle (a route switch waits for the next flush)."""

    def _ack(self, epoch: int, snapshot: Any) -> None:
        if self.env.checkpoints is not None:
            self.env.checkpoints.ack(epoch, self.node.name, self.index, snapshot)

    async def _mark_completed(self) -> None:
        self.completed = True
        if self.env.checkpoints is not None:
            await self.env.checkpoints.report_completed(self)


class SourceInstance(Instance):
    """Reads batches from a ``SourceReader`` and emits them downstream."""

    def __init__(
        self, node: Node, index: int, outputs: RoutedOutputs, env: Environment, context: SourceContext
    ) -> None:
        super().__init__(node, index, outputs, env)
        self.context = context
        self.restore_position: Any = None
        self._reader: SourceReader | None = None
        self._position: Any = None
        self._stopping = False
        self._paused = False
        self._barriers: list[int] = []
        self._read_scope: anyio.CancelScope | None = None
        self._wake = anyio.Event()  # set when a paused source has something to do
        self._doing = "to open"  # what the reader was doing, for the message when it fails
        self.watermarks: WatermarkGenerator | None = None  # made with the reader, when the job uses event time
        self._idle = False  # told downstream that it reads nothing (Watermarks(idle_after=...))
        self._idle_due = False  # the idle timer fired while the read waited
        self._flush_due = False  # woken to reach a batch boundary: flush before reading again
        self.shedder: Shedder | None = None  # load shedding (a job with a QoS): its share is set from outside
        self._caught_up = False  # the reader said it caught up, and CAUGHT_UP went downstream

    def stop(self) -> None:
        """End the source early: stop reading, then end the stream downstream."""
        self._stopping = True
        self._interrupt_read()

    def pause(self) -> None:
        """Stop reading without ending the stream. Barriers still go out, so a checkpoint taken after a pause
        holds every record read: a graceful stop resumes from it with nothing read twice."""
        self._paused = True
        self._interrupt_read()

    def request_barrier(self, epoch: int) -> None:
        """Inject ``Barrier(epoch)`` after the batch being read (or at once, if the read waits)."""
        self._barriers.append(epoch)
        self._interrupt_read()

    def wake(self) -> None:
        """Stop waiting in ``read`` for a moment (or do not start to), so pending route switches go out."""
        self._flush_due = True
        self._interrupt_read()

    def reading(self) -> bool:
        """The instance waits in its reader's ``read`` (for a queue: with nothing ready) and has no held
        records to replay."""
        replaying = self.shedder is not None and self.shedder.replaying()
        return self._read_scope is not None and not replaying

    def _interrupt_read(self) -> None:
        self._wake.set()
        if self._read_scope is not None:
            self._read_scope.cancel()

    @property
    def _fed_by_the_program(self) -> bool:
        return self.node.source is not None and self.node.source.fed_by_the_program

    def final_snapshot(self) -> Any:
        """The reader's position when the source ended."""
        return self._position

    section: Section | None = "sources"

    async def acknowledge(self, epoch: int, snapshot: Any) -> None:
        """Checkpoint ``epoch`` is saved with ``snapshot`` (this instance's position): tell the reader."""
        if self._reader is not None:  # the reader is told its own position, never the records held beside it
            await maybe_await(self._reader.checkpoint_complete(epoch, split_snapshot(snapshot)[0]))

    def restore(self, snapshot: Any) -> None:
        """Start reading at the position ``snapshot`` (seeked when the reader opens), and replay the records
        it held back (load shedding with ``recover``) first."""
        self.restore_position, held = split_snapshot(snapshot)
        if self.restore_position is None and not self._fed_by_the_program:
            raise NotReplayable.of(self.node.name, self.index)  # read again from its start, it would count twice
        if held:
            if self.shedder is None:
                self.shedder = Shedder(recover=True, preserve_order=True)
            self.shedder.held.extend(held)

    async def run(self) -> None:
        """Read until the source is exhausted or stopped, then send end-of-stream."""
        try:
            await self._read_all()
        except StreamletError:
            raise  # ours (a connector's, the transport's): it says what failed already
        except Exception as exc:
            raise self._error(exc) from exc
        await self._mark_completed()
        await self.outputs.end()

    async def _read_all(self) -> None:
        assert self.node.source is not None
        self._doing = "to open"
        self._reader = reader = self.node.source.open(self.context)
        try:
            if self.restore_position is not None:
                self._doing = "to seek"
                await reader.seek(self.restore_position)
            self._position = reader.position()
            if (
                self._position is None
                and self.env.checkpoints is not None
                and self.index == 0
                and not self._fed_by_the_program
            ):
                self.log.warning(
                    "source cannot be replayed: this job will not be able to resume from its checkpoints",
                    source=self.node.name,
                )
            self._doing = "reading"
            if self.env.event_time:
                self.watermarks = WatermarkGenerator(self.node.watermarks or Watermarks(), reader)
            await self._pump(reader)
            await self._replay_all()  # stopped early: what was held back still goes downstream
            await self._inject_barriers(reader)
            self._doing = "closing"
        finally:
            await reader.aclose()

    def _error(self, exc: Exception) -> SourceError:
        position = self._position
        if self._reader is not None:
            with suppress(Exception):  # the reader failed: its position may fail too, then the last one known
                position = self._reader.position()
        at = "" if position is None else f" at position {position!r}"
        return SourceError(
            f"{self.node.describe()} instance {self.index} failed {self._doing}{at}: {type(exc).__name__}: {exc}",
            source=self.node.name, instance=self.index, position=position,
        )  # fmt: skip

    async def _pump(self, reader: SourceReader) -> None:
        outputs, size = self.outputs, self.env.batch_size
        idle_after = None if self.watermarks is None else (self.node.watermarks or Watermarks()).idle_after
        last_data = self.env.clock.now()
        while not self._stopping:
            if self._paused:
                await self._inject_barriers(reader)
                await outputs.flush()  # a route switch asked for meanwhile goes out now
                self._flush_due = False
                await self._wake.wait()
                self._wake = anyio.Event()
                continue
            if self._flush_due:
                self._flush_due = False
                await outputs.flush()  # a route switch asked for meanwhile goes out before the next read
            if not self._caught_up and reader.caught_up():
                self._caught_up = True
                await outputs.forward_caught_up()  # after every record read so far
            on_idle = self.env.on_idle
            if on_idle is not None:
                on_idle()  # ``settle`` looks once this task waits (here: in read, when nothing is ready)
            began = monotonic()
            shedder = self.shedder
            batch: Batch | ColumnBatch | None
            if shedder is not None and shedder.preserve_order and shedder.replaying():
                batch, cancelled = shedder.take_held(size), False  # held records go before any newer one
            else:
                replaying = shedder is not None and shedder.replaying()  # then a quiet read must not stall it
                patience = REPLAY_PATIENCE if replaying else None
                batch, cancelled = await self._read(reader, size, idle_after, last_data, patience)
                if batch:
                    self.counters.count_in(len(batch))
                    if shedder is not None and not isinstance(batch, ColumnBatch):  # a columnar source is not shed
                        batch = await self._shed(shedder, batch, size)
                elif replaying and shedder is not None and (batch is not None or cancelled):
                    batch = shedder.take_held(size)
            if batch:
                read = monotonic()
                if isinstance(batch, ColumnBatch):
                    outputs.emit_columns(batch)
                else:
                    outputs.emit_elements(batch)
                await outputs.flush()
                count_batch(self.counters, read, began, read, monotonic())
                if self.watermarks is not None:
                    last_data = self.env.clock.now()
                    await self._send_watermark(batch)
            elif batch is None and not cancelled:
                await self._replay_all()
                return
            elif self._idle_due:
                self._idle_due, self._idle = False, True
                await outputs.forward_watermark(Watermark(-math.inf, idle=True))
            if self._barriers:
                await self._inject_barriers(reader)

    async def _read(
        self, reader: SourceReader, size: int, idle_after: float | None, last_data: float, patience: float | None
    ) -> tuple[Batch | ColumnBatch | None, bool]:
        """One read: (the batch, whether it was interrupted); only the read is cancellable, sends never are.
        With ``patience``, a read that waits longer than that many seconds is interrupted too."""
        timer = None
        if idle_after is not None and not self._idle:  # quiet that long since the last batch: idle
            timer = self.env.clock.call_at(last_data + idle_after, self._idle_timer_fired)
        batch: Any = None
        try:
            with anyio.CancelScope() as scope:
                if patience is not None:
                    scope.deadline = anyio.current_time() + patience
                self._read_scope = scope
                read: Any = await reader.read(size)
                if read and type(read) is not ColumnBatch and not reader.gives_elements:
                    read = read_elements(read, self.env.clock.now())  # records, pairs, values: elements
                batch = read
        finally:
            if timer is not None:
                timer.cancel()
            self._read_scope = None
        return batch, scope.cancelled_caught

    async def _shed(self, shedder: Shedder, batch: Batch, size: int) -> Batch:
        """What is left of ``batch`` to emit: the shed share held back or sent to the SHED port, and (replaying,
        order not kept) some held records mixed in."""
        kept, shed = shedder.split(batch)
        if shed:
            self.counters.shed += len(shed)
            if shedder.recover:
                shedder.held.extend(shed)
            elif self.outputs.connected(SHED):
                self.outputs.emit_elements(shed, port=SHED)
                await self.outputs.flush()  # now: at a ratio of 1 nothing else would send them on
        if shedder.replaying():
            kept.extend(shedder.take_held(size))
        return kept

    async def _replay_all(self) -> None:
        """The source ended: records still held go out now (the load that made them wait is over)."""
        shedder = self.shedder
        while shedder is not None and shedder.held:
            self.outputs.emit_elements(shedder.take_held(self.env.batch_size))
            await self.outputs.flush()

    def _idle_timer_fired(self) -> None:
        self._idle_due = True
        self._interrupt_read()

    async def _send_watermark(self, batch: Batch | ColumnBatch) -> None:
        """After a batch: the watermark if it rose (or to say this instance reads again after being idle)."""
        generator = self.watermarks
        assert generator is not None
        if isinstance(batch, ColumnBatch):  # its reader tracks event time: elements only for a user's function
            batch = batch.elements() if generator.fn is not None else []
        regressions = generator.regressions
        watermark = generator.after_batch(batch)
        if generator.regressions and not regressions:
            self.log.warning("watermark went back: ignored", watermark=generator.current)
        if watermark is None and self._idle:
            watermark = generator.current
        if watermark is not None:
            self._idle = False
            await self.outputs.forward_watermark(Watermark(watermark))

    async def _inject_barriers(self, reader: SourceReader) -> None:
        self._position = reader.position()
        while self._barriers:
            epoch = self._barriers.pop(0)
            shedder = self.shedder
            self._ack(epoch, self._position if shedder is None else shedder.snapshot(self._position))
            await self.outputs.flush()
            await self.outputs.broadcast(Barrier(epoch))


class Receiver(Instance):
    """An instance with an inbox: counts open channels per port until all have ended."""

    def __init__(self, node: Node, index: int, outputs: RoutedOutputs, env: Environment, inbox: Inbox) -> None:
        super().__init__(node, index, outputs, env)
        self.inbox = inbox
        self.channel_open = [True] * inbox.channel_count
        self.port_channels = [inbox.ports.count(port) for port in range(node.inputs)]
        self.open_ports = sum(1 for count in self.port_channels if count > 0)
        self.blocked = [False] * inbox.channel_count
        self.aligning: int | None = None
        self.cycle: CycleTracker | None = None
        self.watermarks = InputWatermarks(inbox.channel_count, inbox.loop_channels)
        self.catch_up = InputCatchUp(inbox.ports, inbox.loop_channels)
        #: Channels this instance holds back by its own choice (``hold_port``), apart from alignment: blocked
        #: except while a checkpoint or a reconfiguration aligns (its markers must get through).
        self.held_channels: set[int] = set()
        self._told_idle = False  # forwarded that every input is idle
        # a reconfiguration aligning here: its marker, and the channels it must arrive on (or end)
        self._reconfiguring: tuple[Reconfigure, set[int]] | None = None
        self.retired = False  # a rescale took this instance out: it handed its state over and ends

    def add_channel(self, port: int, sender: tuple[str, int], *, held: bool = False) -> int:
        """A channel from ``sender`` into ``port`` wired in while running (a rescale added the sender).

        ``held``: nothing is taken from it until the reconfiguration under way
        has aligned here (so results from after a move wait for those before).
        """
        channel = self.inbox.add_channel(port, sender=sender)
        self.channel_open.append(True)
        self.blocked.append(held)
        if self.port_channels[port] == 0:
            self.open_ports += 1
        self.port_channels[port] += 1
        self.watermarks.add_channel()
        self.catch_up.add_channel(port)
        self.channels_changed()
        return channel

    def channels_changed(self) -> None:
        """Channels were added: recompute what is derived from them."""

    def wake(self) -> None:
        """Leave the idle wait: pending route switches go out with the next flush."""
        self.inbox.wake()

    def drain(self) -> list[tuple[int, Item]]:
        """Take every item still queued in the inbox as ``(channel, item)``, channel by channel, oldest first.

        With :meth:`snapshot` it is all a stopped instance holds: what moving it elsewhere hands over
        (the channel says which sender and input port an item came from, so the new home keeps the order
        and the barrier alignment per sender). Senders waiting for room are woken as items are taken.
        """
        inbox = self.inbox
        return [
            (channel, inbox.pop(channel))
            for channel in range(inbox.channel_count)
            for _ in range(inbox.queued(channel))
        ]

    # -- the loop -------------------------------------------------------------

    async def run(self) -> None:
        """Process the inbox in async mode (any channel with data) until every port ended."""
        await self.open()
        inbox, outputs, blocked = self.inbox, self.outputs, self.blocked
        ports = inbox.ports
        counters, size, cycle = self.counters, self.env.batch_size, self.cycle
        watermarks = self.watermarks
        start = taken = budget = 0
        turns = self.env.turns
        while self.open_ports:
            channels = len(blocked)  # read each time: a rescale may add channels
            channel = -1
            for offset in range(channels):
                candidate = (start + offset) % channels
                if not blocked[candidate] and not inbox.is_empty(candidate):
                    channel = candidate
                    break
            if channel < 0:
                taken = 0  # waiting for input ends the turn
                await self.idle()
                continue
            start = channel + 1
            if turns is not None and taken == 0:
                budget = turns(inbox.fill())  # a turn's length is set by the queue as the turn begins
            item = inbox.pop(channel)
            if type(item) is list or type(item) is ColumnBatch:  # a columnar batch reaches columnar nodes only
                arrived, began = inbox.last_arrival, monotonic()
                counters.count_in(len(item))
                if watermarks.any_idle:  # an idle sender speaks again: it holds the watermark back from now on
                    watermarks.activate(channel)
                if cycle is None:
                    await self.process(ports[channel], item)
                    processed = monotonic()
                    await outputs.flush(size)
                else:
                    assert type(item) is list  # columnar nodes are never inside a cycle
                    for iteration, run in _runs_by_iteration(item):
                        outputs.iteration = iteration  # what the task emits inherits the loop count
                        await self.process(ports[channel], run)
                    processed = monotonic()
                    await outputs.flush()  # inside a loop nothing may linger, or the loop looks idle
                    cycle.batches_done(1)
                count_batch(counters, arrived, began, processed, monotonic())
                if turns is not None:
                    taken += 1
                    if taken >= budget:
                        taken = 0
                        await asyncio.sleep(0)  # the turn is over: every other ready instance runs first
                        self.env.yielded = monotonic()
            else:
                await self.on_marker(channel, item)  # type: ignore[arg-type]
        await self.complete()

    async def idle(self) -> None:
        """Nothing to take: send partial batches, then sleep until data or the next timer."""
        await self.outputs.flush()
        if not self.has_work():
            on_idle = self.env.on_idle
            if on_idle is not None:
                on_idle()  # ``settle`` looks once this task waits in the inbox below
            deadline = self.next_deadline()
            timer = None if deadline is None else self.env.clock.call_at(deadline, self.inbox.wake)
            try:
                await self.inbox.wait()
            finally:
                if timer is not None:
                    timer.cancel()
            self.env.yielded = monotonic()  # it waited: the loop ran the others meanwhile
        await self.on_time()

    def quiet(self) -> bool:
        """It waits for input with nothing under way (what ``Job.settle`` waits for)."""
        return self.inbox.waiting()

    def has_work(self) -> bool:
        """Some unblocked channel holds an item."""
        inbox = self.inbox
        return any(not self.blocked[c] and not inbox.is_empty(c) for c in range(inbox.channel_count))

    # -- markers --------------------------------------------------------------

    async def on_marker(self, channel: int, marker: Marker) -> None:
        """End-of-stream and a loop's end close the channel; a barrier blocks it until aligned."""
        if isinstance(marker, Watermark):
            await self._on_watermark_marker(channel, marker)
            return
        if isinstance(marker, CaughtUp):
            await self._caught_up_on(channel)
            return
        if isinstance(marker, EndOfStream | CycleEnd):
            if isinstance(marker, EndOfStream) and self.cycle is not None:
                self.cycle.external_ended()
            self._close_channel(channel)
            if self.env.event_time:
                risen = self.watermarks.close(channel)
                if risen is not None:
                    await self.on_watermark(risen)
            await self._caught_up_on(channel)  # an ended channel holds nothing back
        elif isinstance(marker, Barrier):
            self._open_held()
            self.blocked[channel] = True
            self.aligning = marker.epoch
        elif isinstance(marker, Reconfigure):
            self._open_held()
            if self._reconfiguring is None:
                self._reconfiguring = (marker, self._reconfigure_channels(marker))
            self.blocked[channel] = True
        await self._check_alignment()

    def _reconfigure_channels(self, marker: Reconfigure) -> set[int]:
        """Where ``marker`` will arrive: every channel into the reconfigured task itself; downstream of it,
        the channels from its instances that existed before (new ones are held until aligned)."""
        if marker.task == self.node.name:
            return set(range(self.inbox.channel_count))
        return {  # a channel held already comes from a new instance (or a relocated one's new incarnation)
            channel
            for channel, (node, index) in enumerate(self.inbox.senders)
            if node == marker.task and index < marker.senders and not self.blocked[channel]
        }

    async def _on_watermark_marker(self, channel: int, marker: Watermark) -> None:
        watermarks = self.watermarks
        risen = watermarks.update(channel, marker.ts, marker.idle)
        if risen is not None:
            self._told_idle = False
            await self.on_watermark(risen)
        elif watermarks.all_idle():
            if not self._told_idle:
                self._told_idle = True
                await self.outputs.forward_watermark(Watermark(-math.inf, idle=True))
        elif self._told_idle:  # an input speaks again: so does this instance, even if its watermark stayed
            self._told_idle = False
            await self.outputs.forward_watermark(Watermark(watermarks.current))

    async def on_watermark(self, watermark: float) -> None:
        """The input's watermark rose to ``watermark``: pass it on after what was emitted before it."""
        await self.outputs.forward_watermark(Watermark(watermark))

    # -- catching up, and channels held back ------------------------------------------

    async def _caught_up_on(self, channel: int) -> None:
        port, everything = self.catch_up.arrived(channel)
        if port is not None:
            await self.on_port_caught_up(port)
        if everything and self.open_ports:  # once all ended, end-of-stream says more
            await self.forward_caught_up()

    async def on_port_caught_up(self, port: int) -> None:
        """Every channel into ``port`` has caught up with its sources or ended."""

    async def forward_caught_up(self) -> None:
        """Every input caught up: say so downstream, after everything emitted before."""
        await self.outputs.forward_caught_up()

    def hold_port(self, port: int) -> None:
        """Take nothing more from ``port`` (its senders wait once its channels are full) until
        :meth:`release_port`; a checkpoint's or a reconfiguration's alignment still reads up to its markers."""
        aligning = self.aligning is not None or self._reconfiguring is not None
        for channel, its_port in enumerate(self.inbox.ports):
            if its_port == port and self.channel_open[channel] and channel not in self.held_channels:
                self.held_channels.add(channel)
                if not aligning:
                    self.blocked[channel] = True

    def release_port(self, port: int) -> None:
        """Take from ``port`` again."""
        aligning = self.aligning is not None or self._reconfiguring is not None
        for channel in [c for c in self.held_channels if self.inbox.ports[c] == port]:
            self.held_channels.discard(channel)
            if not aligning:  # while aligning, a held channel is open already (or blocked by its marker)
                self.blocked[channel] = False

    def _open_held(self) -> None:
        """An alignment begins: its markers must get through the held channels."""
        if self.held_channels and self.aligning is None and self._reconfiguring is None:
            for channel in self.held_channels:
                self.blocked[channel] = False

    def _hold_again(self) -> None:
        """An alignment ended (everything unblocked): the held channels are held again."""
        if self.aligning is None and self._reconfiguring is None:
            for channel in self.held_channels:
                self.blocked[channel] = True

    def _close_channel(self, channel: int) -> None:
        self.channel_open[channel] = False
        port = self.inbox.ports[channel]
        self.port_channels[port] -= 1
        if self.port_channels[port] == 0:
            self.open_ports -= 1

    async def _check_alignment(self) -> None:
        if self._reconfiguring is not None:
            marker, channels = self._reconfiguring
            if all(self.blocked[c] or not self.channel_open[c] for c in channels):
                self._reconfiguring = None
                await self.on_reconfigure(marker)  # held channels stay held until the state is in place
                self.blocked[:] = [False] * len(self.blocked)
                self._hold_again()
            return
        epoch = self.aligning
        if epoch is None:
            return
        if all(self.blocked[c] or not self.channel_open[c] for c in range(self.inbox.channel_count)):
            self.aligning = None
            self.blocked[:] = [False] * len(self.blocked)
            self._hold_again()
            await self.on_aligned(epoch)

    # -- hooks ------------------------------------------------------------------

    async def open(self) -> None:
        """Before the first item (prepare, restore)."""

    @abstractmethod
    async def process(self, port: int, batch: Batch | ColumnBatch) -> None:
        """Handle one data batch from ``port`` (a columnar one only where the node is columnar)."""

    async def on_aligned(self, epoch: int) -> None:
        """Every open channel delivered ``Barrier(epoch)``: snapshot, then pass it on."""
        self._ack(epoch, self.final_snapshot())
        await self.outputs.flush()
        await self.outputs.broadcast(Barrier(epoch))

    async def on_reconfigure(self, marker: Reconfigure) -> None:
        """Downstream of a reconfigured task: aligned, so what its instances sent before the change is in."""
        self._reconfigured()

    def _reconfigured(self) -> None:
        active = self.env.reconfiguration
        if active is not None:
            active.done(self.node.name, self.index)

    def next_deadline(self) -> float | None:
        """When :meth:`on_time` next has work (clock time), if ever."""
        return None

    async def on_time(self) -> None:
        """Woken from idle: do what fell due by the clock."""

    async def complete(self) -> None:
        """Every input has ended."""
        await self._mark_completed()
        await self.outputs.end()


class SinkInstance(Receiver):
    """Hands every batch to its writer: records to a ``SinkWriter``, elements to an ``ElementWriter``."""

    def __init__(self, node: Node, index: int, outputs: RoutedOutputs, env: Environment, inbox: Inbox) -> None:
        super().__init__(node, index, outputs, env, inbox)
        assert node.sink is not None
        context = SinkContext(node.name, index, node.parallelism, env.job_id, env.attempt, env.lineage)
        with self._failing("to open"):
            self.writer: Writer = node.sink.open(context)
        self._async = inspect.iscoroutinefunction(self.writer.write)
        self._elements = isinstance(self.writer, ElementWriter)
        self.section: Section | None = "sinks" if self.writer.keeps_output else None

    async def process(self, port: int, batch: Batch | ColumnBatch) -> None:
        """Write the batch."""
        if isinstance(batch, ColumnBatch):  # only a sink that takes columns gets one
            await self._write_columns(batch)
            return
        try:
            records: Any = batch if self._elements else records_of(batch)
            if self._async:
                await self.writer.write(records)
            else:
                self.writer.write(records)
        except StreamletError:
            raise  # a connector's own error says what failed already
        except WriteFailed as failed:
            key = failed.record.key
            raise self._error(f"writing the record with key {key!r}", failed.__cause__, key) from failed.__cause__
        except Exception as exc:
            key = batch[0][0] if batch else None
            what = f"a batch of {len(batch)} records starting with key" if len(batch) > 1 else "the record with key"
            raise self._error(f"writing {what} {key!r}", exc, key) from exc

    async def _write_columns(self, batch: ColumnBatch) -> None:
        try:
            await maybe_await(self.writer.write_columns(batch))
        except StreamletError:
            raise
        except Exception as exc:
            raise self._error(f"writing a columnar batch of {len(batch)} rows", exc) from exc

    async def on_watermark(self, watermark: float) -> None:
        """A sink has nobody to pass watermarks to."""

    async def on_aligned(self, epoch: int) -> None:
        """Stage what was written since the last barrier under ``epoch`` (a writer that keeps its output: that
        output is this instance's part of the checkpoint)."""
        await self.prepare_commit(epoch)
        self._ack(epoch, self.final_snapshot())

    def final_snapshot(self) -> Any:
        """What a writer that keeps its output holds now (``None`` for the others: theirs is staged outside)."""
        if self.section is None:
            return None
        with self._failing("to snapshot its output"):
            return self.writer.snapshot()

    def restore(self, snapshot: Any) -> None:
        """A writer that keeps its output takes back what it held at the checkpoint."""
        if snapshot is not None:
            with self._failing("to restore its output"):
                self.writer.restore_snapshot(snapshot)

    async def prepare_commit(self, epoch: int) -> None:
        """Let a transactional writer stage ``epoch``."""
        with self._failing(f"to stage checkpoint {epoch}"):
            await maybe_await(self.writer.prepare_commit(epoch))

    async def complete(self) -> None:
        """Close the writer, unless a checkpoint still has to commit what it holds."""
        await self._mark_completed()
        if self.env.checkpoints is None:
            await self.close_output()

    async def publish(self, epoch: int) -> None:
        """Checkpoint ``epoch`` is complete: the writer publishes what it staged under it."""
        await maybe_await(self.writer.commit(epoch))

    async def close_output(self) -> None:
        """Close the writer."""
        with self._failing("to close"):
            await maybe_await(self.writer.close())

    async def restore_output(self, point: RestorePoint | None) -> None:
        """Tell the writer which checkpoint the job resumes from (``None``: a fresh start)."""
        await maybe_await(self.writer.restore(point))

    @contextmanager
    def _failing(self, doing: str) -> Iterator[None]:
        try:
            yield
        except StreamletError:
            raise
        except Exception as exc:
            raise self._error(doing, exc) from exc

    def _error(self, doing: str, exc: BaseException | None, key: object = None) -> SinkError:
        return SinkError(
            f"{self.node.describe()} instance {self.index} failed {doing}: {type(exc).__name__}: {exc}",
            sink=self.node.name, instance=self.index, key=key,
        )  # fmt: skip


def count_batch(counters: InstanceCounters, arrived: float, began: float, processed: float, sent: float) -> None:
    """One batch in the counters: processing from ``began`` to ``processed`` is busy time, sending it on until
    ``sent`` is time blocked by backpressure, and its latency runs from its arrival to ``processed``."""
    counters.batches += 1
    counters.busy += processed - began
    counters.blocked += sent - processed
    counters.latency.add(processed - arrived)


def _runs_by_iteration(batch: Batch) -> list[tuple[int, Batch]]:
    runs: list[tuple[int, Batch]] = []
    for element in batch:
        iteration = element[3] if len(element) > 3 else 0
        if runs and runs[-1][0] == iteration:
            runs[-1][1].append(element)
        else:
            runs.append((iteration, [element]))
    return runs
