"""Sinks: where records leave a topology."""

from __future__ import annotations

import inspect
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.record import Batch, Record, Records, records_of
from streamlet.errors import JobError

_ATTEMPT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_attempt(attempt: str) -> str:
    """``attempt`` if it is a usable run token (a safe file name), else a ``JobError`` naming it."""
    if not isinstance(attempt, str) or _ATTEMPT.fullmatch(attempt) is None:
        raise JobError(
            f"attempt {attempt!r} is not a usable run token: 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return attempt


@dataclass(frozen=True, slots=True)
class SinkContext:
    """What a sink instance knows about where it runs.

    ``job_id`` names the job the same way in every run of it (``"local.<topology
    name>"`` in-process; a cluster passes its own): use it for names that must
    outlive a run, such as a Kafka transactional id. ``attempt`` is unique to
    this run of the job: a transactional writer stages under it, so two runs of
    the same instance (a restarted one and a stale one still running) never
    write into each other's files. It is a safe file name (see :func:`check_attempt`).
    ``lineage`` is shared by the attempts that continue one submission (a
    cluster job's attempt ``N + 1`` after a failover; ``None`` in-process,
    where each run stands alone): an attempt that starts from nothing (no
    checkpoint completed) may discard what earlier attempts of its lineage
    staged, which no commit can publish any more.
    """

    node: str
    index: int
    parallelism: int
    job_id: str = "local"
    attempt: str = "0"
    lineage: str | None = None

    def __post_init__(self) -> None:
        check_attempt(self.attempt)


@dataclass(frozen=True, slots=True)
class RestorePoint:
    """The completed checkpoint a job resumes from: its ``epoch`` and the ``attempt`` (run) that took it.

    Every epoch up to ``epoch`` is complete, and that attempt staged them:
    a writer publishes what ``attempt`` staged for them and has not published
    yet, and never what another attempt staged. ``attempt`` is ``None`` when
    the checkpoint does not record it (written by an older streamlet): then
    nothing staged can be matched to it.
    """

    epoch: int
    attempt: str | None


class BaseWriter(ABC):
    """What every writer of one sink instance does besides ``write``: see :class:`SinkWriter` (``write`` takes
    records) and :class:`ElementWriter` (``write`` takes the runtime's elements)."""

    def close(self) -> Any:
        """Called once after the input has ended; may be ``async def``."""

    def abort(self) -> Any:
        """The job ended with an error: release resources, publish nothing more.

        Plain or ``async def`` (awaited shielded from the job's cancellation,
        so keep it short: a writer bounds its own network calls).
        """

    @abstractmethod
    def write_columns(self, batch: ColumnBatch) -> Any:
        """Consume one columnar batch (only where the sink's ``takes_columns`` is set); plain or ``async def``.

        The default writes its elements (or records) through ``write``; a writer that can use the Arrow
        record batch itself (``SparkSink``'s) overrides it.
        """

    def prepare_commit(self, epoch: int) -> Any:
        """Checkpoint ``epoch`` reached this sink: stage what was written since the last one.

        Together with :meth:`commit` this makes output exactly-once: staged
        data becomes visible only when the checkpoint is complete. Plain or
        ``async def``; the default does nothing (at-least-once output).
        """

    def commit(self, epoch: int) -> Any:
        """Checkpoint ``epoch`` is complete: make what was staged for it visible."""

    def restore(self, point: RestorePoint | None) -> Any:
        """A job resumes from the completed checkpoint ``point`` (``None``: from scratch).

        Called before anything is written. Commit what ``point.attempt``
        staged for epochs up to ``point.epoch`` and did not commit yet;
        discard what it staged after that; never commit what another attempt
        staged. Committing an epoch twice (this restore and a stale run of
        the same instance) must leave it visible once. Plain or ``async def``.
        """

    def result(self) -> list[Record] | None:
        """What ``JobResult.sink(name)`` returns for this instance, if anything."""
        return None

    #: The writer keeps what it was given itself (in memory, as a ``CollectSink``'s does), with nothing outside
    #: to stage it in: what it holds at a checkpoint is part of the checkpoint (:meth:`snapshot`), and a job
    #: resuming from it gives it back (:meth:`restore_snapshot`), so a failover loses none of it.
    keeps_output: ClassVar[bool] = False

    def snapshot(self) -> Any:
        """With ``keeps_output``: what the writer holds at a checkpoint's barrier (everything written before
        it), as a list of plain data the state codec packs (lists, dicts, numbers, strings, bytes). Restored
        with another parallelism, the instances' lists go to instance 0, one after another in instance order."""
        return None

    def restore_snapshot(self, snapshot: Any) -> None:
        """With ``keeps_output``: continue from what :meth:`snapshot` gave at the checkpoint the job resumes
        from (called after :meth:`restore`, before anything is written)."""


class SinkWriter(BaseWriter):
    """One instance's writer of :class:`Record` objects; ``write`` may be plain or ``async def``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "takes_elements" in cls.__dict__:  # the flag of earlier versions: the type says it now
            raise TypeError(f"{cls.__name__}: a writer taking elements derives from ElementWriter (no takes_elements)")

    @abstractmethod
    def write(self, batch: Records) -> Any:
        """Consume one batch of records (read-only: the same list may reach other sinks)."""

    def write_columns(self, batch: ColumnBatch) -> Any:
        """Writes the batch's records through :meth:`write`."""
        return self.write(records_of(batch.elements()))


class ElementWriter(BaseWriter):
    """One instance's writer of the runtime's elements (plain ``(key, value, ts)`` tuples, six wide for loop
    and window records: see ``streamlet.core.model.record``) instead of :class:`Record` objects: a writer that
    only reads fields saves making a record per element. ``write`` may be plain or ``async def``."""

    @abstractmethod
    def write(self, batch: Batch) -> Any:
        """Consume one batch of elements (read-only: the same list may reach other sinks)."""

    def write_columns(self, batch: ColumnBatch) -> Any:
        """Writes the batch's elements through :meth:`write`."""
        return self.write(batch.elements())


Writer = SinkWriter | ElementWriter  # what a sink's open returns: its type says what its write takes


class Sink(ABC):
    """Base class of sinks: configuration that opens one writer per instance."""

    #: Columnar batches (Arrow, from the columnar operators) reach its writers' ``write_columns`` as they are,
    #: instead of as elements made by the sending edge.
    takes_columns: ClassVar[bool] = False

    def exactly_once_with_checkpoints(self) -> bool:
        """Whether the sink stages its output per checkpoint and publishes it once the checkpoint completes:
        exactly-once output, with checkpoints only (without them it is at-least-once, and a job that runs
        one without checkpoints is warned at start)."""
        return False

    @abstractmethod
    def open(self, context: SinkContext) -> Writer:
        """A writer for instance ``context.index``: a :class:`SinkWriter` or an :class:`ElementWriter`."""


class CollectSink(Sink):
    """Keeps every record; read them with ``result.sink(name)``.

    Example:
        >>> sink = CollectSink()
    """

    def open(self, context: SinkContext) -> ElementWriter:
        """A writer that appends to its own list."""
        return _CollectWriter()


class _CollectWriter(ElementWriter):  # kept as elements while the job runs; records are made once, for the result
    keeps_output = True  # what it collected up to a checkpoint is in the checkpoint: a failover loses none of it

    def __init__(self) -> None:
        self.elements: Batch = []

    def write(self, batch: Batch) -> None:
        self.elements.extend(batch)

    def snapshot(self) -> list[Any]:
        return list(self.elements)  # a copy: the checkpoint is packed later, while more is written

    def restore_snapshot(self, snapshot: Any) -> None:
        self.elements = [tuple(element) for element in snapshot]  # packed, a tuple came back a list

    def result(self) -> list[Record]:
        return records_of(self.elements)


class CallbackSink(Sink):
    """Calls ``fn(record)`` (plain or ``async def``) for every record, in order."""

    def __init__(self, fn: Callable[[Record], Any]) -> None:
        self.fn = fn

    def open(self, context: SinkContext) -> SinkWriter:
        """A writer calling the function."""
        if inspect.iscoroutinefunction(self.fn):
            return _AsyncCallbackWriter(self.fn)
        return _CallbackWriter(self.fn)


class WriteFailed(Exception):
    """Raised by a writer that knows which record of a batch failed (the cause is chained); the sink's
    instance turns it into a ``SinkError`` naming that record's key."""

    def __init__(self, record: Record) -> None:
        super().__init__(record.key)
        self.record = record


class _CallbackWriter(SinkWriter):
    def __init__(self, fn: Callable[[Record], Any]) -> None:
        self.fn = fn

    def write(self, batch: Records) -> None:
        fn = self.fn
        record = None
        try:
            for record in batch:
                fn(record)
        except Exception as exc:
            assert record is not None
            raise WriteFailed(record) from exc


class _AsyncCallbackWriter(SinkWriter):
    def __init__(self, fn: Callable[[Record], Any]) -> None:
        self.fn = fn

    async def write(self, batch: Records) -> None:
        fn = self.fn
        record = None
        try:
            for record in batch:
                await fn(record)
        except Exception as exc:
            assert record is not None
            raise WriteFailed(record) from exc
