"""The embedded default: every instance in one event loop, in-memory channels."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from streamlet.core.clock import Clock
from streamlet.core.runtime import DEFAULT_BATCH_SIZE, DEFAULT_CHANNEL_CAPACITY, Job, JobResult, open_job
from streamlet.core.topology import Topology
from streamlet.errors import JobError
from streamlet.transport.local import LocalChannel


def run(
    topology: Topology,
    *,
    use_uvloop: bool = True,
    clock: Clock | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    channel_capacity: int = DEFAULT_CHANNEL_CAPACITY,
) -> JobResult:
    """Run ``topology`` to completion in a new event loop and return its result.

    Call it from synchronous code; inside a running loop use :func:`start`.

    Example:
        >>> import streamlet as sl
        >>> t = sl.Topology("double")
        >>> src = t.add_source("numbers", [1, 2, 3])
        >>> twice = t.map("twice", lambda r: (r.key, r.value * 2)).set_input(src)
        >>> _ = t.add_sink("out", sl.CollectSink()).set_input(twice)
        >>> [r.value for r in sl.run(t).sink("out")]
        [2, 4, 6]
    """
    job_options = {"clock": clock, "batch_size": batch_size, "channel_capacity": channel_capacity}
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise JobError("streamlet.run() was called inside a running event loop; use 'async with streamlet.start(...)'")
    return anyio.run(_run_job, topology, job_options, backend="asyncio", backend_options=_backend_options(use_uvloop))


async def _run_job(topology: Topology, job_options: dict[str, Any]) -> JobResult:
    return await Job(topology, channel_factory=LocalChannel, **job_options).run()


def _backend_options(use_uvloop: bool) -> dict[str, Any]:
    if not use_uvloop or sys.platform == "win32":
        return {}
    try:
        import uvloop  # noqa: F401 - only checking that it is there
    except ImportError:
        return {}
    return {"use_uvloop": True}


@asynccontextmanager
async def start(
    topology: Topology,
    *,
    clock: Clock | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    channel_capacity: int = DEFAULT_CHANNEL_CAPACITY,
) -> AsyncIterator[Job]:
    """Run ``topology`` inside the caller's event loop.

    Example:
        >>> async def service(topology):
        ...     async with start(topology) as job:
        ...         await job.send("requests", "user42", 1)
        ...         await job.close_source("requests")
        ...         result = await job.wait()
    """
    async with open_job(
        topology, channel_factory=LocalChannel, clock=clock, batch_size=batch_size, channel_capacity=channel_capacity
    ) as job:
        yield job
