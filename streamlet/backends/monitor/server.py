"""The dashboard: an aiohttp app serving the page, its data and ``/metrics``, read-only.

Routes (every one a GET; anything else is refused with 405, so nothing here can change the cluster):

- ``/``: the page (``static/index.html``, plain JavaScript shipped in the package: nothing is fetched
  from elsewhere at run time);
- ``/api/cluster``, ``/api/jobs/{job}``: the views as JSON (``views``);
- ``/events``: the same, pushed as server-sent events every ``interval`` seconds (the page's live view); at
  most ``max_streams`` at once, more are refused with 503 and counted (``refused_streams``);
- ``/metrics``: Prometheus metrics of every worker (``metrics``), from the last reading: a scrape never
  reads ZooKeeper itself, so scrapes cost the cluster nothing however often they come.

The leader serves it for the cluster and stops with its leadership (the next leader serves it then);
``sl.start(topology, monitor_port=...)`` serves the job view of one embedded job.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any, Protocol

import anyio
import structlog
from aiohttp import web

from streamlet.backends.monitor.access import COOKIE, bearer_matches, same_token
from streamlet.backends.monitor.metrics import exposition
from streamlet.backends.monitor.views import (
    Rates,
    Reading,
    Timeline,
    cluster_view,
    instance_snapshots,
    job_view,
    sample_times,
)

log = structlog.get_logger("streamlet")
STATIC = {"app.js": "application/javascript", "style.css": "text/css", "index.html": "text/html"}
MAX_STREAMS = 16  # live views (server-sent event streams) served at once


class Source(Protocol):
    """Where readings come from (``sources``)."""

    async def read(self) -> Reading:
        """The system now."""
        ...


class Dashboard:
    """Reads its source every ``interval`` seconds and keeps the views of the latest reading."""

    def __init__(
        self, source: Source, interval: float = 1.0, max_streams: int = MAX_STREAMS, token: str | None = None
    ) -> None:
        self.source = source
        self.token = token  # every request must carry it (a dashboard bound beyond loopback); None: loopback
        self.interval = interval
        self.max_streams = max_streams
        self.streams = 0  # live views open now
        self.refused_streams = 0  # asked for past max_streams
        self.rates = Rates()
        self.timeline = Timeline()
        self.views: dict[str, Any] | None = None
        self.reading: Reading | None = None
        self._updated = anyio.Event()
        self._closing = anyio.Event()  # the server is shutting down: live feeds end

    async def refresh(self) -> dict[str, Any]:
        """Read once; the new views."""
        reading = await self.source.read()
        snapshots = {key: snapshot for key, (_, snapshot) in instance_snapshots(reading).items()}
        rates = self.rates.update(reading.at, snapshots, sample_times(reading))
        jobs = {
            job["name"]: job_view(reading, job, rates, self.timeline.observe(reading.at, job)) for job in reading.jobs
        }
        self.reading, self.views = reading, {"cluster": cluster_view(reading, rates), "jobs": jobs}
        self._updated.set()
        self._updated = anyio.Event()
        return self.views

    async def run(self) -> None:
        """Refresh until cancelled. A reading that fails (ZooKeeper suspended, the session expired) keeps the
        last views and is tried again: watching must never take down what it watches."""
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - logged and shown; the next interval reads again
                log.warning("dashboard refresh failed", error=f"{type(exc).__name__}: {exc}")
                self._unreadable(str(exc))
            await anyio.sleep(self.interval)

    def _unreadable(self, why: str) -> None:
        """The last views stay, saying why they are not fresh (ZooKeeper without a quorum, say)."""
        if self.views is None:
            return
        self.views = {**self.views, "cluster": {**self.views["cluster"], "problem": why}}
        self._updated.set()
        self._updated = anyio.Event()

    async def updates(self) -> AsyncIterator[dict[str, Any]]:
        """The views now (once there are any), then after every refresh, until the server shuts down."""
        while not self._closing.is_set():
            if self.views is not None:
                yield self.views
            updated = self._updated
            async with anyio.create_task_group() as waiting:

                async def until(event: anyio.Event) -> None:
                    await event.wait()
                    waiting.cancel_scope.cancel()

                waiting.start_soon(until, updated)
                waiting.start_soon(until, self._closing)

    def close(self) -> None:
        """End every live feed (the server is going away)."""
        self._closing.set()

    def app(self) -> web.Application:
        """The aiohttp application (GET routes only; behind the bearer token when there is one)."""
        app = web.Application(middlewares=[] if self.token is None else [dashboard_guard(self.token)])
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/cluster", self._cluster)
        app.router.add_get("/api/jobs/{job}", self._job)
        app.router.add_get("/events", self._events)
        app.router.add_get("/metrics", self._metrics)

        async def on_shutdown(_: web.Application) -> None:
            self.close()

        app.on_shutdown.append(on_shutdown)
        return app

    async def _current(self) -> dict[str, Any]:
        return self.views if self.views is not None else await self.refresh()

    async def _page(self, request: web.Request) -> web.Response:
        return _asset("index.html")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        return _asset(name)

    async def _cluster(self, request: web.Request) -> web.Response:
        return web.json_response((await self._current())["cluster"])

    async def _job(self, request: web.Request) -> web.Response:
        found = (await self._current())["jobs"].get(request.match_info["job"])
        if found is None:
            raise web.HTTPNotFound(text=f"no job called {request.match_info['job']!r}")
        return web.json_response(found)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        if self.streams >= self.max_streams:  # each holds a connection and a task: a bounded number
            self.refused_streams += 1
            raise web.HTTPServiceUnavailable(text=f"{self.max_streams} live views are open: no more at once")
        self.streams += 1
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError):
                async for views in self.updates():
                    await response.write(f"data: {json.dumps(views)}\n\n".encode())
            return response
        finally:
            self.streams -= 1

    async def _metrics(self, request: web.Request) -> web.Response:
        reading = self.reading  # the last refresh's (every interval): a scrape never reads the cluster itself
        if reading is None:
            await self.refresh()
            reading = self.reading
        assert reading is not None
        body = await anyio.to_thread.run_sync(exposition, reading.samples)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")


def dashboard_guard(token: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    """aiohttp middleware: the bearer header, ``?token=`` or the cookie, else 401; ``/?token=`` sets the cookie
    (the page's own requests, its API and ``/events``, then carry it)."""

    @web.middleware
    async def guard(request: web.Request, handler: Callable[..., Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        offered = request.query.get("token")
        if request.path == "/" and offered is not None and same_token(offered, token):
            response = web.HTTPFound("/")  # the token leaves the address bar; the cookie keeps it
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
            raise response
        cookie = request.cookies.get(COOKIE, "")
        if (
            bearer_matches(request.headers.get("Authorization"), token)
            or same_token(cookie, token)
            or (offered is not None and same_token(offered, token))
        ):
            return await handler(request)
        raise web.HTTPUnauthorized(
            text="this dashboard needs its token: 'Authorization: Bearer <token>', or open /?token=<token>",
            headers={"WWW-Authenticate": 'Bearer realm="streamlet"'},
        )

    return guard


def _asset(name: str) -> web.Response:
    data = resources.files("streamlet.backends.monitor").joinpath("static", name).read_bytes()
    return web.Response(body=data, content_type=STATIC[name], charset="utf-8")


@contextlib.asynccontextmanager
async def serving(dashboard: Dashboard, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``dashboard`` on ``host:port`` (0: any free port) while refreshing it; yields its URL."""
    runner = web.AppRunner(dashboard.app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        async with anyio.create_task_group() as group:
            group.start_soon(dashboard.run)
            yield f"http://{bound[0]}:{bound[1]}/"
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
