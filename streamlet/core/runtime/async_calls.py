"""The instance of a ``map_async`` task: calls in flight while it takes more input (Flink's Async I/O).

Every record taken becomes an entry in one queue, in input order; a
watermark that reaches the instance while entries are queued becomes an entry
too. Up to ``concurrency`` calls run at a time, as tasks of the instance's own
task group; each wakes the loop through the inbox when it completes. The loop
emits what is ready: ordered, the done entries at the head of the queue;
unordered, any done entry with no watermark entry before it. A watermark
entry leaves (is forwarded) once every entry before it has left, so a result
never overtakes a watermark that followed its record.

Backpressure: with ``concurrency`` data entries queued the instance takes no
data batch, only markers at a channel's head, and data in a channel holding a
barrier or while a barrier aligns (that data is ahead of the barrier: taken,
held uncalled, so a checkpoint never waits for calls). A checkpoint stores the
entries: records not called or in flight (called again after a restore) and
answers held back by order. A live rescale of the task waits for every call
(the entries leave before the state moves); a restore with another layout
splits the stored entries by key (``core.state.regroup``).
"""

from __future__ import annotations

import inspect
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from streamlet.core.model.async_calls import MapAsyncTask
from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.model.lookups import LookupJoinTask
from streamlet.core.model.record import Barrier, Batch, Element, Reconfigure, record_of
from streamlet.core.model.world import monotonic
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.instances import Environment, Receiver, count_batch
from streamlet.core.runtime.outputs import RoutedOutputs
from streamlet.core.runtime.task_instance import TaskInstance
from streamlet.errors import TopologyError

if TYPE_CHECKING:
    from streamlet.core.model.columns import ColumnBatch
    from streamlet.core.model.topology import Node

UNCALLED, CALLING, DONE, EMITTED = range(4)


class Call:
    """One record's entry: its element, where its call is, and the answer or error."""

    __slots__ = ("element", "error", "result", "segment", "state")

    def __init__(self, element: Element, segment: int) -> None:
        self.element = element
        self.state = UNCALLED
        self.result: Any = None
        self.error: BaseException | None = None
        self.segment = segment  # watermark entries queued before it (unordered: it waits for those)


class HeldWatermark:
    """A watermark queued behind entries: forwarded once they have all left (``None``: ``CAUGHT_UP``, which
    waits the same way)."""

    __slots__ = ("watermark",)

    def __init__(self, watermark: float | None) -> None:
        self.watermark = watermark


