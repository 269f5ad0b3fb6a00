"""A worker's own /metrics (``streamlet worker --metrics-port``): prometheus_client's server on a thread,
the sample taken on the worker's event loop at each scrape."""

from __future__ import annotations

import urllib.request
from typing import Any

import anyio
from prometheus_client.parser import text_string_to_metric_families

from streamlet.backends.monitor.worker_metrics import WorkerMetrics, worker_sample


async def test_each_scrape_reads_the_workers_counters_on_its_loop() -> None:
    """Two scrapes: the records counted in between show; the labels name job, task, instance and worker."""
    counted = {"records_in": 10}

    async def sample() -> dict[str, Any]:
        snapshot = {"kind": "task", "records_in": counted["records_in"], "records_out": 0, "batches": 1,
                    "fill": 0.0, "latency": [0] * 40, "ports": [0], "shed": 0}  # fmt: skip
        return worker_sample("worker-7", {"cpu_share": 0.5, "rss_bytes": 1 << 20}, {"wc/count.1": snapshot}, {},
                             {"records": 3, "frames": 2, "bytes": 99, "bad_frames": 0})  # fmt: skip

    def scrape(port: int) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return {f.name: f for f in text_string_to_metric_families(response.read().decode())}

    metrics = WorkerMetrics(sample)
    try:
        first = await anyio.to_thread.run_sync(scrape, metrics.port)
        counted["records_in"] = 25
        second = await anyio.to_thread.run_sync(scrape, metrics.port)
    finally:
        metrics.close()
    [before] = [s for s in first["streamlet_records_in"].samples if s.name.endswith("_total")]
    [after] = [s for s in second["streamlet_records_in"].samples if s.name.endswith("_total")]
    assert before.labels == {"job": "wc", "task": "count", "instance": "1", "worker": "worker-7"}
    assert (before.value, after.value) == (10.0, 25.0)
    [received] = [s for s in second["streamlet_tcp_bytes_received"].samples if s.name.endswith("_total")]
    assert received.value == 99.0
