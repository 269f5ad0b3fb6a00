"""A worker's own ``/metrics``: prometheus_client's small HTTP server (a thread; no aiohttp in a worker),
reading the worker's counters on its event loop at each scrape."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from streamlet.backends.monitor.metrics import Sample, StreamletCollector

SCRAPE_TIMEOUT = 5.0  # seconds a scrape waits for the event loop


class WorkerMetrics:
    """Serves ``/metrics`` for one worker until :meth:`close`."""

    def __init__(self, sample: Callable[[], Awaitable[Sample]], host: str = "127.0.0.1", port: int = 0) -> None:
        self._loop = asyncio.get_running_loop()
        self._sample = sample
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StreamletCollector(self._samples))
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port: int = self._server.server_port

    def _samples(self) -> list[Sample]:
        """On the server's thread: the worker's sample, taken on its event loop (where the counters change); a
        loop too busy to answer in time fails the scrape and the sample is not taken later."""
        future = asyncio.run_coroutine_threadsafe(self._take(), self._loop)
        try:
            return [future.result(SCRAPE_TIMEOUT)]
        except TimeoutError:
            future.cancel()
            raise

    async def _take(self) -> Sample:
        return await self._sample()

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=SCRAPE_TIMEOUT)


def worker_sample(worker: str, last_load: dict[str, Any], instances: Any, jobs: Any, tcp: dict[str, int]) -> Sample:
    """A worker's sample: its last heartbeat's CPU and memory, and its counters now."""
    return {"worker": worker, "load": {**last_load, "instances": instances, "jobs": jobs}, "tcp": dict(tcp)}
