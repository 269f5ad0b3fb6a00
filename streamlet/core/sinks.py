"""Sinks: where records leave a topology."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamlet.core.record import Batch, Record


@dataclass(frozen=True, slots=True)
class SinkContext:
    """What a sink instance knows about where it runs."""

    node: str
    index: int
    parallelism: int


class SinkWriter(ABC):
    """One instance's writer; ``write`` may be plain or ``async def``."""

    @abstractmethod
    def write(self, batch: Batch) -> Any:
        """Consume one batch (read-only: the same list may reach other sinks)."""

    def close(self) -> Any:
        """Called once after the input has ended; may be ``async def``."""

    def abort(self) -> Any:
        """The job ended with an error: release resources, publish nothing more.

        Plain or ``async def`` (awaited shielded from the job's cancellation,
        so keep it short: a writer bounds its own network calls).
        """

    def prepare_commit(self, epoch: int) -> Any:
        """Checkpoint ``epoch`` reached this sink: stage what was written since the last one.

        Together with :meth:`commit` this makes output exactly-once: staged
        data becomes visible only when the checkpoint is complete. Plain or
        ``async def``; the default does nothing (at-least-once output).
        """

    def commit(self, epoch: int) -> Any:
        """Checkpoint ``epoch`` is complete: make what was staged for it visible."""

    def restore(self, epoch: int | None) -> Any:
        """A job resumes from checkpoint ``epoch`` (``None``: from scratch).

        Commit what was staged for epochs up to ``epoch`` and not yet
        committed; discard what was staged after it. Plain or ``async def``.
        """

    def result(self) -> list[Record] | None:
        """What ``JobResult.sink(name)`` returns for this instance, if anything."""
        return None


class Sink(ABC):
    """Base class of sinks: configuration that opens one writer per instance."""

    @abstractmethod
    def open(self, context: SinkContext) -> SinkWriter:
        """A writer for instance ``context.index``."""


class CollectSink(Sink):
    """Keeps every record; read them with ``result.sink(name)``.

    Example:
        >>> sink = CollectSink()
    """

    def open(self, context: SinkContext) -> SinkWriter:
        """A writer that appends to its own list."""
        return _CollectWriter()


class _CollectWriter(SinkWriter):
    def __init__(self) -> None:
        self.records: list[Record] = []

    def write(self, batch: Batch) -> None:
        self.records.extend(batch)

    def result(self) -> list[Record]:
        return self.records


class CallbackSink(Sink):
    """Calls ``fn(record)`` (plain or ``async def``) for every record, in order."""

    def __init__(self, fn: Callable[[Record], Any]) -> None:
        self.fn = fn

    def open(self, context: SinkContext) -> SinkWriter:
        """A writer calling the function."""
        if inspect.iscoroutinefunction(self.fn):
            return _AsyncCallbackWriter(self.fn)
        return _CallbackWriter(self.fn)


class _CallbackWriter(SinkWriter):
    def __init__(self, fn: Callable[[Record], Any]) -> None:
        self.fn = fn

    def write(self, batch: Batch) -> None:
        fn = self.fn
        for record in batch:
            fn(record)


class _AsyncCallbackWriter(_CallbackWriter):
    async def write(self, batch: Batch) -> None:  # type: ignore[override]
        fn = self.fn
        for record in batch:
            await fn(record)
