"""Sources: where records enter a topology.

A :class:`Source` is configuration; the runtime calls :meth:`Source.open`
once per parallel instance and reads whole batches from the returned
:class:`SourceReader`.
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio.abc

from streamlet.core.model.clock import Clock
from streamlet.core.model.record import Batch, DeadLetter, Record, element_of
from streamlet.errors import JobError, TopologyError


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a source instance knows about where it runs."""

    node: str
    index: int
    parallelism: int
    clock: Clock
    task_group: anyio.abc.TaskGroup
    feed: asyncio.Queue[Any] | None = None  # set by the job for a QueueSource
    dead_letters: list[DeadLetter] = field(default_factory=list)  # the job's: what a reader could not decode


class SourceReader(ABC):
    """One instance's reader; ``read`` returns ``None`` once the source is exhausted."""

    #: ``read`` returns only elements, three or six wide (the built-in readers): the runtime takes its
    #: batches as they are. Otherwise each batch is checked and converted (see :func:`read_elements`).
    gives_elements: ClassVar[bool] = False

    @abstractmethod
    async def read(self, max_records: int) -> Batch | list[Record] | None:
        """Up to ``max_records`` records, waiting for at least one; ``None`` at the end. An empty list hands
        control back without data (a reader does so once when it has just caught up: see :meth:`caught_up`).

        Items may be :class:`Record` objects, plain ``(key, value, ts)``
        tuples (cheaper: the runtime carries records as such tuples),
        ``(key, value)`` pairs (stamped with the clock) or plain values (key
        ``None``); see :func:`read_elements`."""

    def position(self) -> Any:
        """Where the reader stands, msgpack-able, for checkpoints (``None``: not replayable)."""
        return None

    async def seek(self, position: Any) -> None:
        """Continue from a :meth:`position` taken earlier (a restore)."""
        raise JobError(f"{type(self).__name__} cannot be replayed from a checkpoint")

    def checkpoint_complete(self, epoch: int, position: Any) -> Any:
        """Checkpoint ``epoch``, which holds ``position`` for this reader, is saved.

        A source that acknowledges what it read upstream (Kafka offsets) does
        it here, never earlier. Plain or ``async def``; may be called after
        :meth:`aclose` (the job's final checkpoint). The default does nothing.
        """

    def caught_up(self) -> bool:
        """Whether the reader has read everything its source held when it started (a table's snapshot, a
        topic up to the end offsets seen at start). A ``table_join(bootstrap=True)`` fed by this source holds
        its left records until then; asked before each read, once it said ``True`` never again. Default:
        ``False``, so only the reader's end counts (right for a bounded source; an unbounded one that never
        says so keeps such a join waiting)."""
        return False

    async def aclose(self) -> None:
        """Release what the reader holds."""

    def event_time_progress(self) -> float | None:
        """The event time every part of this reader has reached, if it tracks one (``None``: it does not).

        A reader of several partitions returns the minimum over them of the
        largest event time read from each, so one slow partition holds the
        watermark back; the source subtracts its out-of-orderness bound.
        """
        return None


class Source(ABC):
    """Base class of sources: configuration that opens one reader per instance."""

    #: The program running the job feeds it (a :class:`QueueSource`): a job resumes it with nothing to
    #: replay, and what the program sends after the restart is what it reads. Any other source whose
    #: reader has no ``position()`` refuses to resume (:class:`~streamlet.errors.NotReplayable`).
    fed_by_the_program: ClassVar[bool] = False

    @abstractmethod
    def open(self, context: SourceContext) -> SourceReader:
        """Start reading for instance ``context.index`` of ``context.parallelism``."""


def to_elements(items: list[Any], ts: float | None, *, wide_tuples: bool = False) -> Batch:
    """Items to the runtime's elements: a ``Record`` is taken apart, a ``(key, value)`` pair gets ``ts``,
    anything else becomes the value of an element with key ``None``. With ``wide_tuples`` (what a reader
    returns) a tuple three or six wide is an element already; otherwise (a source's items) it is a value."""
    kinds = set(map(type, items))
    if kinds == {Record}:  # records made by the caller (event times of its own): taken apart at once
        return [(r.key, r.value, r.ts) for r in items]
    if tuple not in kinds and not any(issubclass(kind, Record) for kind in kinds):
        return [(None, item, ts) for item in items]  # plain values, without per-item checks
    elements: Batch = []
    append = elements.append
    for item in items:
        if isinstance(item, Record):
            append(element_of(item))
        elif type(item) is not tuple:
            append((None, item, ts))
        elif len(item) == 2:
            append((item[0], item[1], ts))
        elif wide_tuples and len(item) in (3, 6):
            append(item)
        else:
            append((None, item, ts))
    return elements


