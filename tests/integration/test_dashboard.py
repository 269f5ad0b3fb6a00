"""The dashboard of a real 2-worker cluster in a real headless Chromium (Debian's, driven by Playwright), and
the cluster's /metrics scraped twice: what a user opening the page and a Prometheus server would see."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import running_cluster, stop_submitter, streamlet, wait_for_node, wait_for_state

pytestmark = pytest.mark.integration
CHROMIUM = "/usr/bin/chromium"  # Debian's (make test installs it); Playwright's own download cannot work here
# the flags Chromium needs as root in a sandbox with a closed network (see the machine notes)
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip
SCREENSHOT = "dashboard.png"

PACED_COUNT = """
import asyncio
import streamlet as sl

class Paced(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.05)  # pacing: about 20 batches a second for a minute, so rates are live
        outputs.emit_batch([sl.Record(r.value % 50, 1, r.ts) for r in inputs.get()])

class Count(sl.Task):
    def execute(self, inputs, outputs):
        for r in inputs.get():
            self.state.put(r.key, self.state.get(r.key, 0) + r.value)

def build_topology():
    topology = sl.Topology("paced")
    numbers = topology.add_source("numbers", range(1_000_000))
    paced = topology.add_task("paced", Paced).set_input(numbers)
    count = topology.add_task("count", Count, parallelism=2).set_input(paced, partitioning=sl.SAME_KEY)
    return topology
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """ZooKeeper, a master and two workers of capacity 2 (a 4-instance job spreads over both), each on its own
    loopback address, for this module's tests; every PID is stopped afterwards."""
    directory = tmp_path_factory.mktemp("dashboard")
    with running_cluster(directory, "--workers", "2", "--capacity", "2", "--name", "dash", "--loopback-hosts") as up:
        yield up


