"""A cluster's dashboard and a worker's /metrics, on any address (loopback too), answer only requests that carry
the state dir's token; the URL that cluster up and cluster status print carries it."""

from __future__ import annotations

import stat
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from streamlet.backends.monitor.access import TOKEN_FILE, load_or_make_token, with_token
from streamlet.backends.monitor.server import Dashboard, serving
from streamlet.backends.monitor.worker_metrics import WorkerMetrics, worker_sample
from tests.unit.backends.monitor.test_dashboard_limits import CountingSource

TOKEN = "t0ken-of-the-state-dir"


def test_the_url_shown_carries_the_state_dirs_token(tmp_path: Path) -> None:
    """cluster up / cluster status: the URL from ZooKeeper (which anyone may read, so it holds no token) with
    ``?token=`` of the state dir; a state dir without one (a cluster started elsewhere) leaves it as it is."""
    token = load_or_make_token(tmp_path / TOKEN_FILE)
    assert with_token("http://127.0.0.1:8780/", tmp_path) == f"http://127.0.0.1:8780/?token={token}"
    assert with_token("http://127.0.0.1:8780/", tmp_path / "elsewhere") == "http://127.0.0.1:8780/"
    assert with_token(None, tmp_path) is None


def test_the_token_is_made_once_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "state" / "monitor-token"
    made = load_or_make_token(path)
    assert len(made) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_make_token(path) == made


async def test_the_dashboard_wants_the_bearer_token_or_the_cookie_its_link_sets() -> None:
    dashboard = Dashboard(CountingSource(), interval=3600.0, token=TOKEN)
    jar = aiohttp.CookieJar(unsafe=True)  # keeps cookies of an address, as a browser does
    async with serving(dashboard) as url, aiohttp.ClientSession(cookie_jar=jar) as http:
        with anyio.fail_after(20):
            for path in ("", "api/cluster", "metrics", "static/app.js"):
                async with http.get(f"{url}{path}") as response:
                    assert response.status == 401, path
            async with http.get(f"{url}api/cluster", headers={"Authorization": "Bearer wrong"}) as response:
                assert response.status == 401
            async with http.get(f"{url}metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as response:
                assert response.status == 200
                assert "streamlet_records_in_total" in await response.text()
            async with http.get(f"{url}?token=wrong", allow_redirects=False) as response:
                assert response.status == 401
            async with http.get(f"{url}?token={TOKEN}") as response:  # the link: a cookie, then the page
                assert response.status == 200
                assert str(response.url) == url
            async with http.get(f"{url}api/cluster") as response:  # the cookie is enough from now on
                assert response.status == 200
    # no cookie: ?token= on any path is served, a wrong one is not
    async with aiohttp.ClientSession() as http, serving(Dashboard(CountingSource(), 3600.0, token=TOKEN)) as url:
        async with http.get(f"{url}api/cluster?token={TOKEN}") as response:
            assert response.status == 200
        async with http.get(f"{url}metrics?token=wrong") as response:
            assert response.status == 401


async def test_a_dashboard_without_a_token_serves_anyone_on_loopback() -> None:
    dashboard = Dashboard(CountingSource(), interval=3600.0)
    async with serving(dashboard) as url, aiohttp.ClientSession() as http, http.get(f"{url}api/cluster") as response:
        assert response.status == 200


async def test_a_workers_metrics_want_the_bearer_token() -> None:
    async def sample() -> dict[str, Any]:
        return worker_sample("worker-1", {}, {}, {}, {"records": 3, "frames": 2, "bytes": 99, "bad_frames": 0})

    def scrape(port: int, token: str | None) -> tuple[int, str]:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    metrics = WorkerMetrics(sample, token=TOKEN)
    try:
        refused = await anyio.to_thread.run_sync(scrape, metrics.port, None)
        wrong = await anyio.to_thread.run_sync(scrape, metrics.port, "nope")
        served = await anyio.to_thread.run_sync(scrape, metrics.port, TOKEN)
    finally:
        metrics.close()
    assert refused == (401, "these metrics need their token: 'Authorization: Bearer <token>'\n")
    assert wrong[0] == 401
    assert served[0] == 200
    assert 'streamlet_tcp_bytes_received_total{worker="worker-1"} 99.0' in served[1]
