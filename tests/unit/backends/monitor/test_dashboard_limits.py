"""The dashboard bounds what its clients cost: scrapes read nothing themselves, live views are capped."""

from __future__ import annotations

from contextlib import aclosing

import aiohttp
import anyio

from streamlet.backends.monitor.server import Dashboard, serving
from streamlet.backends.monitor.views import Reading
from tests.unit.backends.monitor.test_views_and_metrics import reading


class CountingSource:
    """A source whose every read is counted: what the cluster would pay."""

    def __init__(self) -> None:
        self.reads = 0

    async def read(self) -> Reading:
        self.reads += 1
        return reading(float(self.reads), 10 * self.reads, [0.01])


async def test_metrics_scrapes_are_served_from_the_last_reading() -> None:
    """Ten scrapes between two refreshes read the cluster not once more, and show the last reading's counts."""
    source = CountingSource()
    dashboard = Dashboard(source, interval=3600.0)  # one refresh at start, none during the test
    async with serving(dashboard) as url, aiohttp.ClientSession() as http:
        with anyio.fail_after(10):
            async with aclosing(dashboard.updates()) as updates:
                await anext(updates)  # the first refresh is in
        reads = source.reads
        bodies = []
        for _ in range(10):
            async with http.get(f"{url}metrics") as response:
                assert response.status == 200
                bodies.append(await response.text())
    assert source.reads == reads == 1
    assert len(set(bodies)) == 1
    assert 'streamlet_records_in_total{instance="0",job="wc",task="count",worker="w1"} 10.0' in bodies[0]


async def test_live_views_past_the_cap_are_refused_and_counted() -> None:
    """With max_streams=2, a third /events stream gets 503 naming the cap; the two open ones keep streaming."""
    dashboard = Dashboard(CountingSource(), interval=3600.0, max_streams=2)
    async with serving(dashboard) as url, aiohttp.ClientSession() as http:
        with anyio.fail_after(10):
            first = await http.get(f"{url}events")
            second = await http.get(f"{url}events")
            for stream in (first, second):
                assert (await stream.content.readline()).startswith(b"data: ")
            async with http.get(f"{url}events") as third:
                assert third.status == 503
                assert await third.text() == "2 live views are open: no more at once"
            assert (dashboard.streams, dashboard.refused_streams) == (2, 1)
            first.close()
            second.close()