@pytest.fixture(scope="module")
def running_job(cluster: dict[str, Any]) -> Iterator[str]:
    """The paced count, RUNNING on both workers; killed afterwards. Yields the dashboard's URL."""
    directory = cluster["dir"]
    (directory / "paced.py").write_text(PACED_COUNT, encoding="utf-8")
    command = [sys.executable, "-m", "streamlet.cli", "submit", "paced.py", "--job", "paced"]
    submit = subprocess.Popen(command, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        running = wait_for_state(directory, "paced", {"RUNNING"})
        assert sorted(running["reason"].removeprefix("running on ").split(", ")) == ["worker-0", "worker-1"]
        for worker in ("worker-0", "worker-1"):  # heartbeats that carry the job's instances
            wait_for_node(
                directory, f"/loads/{worker}", lambda load: any(k.startswith("paced/") for k in load["instances"])
            )
        status = json.loads(streamlet("cluster", "status", "--json", cwd=directory).stdout)
        token = (directory / ".streamlet" / "monitor-token").read_text().strip()
        assert status["dashboard"].startswith("http://127.0.0.1:")
        assert status["dashboard"].endswith(f"/?token={token}")  # the URL to open as it is
        yield status["dashboard"]
    finally:
        streamlet("kill", "paced", cwd=directory)
        stop_submitter(submit)


def carries_paced(load: dict[str, Any]) -> bool:
    """A worker's heartbeat counts instances of the job."""
    return any(key.startswith("paced/") for key in load.get("instances", {}))


def artifacts(tmp_path: Path) -> Path:
    """Where the screenshot goes: ``STREAMLET_ARTIFACTS`` when set (CI keeps it), else the test's folder."""
    folder = Path(os.environ.get("STREAMLET_ARTIFACTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def render(url: str, screenshot: Path) -> dict[str, Any]:
    """Open the dashboard, wait until it shows both workers, the job, its tasks and a non-zero rate; return
    what it shows, and save a screenshot."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 1000})
            await page.goto(url)
            # the live feed redraws every second: wait (on the page) until a task instance shows records moving
            await page.wait_for_function(
                """() => [...document.querySelectorAll('#tasks tbody tr')].some(
                       (row) => parseFloat(row.cells[3].textContent) > 0)""",
                timeout=30_000,
            )
            shown = {
                "workers": await page.locator("#workers tbody tr td:first-child").all_text_contents(),
                "jobs": await page.locator("#jobs tbody tr td:first-child").all_text_contents(),
                "job": await page.locator("#job-name").text_content(),
                "tasks": await page.locator("#tasks tbody tr td:first-child").all_text_contents(),
                "rates": await page.locator("#tasks tbody tr td:nth-child(4)").all_text_contents(),
                "graph": await page.locator("#graph text").all_text_contents(),
                "leader": await page.locator("#leader").text_content(),
            }
            await page.screenshot(path=str(screenshot), full_page=True)
            return shown
        finally:
            await browser.close()


def test_the_dashboard_shows_both_workers_the_job_its_tasks_and_live_rates_in_chromium(
    running_job: str, tmp_path: Path
) -> None:
    """Rendered by Chromium: workers 0 and 1, job 'paced' with its three tasks (4 instances) and a rate above
    zero, the topology drawn; a screenshot is saved as a test artifact."""
    assert shutil.which(CHROMIUM) is not None, f"no browser at {CHROMIUM}: 'make test' installs Debian's chromium"
    screenshot = artifacts(tmp_path) / SCREENSHOT
    shown = anyio.run(render, running_job, screenshot)
    assert shown["workers"] == ["worker-0", "worker-1"]
    assert shown["jobs"] == ["paced"]
    assert shown["job"] == "paced"
    assert shown["tasks"] == ["numbers", "paced", "count", "count"]
    assert any(float(rate) > 0 for rate in shown["rates"])
    assert {"numbers x1", "paced x1", "count x2"} <= set(shown["graph"])
    assert shown["leader"].startswith("leader master-0 (epoch 1)")
    assert screenshot.stat().st_size > 10_000


def at(url: str, path: str) -> str:
    """``path`` on the dashboard whose URL (with its ``?token=``) is ``url``, carrying the token."""
    base, _, query = url.partition("?")
    return f"{base}{path}?{query}"


def scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(at(url, "metrics"), timeout=10) as response:
        return {family.name: family for family in text_string_to_metric_families(response.read().decode())}


def wait_for_a_reading_begun_after_now(url: str) -> None:
    """Follow /events: the views now (reading N), then N+1 (which may have begun before this call), then N+2,
    which began after N+1 was published, so after this call."""
    with urllib.request.urlopen(at(url, "events"), timeout=30) as events:
        seen = 0
        while seen < 3:
            line = events.readline()
            assert line, "the dashboard ended its live view"
            seen += line.startswith(b"data: ")


def records_in(families: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["task"], s.labels["instance"], s.labels["worker"]): s.value
        for s in families["streamlet_records_in"].samples
        if s.name == "streamlet_records_in_total" and s.labels["job"] == "paced"
    }


def test_the_cluster_metrics_cover_every_worker_and_counters_grow_between_scrapes(
    running_job: str, cluster: dict[str, Any]
) -> None:
    """/metrics on the dashboard, parsed by prometheus_client: every instance of the job with its worker;
    what 'paced' counted grows from one scrape to one taken after its worker's next heartbeat."""
    first = scrape(running_job)
    before = records_in(first)
    assert {(task, index) for task, index, _ in before} == {
        ("numbers", "0"), ("paced", "0"), ("count", "0"), ("count", "1"),
    }  # fmt: skip
    assert {worker for _, _, worker in before} == {"worker-0", "worker-1"}
    assert first["streamlet_latency_seconds"].type == "histogram"
    [paced] = [key for key in before if key[0] == "paced"]
    beat = wait_for_node(cluster["dir"], f"/loads/{paced[2]}", lambda data: True)["beat"]
    wait_for_node(cluster["dir"], f"/loads/{paced[2]}", lambda data: data["beat"] > beat)
    wait_for_a_reading_begun_after_now(running_job)  # /metrics serves the dashboard's last reading
    after = records_in(scrape(running_job))
    assert after[paced] > before[paced]
    assert all(after[key] >= value for key, value in before.items())


@pytest.mark.parametrize("path", ["", "api/cluster", "api/jobs/paced", "events", "metrics"])
def test_without_its_token_the_dashboard_on_loopback_shows_nothing(running_job: str, path: str) -> None:
    """Any local user reaches 127.0.0.1: the page, the API, the live view and /metrics answer 401 without the
    token (or with another), as the security model says job data is for secret holders only."""
    base = running_job.partition("?")[0]
    for url in (f"{base}{path}", f"{base}{path}?token=not-the-token"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        refused.value.close()  # the error holds the answer's socket open until closed
        assert refused.value.code == 401, url
