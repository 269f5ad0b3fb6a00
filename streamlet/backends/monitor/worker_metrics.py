"""A worker's own ``/metrics``: prometheus_client's WSGI app on the standard library's small HTTP server (a
thread; no aiohttp in a worker), reading the worker's counters on its event loop at each scrape; behind a bearer
token when it listens beyond loopback (see :mod:`~streamlet.backends.monitor.access`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from streamlet.backends.monitor.access import wsgi_guard
from streamlet.backends.monitor.metrics import Sample, StreamletCollector

SCRAPE_TIMEOUT = 5.0  # seconds a scrape waits for the event loop


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress does not hold the worker's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape on stderr."""


class WorkerMetrics:
    """Serves ``/metrics`` for one worker until :meth:`close` (``token``: only to requests that carry it)."""

    def __init__(
        self, sample: Callable[[], Awaitable[Sample]], host: str = "127.0.0.1", port: int = 0, token: str | None = None
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._sample = sample
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StreamletCollector(self._samples))
        app = make_wsgi_app(registry)
        app = app if token is None else wsgi_guard(app, token)
        self._server = make_server(host, port, app, _ThreadingServer, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="worker-metrics", daemon=True)
        self._thread.start()
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
