"""What watching a job costs: the wordcount job served with its dashboard and scraped, against the same job
unwatched, in the same run.

Watched: ``sl.start(topology, monitor_port=0)`` while a client thread, in rounds, scrapes ``/metrics`` and
reads ``/api/jobs/<job>``, starting a round 0.1 s after the last one was answered (it asks for up to ten a
second, ten times what a Prometheus server scraping every second would; the job's busy event loop answers
fewer: ``scrapes_per_s`` is the rounds answered a second), and the dashboard refreshes its views every
second. Unwatched: ``sl.start(topology)``. The figure is the
watched records/s, the baseline the unwatched, medians of alternating repeats. Also: the idle RSS of a
worker and of a master serving the dashboard on a local cluster (MiB).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

import anyio

import streamlet as sl
from benchmarks.common import alternating, median_rate, report
from benchmarks.wordcount import build, make_words

SCRAPE_EVERY = 0.1


def _scrape_until(url: str, job: str, stop: threading.Event, scrapes: list[int]) -> None:
    while not stop.wait(SCRAPE_EVERY):
        for path in ("metrics", f"api/jobs/{job}"):
            with urllib.request.urlopen(f"{url}{path}", timeout=10) as response:
                response.read()
        scrapes[0] += 1  # a round: one scrape of /metrics and one read of the job's view


async def _run(words: list[str], watched: bool, scrapes: list[int]) -> dict[str, int]:
    topology = build(words)
    async with sl.start(topology, monitor_port=0 if watched else None) as job:
        stop = threading.Event()
        scraper = None
        if watched:
            args = (job.endpoints["monitor"], topology.name, stop, scrapes)
            scraper = threading.Thread(target=_scrape_until, args=args, daemon=True)
            scraper.start()
        result = await job.wait()
        stop.set()
        if scraper is not None:
            await anyio.to_thread.run_sync(scraper.join)
    return {record.key: record.value for record in result.sink("totals")}


def main(records: int, repeats: int) -> dict[str, Any]:
    """Watched and unwatched ``repeats`` times each, alternating; medians."""
    words = make_words(records)
    scrapes = [0]
    timings = alternating(repeats, {
        "watched": lambda: anyio.run(_run, words, True, scrapes, backend_options={"use_uvloop": True}),
        "plain": lambda: anyio.run(_run, words, False, scrapes, backend_options={"use_uvloop": True}),
    })  # fmt: skip
    if any(counts != timings["plain"][0][1] for _, counts in timings["watched"]):
        raise AssertionError("the watched and the plain job disagree on the counts")
    watched = median_rate(records, [seconds for seconds, _ in timings["watched"]])
    plain = median_rate(records, [seconds for seconds, _ in timings["plain"]])
    seconds = sum(s for s, _ in timings["watched"])
    return report(
        "monitor", watched, plain, scrapes_per_s=round(scrapes[0] / seconds, 1), records=records, repeats=repeats,
        **idle_rss(),
    )  # fmt: skip


def idle_rss() -> dict[str, float]:
    """Idle RSS (MiB) of a worker and of the leading master (serving the dashboard) on a local cluster."""
    import tempfile
    from pathlib import Path

    from benchmarks.cluster import rss_mb
    from streamlet.backends.cluster.client.status import wait_until_ready
    from streamlet.backends.cluster.local import local_cluster

    with tempfile.TemporaryDirectory() as directory:
        state = local_cluster.up(Path(directory), "rss", 1, 1, None)
        try:
            anyio.run(wait_until_ready, state.settings(), 1)
            time.sleep(3.0)  # a few heartbeats and dashboard refreshes: idle, not starting
            rss = {p["role"]: rss_mb(int(p["pid"])) for p in state.processes if p["role"] in ("master", "worker")}
        finally:
            local_cluster.down(Path(directory))
    return {"idle_worker_rss_mb": rss["worker"], "idle_master_with_dashboard_rss_mb": rss["master"]}
