"""Per-instance loops: one asyncio task per source, task or sink instance.

The loop of a task instance takes the next item from its inbox (by input
mode), calls ``execute`` on a whole batch, and lets the routes buffer what
was emitted. Full buffers are sent after each batch; partial ones as soon as
the inbox is idle, so batching costs no latency on a quiet stream.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from streamlet.core.channel import Inbox
from streamlet.core.ports import Inputs, Outputs
from streamlet.core.record import Batch, CycleEnd, EndOfStream, Marker, Record
from streamlet.core.sinks import SinkContext, SinkWriter
from streamlet.core.sources import SourceContext, SourceReader
from streamlet.core.state import KeyedState
from streamlet.core.statistics import DeadLetter, InstanceCounters
from streamlet.core.task import RecordFailure, Task
from streamlet.errors import TaskError

if TYPE_CHECKING:
    from streamlet.core.cycles import CycleTracker
    from streamlet.core.topology import Node


class Instance(ABC):
    """What every instance has: its node, index, counters and outputs."""

    def __init__(self, node: Node, index: int, outputs: Outputs, batch_size: int) -> None:
        self.node = node
        self.index = index
        self.outputs = outputs
        self.batch_size = batch_size
        self.counters = InstanceCounters()
        self.log = structlog.get_logger("streamlet").bind(task=node.name, instance=index)

    @abstractmethod
    async def run(self) -> None:
        """Run until the input ends (or the job is cancelled)."""

    def records_out(self) -> int:
        """Records emitted so far."""
        return self.outputs.sent()


class SourceInstance(Instance):
    """Reads batches from a ``SourceReader`` and emits them downstream."""

    def __init__(self, node: Node, index: int, outputs: Outputs, batch_size: int, context: SourceContext) -> None:
        super().__init__(node, index, outputs, batch_size)
        self.context = context
        self._stopping = False
        self._read_scope: anyio.CancelScope | None = None

    def stop(self) -> None:
        """End the source early: stop reading, then end the stream downstream."""
        self._stopping = True
        if self._read_scope is not None:
            self._read_scope.cancel()

    async def run(self) -> None:
        """Read until the source is exhausted or stopped, then send end-of-stream."""
        assert self.node.source is not None
        reader = self.node.source.open(self.context)
        try:
            await self._pump(reader)
        finally:
            await reader.aclose()
        await self.outputs.end()

    async def _pump(self, reader: SourceReader) -> None:
        outputs, size = self.outputs, self.batch_size
        while not self._stopping:
            batch = None
            with anyio.CancelScope() as scope:  # only the read is cancellable: sends are never cut
                self._read_scope = scope
                batch = await reader.read(size)
            self._read_scope = None
            if batch is None:
                return
            self.counters.records_in += len(batch)
            outputs.emit_batch(batch)
            await outputs.flush()


class Receiver(Instance):
    """An instance with an inbox: counts senders per port until all have ended."""

    def __init__(
        self, node: Node, index: int, outputs: Outputs, batch_size: int, inbox: Inbox, senders: list[int]
    ) -> None:
        super().__init__(node, index, outputs, batch_size)
        self.inbox = inbox
        self.open_senders = senders  # per input port: senders that have not ended yet
        self.open_ports = sum(1 for count in senders if count > 0)
        self.cycle: CycleTracker | None = None

    def on_marker(self, port: int, marker: Marker) -> None:
        """Count end-of-stream (and a cycle's end) per port."""
        if isinstance(marker, EndOfStream | CycleEnd):
            if isinstance(marker, EndOfStream) and self.cycle is not None:
                self.cycle.external_ended()
            self.open_senders[port] -= 1
            if self.open_senders[port] == 0:
                self.open_ports -= 1

    async def run(self) -> None:
        """Process the inbox in async mode (any port with data) until every port ended."""
        inbox, outputs, ports = self.inbox, self.outputs, len(self.open_senders)
        counters, size, cycle = self.counters, self.batch_size, self.cycle
        start = 0
        while self.open_ports:
            port = -1
            for offset in range(ports):
                candidate = (start + offset) % ports
                if not inbox.is_empty(candidate):
                    port = candidate
                    break
            if port < 0:
                await outputs.flush()
                if inbox.depth() == 0:
                    await inbox.wait()
                continue
            start = port + 1
            item = inbox.pop(port)
            if type(item) is list:
                counters.records_in += len(item)
                if cycle is None:
                    await self.process(port, item)
                    await outputs.flush(size)
                else:
                    for iteration, run in _runs_by_iteration(item):
                        outputs.iteration = iteration  # what the task emits inherits the loop count
                        await self.process(port, run)
                    await outputs.flush()  # inside a loop nothing may linger, or the loop looks idle
                    cycle.batches_done(1)
            else:
                self.on_marker(port, item)  # type: ignore[arg-type]
        await self.complete()

    @abstractmethod
    async def process(self, port: int, batch: Batch) -> None:
        """Handle one data batch from ``port``."""

    async def complete(self) -> None:
        """Every input has ended."""
        await self.outputs.end()


class SinkInstance(Receiver):
    """Hands every batch to a ``SinkWriter``."""

    def __init__(self, node: Node, index: int, outputs: Outputs, batch_size: int, inbox: Inbox, senders: list[int]):
        super().__init__(node, index, outputs, batch_size, inbox, senders)
        assert node.sink is not None
        self.writer: SinkWriter = node.sink.open(SinkContext(node.name, index, node.parallelism))
        self._async = inspect.iscoroutinefunction(self.writer.write)

    async def process(self, port: int, batch: Batch) -> None:
        """Write the batch."""
        if self._async:
            await self.writer.write(batch)
        else:
            self.writer.write(batch)

    async def complete(self) -> None:
        """Close the writer."""
        closing = self.writer.close()
        if inspect.isawaitable(closing):
            await closing


class TaskInstance(Receiver):
    """Runs a user ``Task`` under its error policy (fail, skip or restart)."""

    def __init__(
        self,
        node: Node,
        index: int,
        outputs: Outputs,
        batch_size: int,
        inbox: Inbox,
        senders: list[int],
        dead_letters: list[DeadLetter],
    ) -> None:
        super().__init__(node, index, outputs, batch_size, inbox, senders)
        self.inputs = Inputs(node.inputs)
        self.state = KeyedState()
        self.dead_letters = dead_letters
        self.failures = 0
        self.task = self._new_task()

    def _new_task(self) -> Task:
        assert self.node.make_task is not None
        task = self.node.make_task()
        task.state = self.state
        self._execute: Callable[[Inputs, Outputs], Any] = task.execute
        self._async = inspect.iscoroutinefunction(task.execute)
        return task

    async def run(self) -> None:
        """Prepare the task, then run its loop in its input mode."""
        self.task.prepare(dict(self.node.config))
        if self.node.sync and self.node.inputs > 1:
            await self._run_sync()
        else:
            await super().run()

    async def process(self, port: int, batch: Batch) -> None:
        """Execute one batch from ``port`` under the error policy."""
        self.outputs.ts = batch[-1].ts
        while batch:
            marks = self.outputs.marks() if self.node.on_error != "fail" else None
            self.inputs.set_one(port, batch)
            try:
                if self._async:
                    await self._execute(self.inputs, self.outputs)
                else:
                    self._execute(self.inputs, self.outputs)
                return
            except RecordFailure as failure:
                batch = await self._record_failed(batch, failure.index, failure.__cause__ or failure)
            except Exception as exc:  # noqa: BLE001 - user code: any error follows the policy
                if marks is not None:
                    self.outputs.rollback(marks)
                batch = await self._batch_failed(port, batch, exc)

    async def _record_failed(self, batch: Batch, index: int, error: BaseException) -> Batch:
        """A shortcut told us which record failed: apply the policy, return what is left."""
        record = batch[index]
        if self.node.on_error == "skip":
            self._dead_letter(record, error)
            return batch[index + 1 :]
        if self.node.on_error == "restart":
            self._restart(record, error)
            return batch[index:]
        raise self._task_error(record, error)

    async def _batch_failed(self, port: int, batch: Batch, error: BaseException) -> Batch:
        """``execute`` raised on a whole batch: retry after a restart, or isolate the record."""
        if self.node.on_error == "restart":
            self._restart(batch[0], error)
            return batch
        # Replay one record at a time so the policy lands on the exact record.
        for record in batch:
            self.inputs.set_one(port, [record])
            try:
                if self._async:
                    await self._execute(self.inputs, self.outputs)
                else:
                    self._execute(self.inputs, self.outputs)
            except Exception as exc:
                if self.node.on_error == "skip":
                    self._dead_letter(record, exc)
                else:
                    raise self._task_error(record, exc) from exc
        if self.node.on_error == "fail":  # the replay did not fail again: report the batch
            raise self._task_error(batch[0], error, what=f"a batch of {len(batch)} records starting with key")
        return []

    def _dead_letter(self, record: Record, error: BaseException) -> None:
        self.dead_letters.append(DeadLetter(self.node.name, self.index, record, _describe(error), error))
        self.log.warning("record dead-lettered", key=record.key, error=_describe(error))

    def _restart(self, record: Record, error: BaseException) -> None:
        self.failures += 1
        if self.failures > self.node.max_failures:
            raise self._task_error(record, error, after=f" after {self.node.max_failures} restarts")
        self.log.warning("restarting instance", key=record.key, error=_describe(error), failures=self.failures)
        self.task = self._new_task()
        self.task.prepare(dict(self.node.config))

    def _task_error(
        self, record: Record, error: BaseException, *, what: str = "record with key", after: str = ""
    ) -> TaskError:
        message = (
            f"task '{self.node.name}' instance {self.index} failed on {what} {record.key!r}{after}: {_describe(error)}"
        )
        task_error = TaskError(message, task=self.node.name, instance=self.index, key=record.key)
        task_error.__cause__ = error
        return task_error

    async def complete(self) -> None:
        """Run ``finish`` (which may emit final results), then end the stream downstream."""
        self.outputs.ts = None
        try:
            finishing = self.task.finish(self.outputs)
            if inspect.isawaitable(finishing):
                await finishing
        except Exception as exc:
            raise TaskError(
                f"task '{self.node.name}' instance {self.index} failed in finish(): {_describe(exc)}",
                task=self.node.name, instance=self.index, key=None,
            ) from exc  # fmt: skip
        await self.outputs.end()

    # -- sync mode ----------------------------------------------------------

    async def _run_sync(self) -> None:
        """Execute when every open port has a batch; markers are taken as they reach a head."""
        inbox, outputs, ports = self.inbox, self.outputs, range(self.node.inputs)
        while self.open_ports:
            if self._take_markers():
                continue
            if all(self.open_senders[p] == 0 or _has_batch(inbox, p) for p in ports):
                batches = [_pop_batch(inbox, p) if self.open_senders[p] > 0 else [] for p in ports]
                await self._process_sync(batches)
                await outputs.flush(self.batch_size if self.cycle is None else 1)
                if self.cycle is not None:
                    self.cycle.batches_done(sum(1 for batch in batches if batch))
                continue
            await outputs.flush()
            if not self._sync_ready():
                await inbox.wait()
        await self.complete()

    def _take_markers(self) -> bool:
        took = False
        for port in range(self.node.inputs):
            if self.open_senders[port] > 0:
                head = self.inbox.head(port)
                if head is not None and type(head) is not list:
                    self.inbox.pop(port)
                    self.on_marker(port, head)  # type: ignore[arg-type]
                    took = True
        return took

    def _sync_ready(self) -> bool:
        heads = [self.inbox.head(p) for p in range(self.node.inputs) if self.open_senders[p] > 0]
        return any(h is not None and type(h) is not list for h in heads) or all(h is not None for h in heads)

    async def _process_sync(self, batches: list[Batch]) -> None:
        records = [record for batch in batches for record in batch]
        self.counters.records_in += len(records)
        self.outputs.ts = records[-1].ts if records else None
        if self.cycle is not None:
            self.outputs.iteration = max(record.iteration for record in records)
        while True:
            marks = self.outputs.marks()
            self.inputs.set_all(batches)
            try:
                if self._async:
                    await self._execute(self.inputs, self.outputs)
                else:
                    self._execute(self.inputs, self.outputs)
                return
            except Exception as exc:  # noqa: BLE001 - user code: a sync wake-up fails as a whole
                self.outputs.rollback(marks)
                error = exc.__cause__ if isinstance(exc, RecordFailure) and exc.__cause__ else exc
                if self.node.on_error == "skip":
                    for record in records:
                        self._dead_letter(record, error)
                    return
                if self.node.on_error == "restart":
                    self._restart(records[0], error)
                    continue
                raise self._task_error(records[0], error, what="a sync wake-up starting with key") from error


def _runs_by_iteration(batch: Batch) -> list[tuple[int, Batch]]:
    runs: list[tuple[int, Batch]] = []
    for record in batch:
        if runs and runs[-1][0] == record.iteration:
            runs[-1][1].append(record)
        else:
            runs.append((record.iteration, [record]))
    return runs


def _pop_batch(inbox: Inbox, port: int) -> Batch:
    batch = inbox.pop(port)
    assert type(batch) is list  # the caller saw a batch at the head
    return batch


def _has_batch(inbox: Inbox, port: int) -> bool:
    head = inbox.head(port)
    return head is not None and type(head) is list


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
