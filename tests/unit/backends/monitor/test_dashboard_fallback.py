"""The leader's dashboard when its port is taken: served on another, and live there (its /events streams
readings), not closed by the clean-up of the failed bind."""

from __future__ import annotations

import json
import socket

import aiohttp
import anyio

from streamlet.backends.cluster.local.run import DashboardSettings, serve_dashboard
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.store import MemoryClusterStore, MemoryTree

TOKEN = "t0ken"


async def test_a_taken_port_moves_the_dashboard_to_another_that_serves_live_readings() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        store = MemoryClusterStore(MemoryTree())
        async with anyio.create_task_group() as group:
            group.start_soon(serve_dashboard, store, b"secret", "master-0", DashboardSettings("127.0.0.1", port, TOKEN))
            with anyio.fail_after(30):
                while True:
                    published = store.tree.watch(paths.DASHBOARD)  # before looking: a write after it sets it
                    if (found := await store.get(paths.DASHBOARD)) is not None:
                        break
                    await published.wait()
                url = found.data["url"]
                assert url.startswith("http://127.0.0.1:")
                assert not url.endswith(f":{port}/")
                async with aiohttp.ClientSession() as http, http.get(f"{url}events?token={TOKEN}") as events:
                    assert events.status == 200
                    line = await events.content.readline()  # before: the stream ended at once, empty
                    assert line.startswith(b"data: ")
                    assert set(json.loads(line[len(b"data: ") :])) == {"cluster", "jobs"}
            group.cancel_scope.cancel()