class MapAsyncInstance(TaskInstance):
    """Runs a :class:`~streamlet.core.model.async_calls.MapAsyncTask` with calls in flight."""

    def __init__(self, node: Node, index: int, outputs: RoutedOutputs, env: Environment, inbox: Inbox) -> None:
        super().__init__(node, index, outputs, env, inbox)
        task = self.task
        assert isinstance(task, MapAsyncTask | LookupJoinTask)  # a lookup join's calls are lookups, in order
        self.concurrency, self.ordered, self.timeout = task.concurrency, task.ordered, task.timeout
        self.queue: deque[Any] = deque()  # Calls and HeldWatermarks (a lookup join's: batches and watermarks)
        self.uncalled: deque[Call] = deque()
        self.finished_calls: list[Any] = []  # completed since the loop last looked (calls, or lookups)
        self.held: dict[int, list[Call]] = {}  # unordered: answers waiting for a watermark before them to leave
        self.entries = 0  # data entries not yet emitted (what concurrency and backpressure count)
        self.calling = 0
        self.segment = self.tail_segment = 0
        self.start = 0  # the channel to look at first
        self.group: anyio.abc.TaskGroup | None = None
        #: Every input ended, the calls in flight still finishing: no barrier comes from upstream any more,
        #: so a checkpoint asks this instance itself (``requested``), answered between two answers.
        self.finishing = False
        self.requested: deque[int] = deque()

    # -- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        """Take input while calls run; end once every input ended and every entry has left."""
        await self.take_handover()
        await self.open()
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            self.group = group
            try:
                await self._loop()
                self._finishing()
                await self.finish_calls()
                self.requested.clear()  # completed: a checkpoint still asking has the final snapshot
            except Exception as exc:  # noqa: BLE001 - raised as it is, not in an exception group
                failure = exc
                group.cancel_scope.cancel()  # the calls still in flight are abandoned
        self.group = None
        if failure is not None:
            raise failure
        await self.complete()

    async def _loop(self) -> None:
        inbox = self.inbox
        while self.open_ports:
            await self._step()
            channel = self._next_channel()
            if channel < 0:
                await self._wait()
                continue
            self.start = channel + 1  # the channels take turns
            item = inbox.pop(channel)
            if type(item) is list:
                began = monotonic()
                self.counters.count_in(len(item))
                if self.watermarks.any_idle:
                    self.watermarks.activate(channel)
                self._take(item)
                taken = monotonic()  # the calls run apart: busy is the taking, latency until the calls began
                count_batch(self.counters, inbox.last_arrival, began, taken, taken)
            else:
                await self.on_marker(channel, item)  # type: ignore[arg-type]

    def _next_channel(self) -> int:
        """An unblocked channel to take from: any with an item, or, when full, one whose head is a marker or
        whose data is ahead of a barrier; -1 if none."""
        inbox, blocked = self.inbox, self.blocked
        full = self._full()
        channels = len(blocked)
        for offset in range(channels):
            channel = (self.start + offset) % channels
            if blocked[channel] or inbox.is_empty(channel):
                continue
            if not full or type(inbox.head(channel)) is not list:
                return channel
            if self.aligning is not None or inbox.holds(channel, Barrier):
                return channel  # ahead of a barrier: taken and held uncalled, so the checkpoint goes on
        return -1

    def _full(self) -> bool:
        """Whether the instance takes no more data (barriers aside): ``concurrency`` records not yet emitted."""
        return self.entries >= self.concurrency

    async def _wait(self) -> None:
        """Nothing to take: send partial batches, then sleep until input arrives or a call completes."""
        await self.outputs.flush()
        if self.finished_calls or self._next_channel() >= 0:
            return  # something came while the flush waited
        if not self.entries:
            on_idle = self.env.on_idle
            if on_idle is not None:
                on_idle()  # settle() looks once this task waits with no call in flight
        await self.inbox.wait()

    def quiet(self) -> bool:
        """Waiting for input with no entry left: what ``Job.settle`` waits for."""
        return self.inbox.waiting() and not self.entries

    def _take(self, batch: Batch) -> None:
        """Queue every record of ``batch`` and start the calls there is room for."""
        segment = self.tail_segment
        for element in batch:
            call = Call(element, segment)
            self.queue.append(call)
            self.uncalled.append(call)
        self.entries += len(batch)
        self._start_calls()

    def _start_calls(self) -> None:
        group = self.group
        if group is None:
            return  # not running yet (restored): the loop starts them
        while self.uncalled and self.calling < self.concurrency:
            call = self.uncalled.popleft()
            call.state = CALLING
            self.calling += 1
            group.start_soon(self._run_call, call)

    async def _run_call(self, call: Call) -> None:
        """One call of the task's function; its answer or error is handled by the loop."""
        fn = self.task.fn  # type: ignore[attr-defined]  # a MapAsyncTask (a restart makes a new one)
        try:
            record = record_of(call.element)
            if self.timeout is None:
                call.result = await self._awaitable(fn(record))
            else:  # real time (the event loop's clock): a call's budget, not the job clock windows use
                with anyio.move_on_after(self.timeout) as scope:
                    call.result = await self._awaitable(fn(record))
                if scope.cancelled_caught:
                    call.error = TimeoutError(f"the call took longer than timeout={self.timeout!r} seconds")
        except Exception as exc:  # noqa: BLE001 - user code: the loop applies the policy
            call.error = exc
        self.calling -= 1
        self.finished_calls.append(call)  # still CALLING: done once the loop has checked the answer
        self._start_calls()  # the next record's call starts now, not once the loop comes round
        self.inbox.wake()

    def _awaitable(self, pending: Any) -> Any:
        """What ``fn`` returned, when it can be awaited; else the wiring mistake, which no policy applies to."""
        if not inspect.isawaitable(pending):
            raise TopologyError(
                f"task '{self.node.name}': map_async's fn must be an async def function (or return an awaitable); "
                f"fn(record) returned {type(pending).__name__}"
            )
        return pending

    async def _step(self) -> None:
        """Handle the calls that completed, start the next ones, emit what is ready."""
        if self.finished_calls:
            finished, self.finished_calls = self.finished_calls, []
            for call in finished:
                self._answered(call)
        self._start_calls()
        await self._emit_ready()

    def _answered(self, call: Any) -> None:
        """A completed call: its error to the policy (again: back to the front of the uncalled), or its
        answer checked and, unordered, emitted when no watermark waits before it."""
        error = call.error
        if isinstance(error, TopologyError):
            raise error  # a wiring mistake, not a record's: the job fails whatever the policy
        if error is None and not _valid(call.result):
            error = TypeError(f"the map_async function must return a (key, value) pair or None, got {call.result!r}")
        if error is not None:
            call.error = call.result = None
            if self.policy.failed(self, call.element, error, "record with key"):
                call.state = UNCALLED
                self.uncalled.appendleft(call)
                return
        call.state = DONE
        if self.ordered:
            return
        if call.segment == self.segment:
            self._emit(call)
        else:
            self.held.setdefault(call.segment, []).append(call)

    def _emit(self, call: Call) -> None:
        result = call.result
        if result is not None:
            key, value = result
            self.outputs.emit(key, value, ts=call.element[2])
        call.state = EMITTED
        call.result = None
        self.entries -= 1

    async def _emit_ready(self) -> None:
        """Take what has left off the head of the queue: emitted answers, ordered done ones, watermarks whose
        entries before them all left."""
        queue, ordered = self.queue, self.ordered
        while queue:
            head = queue[0]
            if type(head) is HeldWatermark:
                queue.popleft()
                self.segment += 1
                for call in self.held.pop(self.segment, []):
                    self._emit(call)
                if head.watermark is None:
                    await Receiver.forward_caught_up(self)
                else:
                    await Receiver.on_watermark(self, head.watermark)
            elif head.state == EMITTED:
                queue.popleft()
            elif ordered and head.state == DONE:
                queue.popleft()
                self._emit(head)
            else:
                break
        await self.outputs.flush(self.env.batch_size)

    async def finish_calls(self) -> None:
        """Wait for every call and emit every answer (the input ended, or the task's keys move)."""
        while self.queue:
            await self._step()
            if not self.queue:
                break
            while self.requested:
                await self.on_aligned(self.requested.popleft())
            await self.outputs.flush()
            if not self.finished_calls and not self.requested:
                await self.inbox.wait()
        await self.outputs.flush()

    def _finishing(self) -> None:
        """Every input ended: from now on this instance answers checkpoints itself, those under way too
        (begun before its input ended, their barrier never came)."""
        self.finishing = True
        if self.env.checkpoints is not None:
            self.requested.extend(self.env.checkpoints.unanswered(self.node.name, self.index))

    def request_barrier(self, epoch: int) -> None:
        """A checkpoint begins: once every input has ended (no barrier will come), this instance takes it as
        if aligned, with the calls still in flight stored as uncalled, and passes the barrier on; otherwise
        the barrier comes from upstream as usual."""
        if self.finishing:
            self.requested.append(epoch)
            self.inbox.wake()

    # -- markers ------------------------------------------------------------------

    async def on_watermark(self, watermark: float) -> None:
        """Forwarded at once with nothing queued, else queued behind the entries before it."""
        if not self.queue:
            await Receiver.on_watermark(self, watermark)
            return
        self.queue.append(HeldWatermark(watermark))
        self.tail_segment += 1

    async def forward_caught_up(self) -> None:
        """Forwarded at once with nothing queued, else queued behind the entries before it (as a watermark):
        what a source read before it caught up is downstream before the marker. (Not kept in a snapshot: the
        sources say it again after a restore.)"""
        if not self.queue:
            await super().forward_caught_up()
            return
        self.queue.append(HeldWatermark(None))
        self.tail_segment += 1

    async def on_aligned(self, epoch: int) -> None:
        """Emit what is ready, then snapshot the entries left with the rest and pass the barrier on."""
        await self._step()
        await super().on_aligned(epoch)

    async def on_reconfigure(self, marker: Reconfigure) -> None:
        """A rescale of this task: every call completes and its answer leaves before the keys move."""
        if marker.task == self.node.name:
            await self.finish_calls()
        await super().on_reconfigure(marker)

    async def process(self, port: int, batch: Batch | ColumnBatch) -> None:
        """Not used: the loop takes batches itself."""
        raise AssertionError("map_async batches are taken by its own loop")

    # -- checkpoints ----------------------------------------------------------------

    def snapshot(self, incremental: bool = False) -> dict[str, Any]:
        """The task's snapshot with the entries not yet emitted, in input order: ``(key, value, ts, answer)``
        with ``answer`` a held ``[key, value]``, ``None`` to call again, or ``False`` for a held drop."""
        snapshot = super().snapshot(incremental)
        snapshot["calls"] = pack_exact(self._stored_entries(), f"task '{self.node.name}'")
        return snapshot

    def _stored_entries(self) -> list[tuple[Any, Any, Any, Any]]:
        """The records not yet emitted, in input order, as :meth:`snapshot` stores them."""
        return [_stored(entry) for entry in self.queue if type(entry) is Call and entry.state != EMITTED]

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from :meth:`snapshot`: answers held again, the other records to call again."""
        super().restore(snapshot)
        assert not self.calling  # restored before it runs, or with every call finished (a rescale)
        self.queue, self.uncalled, self.held, self.entries = deque(), deque(), {}, 0
        stored = snapshot.get("calls")
        for key, value, ts, answer in [] if stored is None else unpackb(stored):
            call = Call((key, value, ts), self.tail_segment)
            if answer is None:
                self.uncalled.append(call)
            else:
                call.state, call.result = DONE, None if answer is False else tuple(answer)
                if not self.ordered:
                    self.held.setdefault(call.segment, []).append(call)
            self.queue.append(call)
            self.entries += 1
        if not self.ordered and self.held.get(self.segment):
            for call in self.held.pop(self.segment):
                self._emit(call)  # the emitted ones leave the queue as the loop starts


def _valid(result: Any) -> bool:
    return result is None or (isinstance(result, tuple | list) and len(result) == 2)


def _stored(call: Call) -> tuple[Any, Any, Any, Any]:
    key, value, ts = call.element[0], call.element[1], call.element[2]
    if call.state != DONE:
        return (key, value, ts, None)
    return (key, value, ts, False if call.result is None else list(call.result))
