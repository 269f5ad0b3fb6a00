"""``map_async``: Flink's Async I/O for asyncio, the model side.

A :class:`MapAsyncTask` only holds what the user wrote (the function and its
limits); the runtime's ``MapAsyncInstance`` (``core.runtime.async_calls``)
runs it: up to ``concurrency`` calls in flight per instance, results in input
order or as they complete, checkpoints that do not wait for calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.record import Record
from streamlet.core.model.task import Task
from streamlet.errors import TopologyError

#: ``async fn(record) -> (key, value) | None``: what ``map_async`` calls for every record.
AsyncFunction = Callable[[Record], Awaitable[tuple[Any, Any] | None]]


class MapAsyncTask(Task):
    """``await fn(record)`` for every record, ``concurrency`` calls at a time (run by the runtime, not here)."""

    def __init__(self, fn: AsyncFunction, concurrency: int, ordered: bool, timeout: float | None) -> None:
        self.fn = fn
        self.concurrency = concurrency
        self.ordered = ordered
        self.timeout = timeout

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Never called: the instance calls ``fn`` itself, record by record, while it takes more input."""
        raise TypeError("a map_async task is run by its instance, record by record")


def check_map_async(name: str, fn: Any, concurrency: Any, ordered: Any, timeout: Any, options: dict[str, Any]) -> None:
    """What ``map_async`` refuses, named by the task."""
    where = f"task '{name}'"
    if not callable(fn):
        raise TopologyError(f"{where}: fn must be an async function fn(record), got {fn!r:.80}")
    if type(concurrency) is not int or concurrency < 1:
        raise TopologyError(f"{where}: concurrency must be a whole number >= 1, got {concurrency!r}")
    if type(ordered) is not bool:
        raise TopologyError(f"{where}: ordered must be True or False, got {ordered!r}")
    check_timeout(where, "timeout", timeout)
    for refused in ("window", "state_ttl"):
        if options.get(refused) is not None:
            raise TopologyError(f"{where}: map_async keeps no windows or state; {refused} is refused")


def check_timeout(where: str, what: str, seconds: Any) -> None:
    """A limit in seconds: a number > 0, or None for no limit."""
    if seconds is not None and (type(seconds) is bool or not isinstance(seconds, int | float) or not seconds > 0):
        raise TopologyError(f"{where}: {what} must be a number of seconds > 0 or None, got {seconds!r}")