def read_elements(items: list[Any], ts: float | None) -> Batch:
    """What a reader returned, as elements: tuples three or six wide are elements already, a ``Record``
    is taken apart, a ``(key, value)`` pair gets ``ts``, anything else is the value of an element with key
    ``None`` (see :func:`to_elements`)."""
    if set(map(type, items)) == {tuple} and set(map(len, items)) <= {3, 6}:
        return items
    return to_elements(items, ts, wide_tuples=True)


class IterableSource(Source):
    """Records from a sync or async iterable.

    With ``parallelism`` n, instance i reads items i, i+n, i+2n, ... of its own
    iterator, so the iterable must be re-iterable (a list, a range), not a
    one-shot generator, when n > 1.

    Example:
        >>> source = IterableSource([("a", 1), ("b", 2)])
    """

    def __init__(self, items: Iterable[Any] | AsyncIterable[Any]) -> None:
        self.items = items

    def open(self, context: SourceContext) -> SourceReader:
        """A reader over this instance's share of the items."""
        if isinstance(self.items, AsyncIterable):
            if context.parallelism > 1:
                raise TopologyError(f"source '{context.node}': an async iterable cannot feed parallel instances")
            return _AsyncIterableReader(self.items, context)
        iterator = iter(self.items)
        if context.parallelism > 1:
            if iterator is self.items:
                raise TopologyError(
                    f"source '{context.node}': a one-shot iterator cannot feed "
                    f"{context.parallelism} instances; pass a list or a factory-made iterable"
                )
            iterator = itertools.islice(iterator, context.index, None, context.parallelism)
        return _IteratorReader(iterator, context.clock)


class _IteratorReader(SourceReader):
    """Replayable by position: the number of items this instance has read."""

    gives_elements = True

    def __init__(self, iterator: Iterator[Any], clock: Clock) -> None:
        self._iterator = iterator
        self._clock = clock
        self._read = 0

    async def read(self, max_records: int) -> Batch | None:
        items = list(itertools.islice(self._iterator, max_records))
        self._read += len(items)
        return to_elements(items, self._clock.now()) if items else None

    def position(self) -> int:
        return self._read

    async def seek(self, position: Any) -> None:
        skipped = sum(1 for _ in itertools.islice(self._iterator, position - self._read))
        self._read += skipped


class _QueueReader(SourceReader):
    """Drains an asyncio queue: everything ready, up to a batch, without waiting twice."""

    gives_elements = True

    def __init__(self, queue: asyncio.Queue[Any], clock: Clock) -> None:
        self._queue = queue
        self._clock = clock
        self._ended = False

    async def read(self, max_records: int) -> Batch | None:
        if self._ended:
            return None
        queue = self._queue
        items = [await queue.get()]
        while len(items) < max_records and not queue.empty():
            items.append(queue.get_nowait())
        if items[-1] is _END:
            self._ended = True
            queue.put_nowait(_END)  # let sibling instances see the end too
            items.pop()
            if not items:
                return None
        return to_elements(items, self._clock.now())


class _AsyncIterableReader(_QueueReader):
    """Pulls an async iterable in a helper task so a quiet stream flushes at once."""

    def __init__(self, items: AsyncIterable[Any], context: SourceContext) -> None:
        super().__init__(asyncio.Queue(maxsize=4096), context.clock)
        context.task_group.start_soon(self._feed, items.__aiter__())

    async def _feed(self, iterator: AsyncIterator[Any]) -> None:
        async for item in iterator:
            await self._queue.put(item)
        await self._queue.put(_END)


_END: Any = object()


END_OF_FEED: Any = _END


class QueueSource(Source):
    """Records pushed by the embedding program: ``await job.send(name, key, value)``.

    The job gives the source one queue of at most ``maxsize`` records; ``send``
    waits while it is full (backpressure). The source ends after
    ``job.close_source(name)`` or ``job.stop()``.
    """

    fed_by_the_program = True

    def __init__(self, maxsize: int = 10_000) -> None:
        self.maxsize = maxsize

    def open(self, context: SourceContext) -> SourceReader:
        """A reader of one instance over the job's feed queue."""
        if context.feed is None:
            raise JobError(f"source '{context.node}': a QueueSource needs a job that feeds it")
        return _QueueReader(context.feed, context.clock)
