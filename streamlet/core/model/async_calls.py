"""``map_async``: Flink's Async I/O for asyncio, the model side.

A :class:`MapAsyncTask` only holds what the user wrote (the function and its
limits); the runtime's ``MapAsyncInstance`` (``core.runtime.async_calls``)
runs it: up to ``concurrency`` calls in flight per instance, results in input
order or as they complete, checkpoints that do not wait for calls.
"""

from __future__ import annotations

import functools
import inspect
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

    runs_calls_itself = True  # the runtime runs its calls (concurrently): run_in stays 'loop'

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
    if _plainly_synchronous(fn):
        raise TopologyError(
            f"{where}: fn must be an async def function (or a lambda returning an awaitable), "
            f"got the plain function {getattr(fn, '__qualname__', fn)!r}: use map for a plain one"
        )
    if type(concurrency) is not int or concurrency < 1:
        raise TopologyError(f"{where}: concurrency must be a whole number >= 1, got {concurrency!r}")
    if type(ordered) is not bool:
        raise TopologyError(f"{where}: ordered must be True or False, got {ordered!r}")
    check_timeout(where, "timeout", timeout)
    for refused in ("window", "state_ttl"):
        if options.get(refused) is not None:
            raise TopologyError(f"{where}: map_async keeps no windows or state; {refused} is refused")


def _plainly_synchronous(fn: Any) -> bool:
    """``fn`` is a plain ``def`` function (or method, or a partial of one), not ``async def``: what it returns
    is not awaitable. A lambda may return a coroutine (``lambda r: client.get(r.key)``): checked at its first
    call instead, as is any other callable."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    function = getattr(fn, "__func__", fn)  # a bound method's function
    if not inspect.isfunction(function) or function.__name__ == "<lambda>":
        return False
    # a decorator's wrapper (functools.wraps) around an async def returns its coroutine
    return not (inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(inspect.unwrap(function)))


def check_timeout(where: str, what: str, seconds: Any) -> None:
    """A limit in seconds: a number > 0, or None for no limit."""
    if seconds is not None and (type(seconds) is bool or not isinstance(seconds, int | float) or not seconds > 0):
        raise TopologyError(f"{where}: {what} must be a number of seconds > 0 or None, got {seconds!r}")
