"""``sl.start(topology, monitor_port=0)``: the job's dashboard view, JSON, live events and /metrics over real
HTTP on loopback, read-only."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import aiohttp
import anyio
from prometheus_client.parser import text_string_to_metric_families

import streamlet as sl


def gated(gate: anyio.Event) -> sl.Topology:
    """numbers -> double -> out, where double holds every batch after the first until ``gate`` is set: the job
    is provably running (with records counted) while the test looks."""

    class Double(sl.Task):
        seen = 0

        async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            if Double.seen:
                await gate.wait()
            Double.seen += 1
            outputs.emit_batch([sl.Record(r.key, r.value * 2, r.ts) for r in inputs.get()])

    topology = sl.Topology("demo")
    numbers = topology.add_source("numbers", list(range(5000)))
    double = topology.add_task("double", Double).set_input(numbers)
    topology.add_sink("out", sl.CollectSink()).set_input(double)
    return topology


@asynccontextmanager
async def served() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """The gated job with its monitor, and an HTTP client; the gate opens and the job ends afterwards."""
    gate = anyio.Event()
    async with sl.start(gated(gate), monitor_port=0, batch_size=1000) as job, aiohttp.ClientSession() as http:
        yield job.endpoints["monitor"], http
        gate.set()
        await job.wait()


async def views(url: str, http: aiohttp.ClientSession) -> AsyncIterator[dict[str, Any]]:
    """The live feed's views, one per refresh."""
    async with http.get(f"{url}events") as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        async for line in stream.content:
            if line.startswith(b"data: "):
                yield json.loads(line.decode().removeprefix("data: "))


async def test_the_job_view_shows_its_graph_instances_and_counts() -> None:
    """The first batch went through double (1000 records in and out: the live feed says so at a refresh);
    the graph is the topology's; /api/jobs/demo holds the same view; / is the page."""
    async with served() as (url, http):
        with anyio.fail_after(10):
            async with aclosing(views(url, http)) as feed:
                async for pushed in feed:
                    view = pushed["jobs"]["demo"]
                    [double] = [task for task in view["tasks"] if task["name"] == "double"]
                    if double["instances"][0]["records_out"] == 1000:
                        break
        assert view["state"] == "RUNNING"
        assert [node["name"] for node in view["graph"]["nodes"]] == ["numbers", "double", "out"]
        assert [(e["from"], e["to"]) for e in view["graph"]["edges"]] == [("numbers", "double"), ("double", "out")]
        assert double["instances"][0]["worker"] == "local"
        async with http.get(f"{url}api/jobs/demo") as response:
            assert (await response.json())["graph"]["nodes"] == view["graph"]["nodes"]
        async with http.get(url) as page:
            assert page.status == 200
            assert "<title>streamlet</title>" in await page.text()


async def test_metrics_parse_and_nothing_but_get_is_served() -> None:
    """/metrics parses with prometheus_client's parser; POST, PUT and DELETE are refused (405) everywhere."""
    async with served() as (url, http):
        async with http.get(f"{url}metrics") as response:
            families = {f.name: f for f in text_string_to_metric_families(await response.text())}
        assert {s.labels["task"] for s in families["streamlet_records_in"].samples} == {"numbers", "double", "out"}
        for method in ("POST", "PUT", "DELETE"):
            for path in ("", "api/jobs/demo", "metrics", "events"):
                async with http.request(method, f"{url}{path}") as refused:
                    assert refused.status == 405, (method, path)


async def test_an_unknown_job_is_not_found_and_the_feed_is_of_one_job_without_a_cluster() -> None:
    """/api/jobs/other: 404; the feed's first view has the one job and no cluster."""
    async with served() as (url, http):
        async with http.get(f"{url}api/jobs/other") as response:
            assert response.status == 404
        with anyio.fail_after(10):
            async with aclosing(views(url, http)) as feed:
                first = await anext(feed)
        assert list(first["jobs"]) == ["demo"]
        assert first["cluster"]["cluster"] is None
