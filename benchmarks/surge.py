"""A tenfold surge on a local cluster, with the adaptation policies on and off.

``benchmarks.surge_job`` (an open-loop generator at a fifth of one instance's
capacity, ten times that for 20 s, then back) runs twice on a local cluster
(ZooKeeper, a master, 2 workers): with ``--adapt autoscale,shed`` (bounds
1..4 instances of ``work``, heartbeats and windows of 1 s, 1 s cooldown) under the topology's
``QoS(max_latency=1 s, max_shed_ratio=0.5)``, and without any policy. Latency
counts from each record's *due* time. Figures: ``p99_ms`` / ``p99_ms_without``
(every delivered record), ``shed_ratio`` (records shed / generated),
``autoscale_decisions``, ``records_lost`` (generated - delivered - shed: 0
when every record is accounted for), ``records_per_s`` / ``baseline_records_per_s``
(delivered per second of the run, on / off). ``--plot FILE`` draws
throughput, p99 latency, parallelism and shed rate over time (matplotlib).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio

from benchmarks.surge_job import BEFORE, QOS, SURGE, TOTAL
from streamlet.adaptation.settings import AdaptSettings

STARTUP = 1.0  # about the seconds from submitting to the generator's start
ADAPT = AdaptSettings(frozenset({"autoscale", "shed"}), {"work": (1, 4)}, interval=1.0, cooldown=1.0)


def main(plot: str | None) -> dict[str, Any]:
    """Both runs on one local cluster; the line, and the plot when asked."""
    from streamlet.backends.cluster.local import local_cluster

    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "out").mkdir()
        os.environ.update({
            "STREAMLET_BENCH_OUT": str(root / "out"),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
        })  # fmt: skip
        # heartbeats every second (--heartbeat 0.5 measured no better: 1.15 and 0.70 s p99, 4 decisions)
        state = local_cluster.up(root / "state", "surge", 2, 1, None, capacity=8, heartbeat=1.0)
        try:
            anyio.run(_ready, state)
            on = _run(state, root / "out", "surge-on", ADAPT)
            off = _run(state, root / "out", "surge-off", None)
        finally:
            local_cluster.down(root / "state")
    if plot:
        _plot(on, Path(plot))
    decisions = on["decisions"]
    return {
        "name": "surge",
        "records_per_s": round(on["delivered"] / on["seconds"]),
        "baseline_records_per_s": round(off["delivered"] / off["seconds"]),
        "ratio": round((on["delivered"] / on["seconds"]) / (off["delivered"] / off["seconds"]), 3),
        "p99_ms": on["p99_ms"],
        "p99_ms_without": off["p99_ms"],
        "p50_ms": on["p50_ms"],
        "p50_ms_without": off["p50_ms"],
        "qos_latency_ms": round(QOS.max_latency * 1000),
        "shed_ratio": round(on["shed"] / TOTAL, 4),
        "qos_max_shed_ratio": QOS.max_shed_ratio,
        "autoscale_decisions": sum(1 for d in decisions if d["policy"] == "autoscale"),
        "autoscale_decisions_per_step": _per_step(decisions, on["began"]),
        "shed_decisions": sum(1 for d in decisions if d["policy"] == "shed"),
        "decisions": [f"{round(d['at'] - on['began'], 1)} s: {d['action']}" for d in decisions],
        "records_lost": TOTAL - on["delivered"] - on["shed"],
        "records_lost_without": TOTAL - off["delivered"] - off["shed"],
        "generated": TOTAL,
        "seconds": round(on["seconds"], 1),
        "seconds_without": round(off["seconds"], 1),
    }


def _per_step(decisions: list[dict[str, Any]], began: float) -> list[int]:
    """Autoscale decisions after the step up (until the surge ends) and after the step down."""
    ends = began + BEFORE + SURGE + STARTUP
    scaling = [d for d in decisions if d["policy"] == "autoscale"]
    return [sum(1 for d in scaling if d["at"] < ends), sum(1 for d in scaling if d["at"] >= ends)]


async def _ready(state: Any) -> None:
    from streamlet.backends.cluster.client.status import wait_until_ready

    await wait_until_ready(state.settings(), 2)


def _run(state: Any, out: Path, name: str, adapt: AdaptSettings | None) -> dict[str, Any]:
    from streamlet.backends.cluster.client import api as client

    settings = None if adapt is None else adapt.to_data()
    submission = client.Submission("benchmarks.surge_job:surge", name, {}, None, None, settings)
    began = time.time()
    anyio.run(client.submit_and_wait, state.settings(), submission, True, 300)
    ended = time.time()
    status = {s["job"]: s for s in anyio.run(client.list_jobs, state.settings())}[name]
    delivered, latency, per_second = _read(out, name, "out")
    shed, _, shed_per_second = _read(out, name, "dropped")
    return {
        "began": began,
        "seconds": ended - began,
        "delivered": delivered,
        "shed": shed,
        "p99_ms": _quantile(latency, 0.99),
        "p50_ms": _quantile(latency, 0.5),
        "decisions": sorted(status.get("decisions", []), key=lambda d: d["at"]),
        "per_second": per_second,
        "shed_per_second": shed_per_second,
    }


def _read(out: Path, job: str, sink: str) -> tuple[int, dict[int, int], dict[int, dict[str, Any]]]:
    """Records, the latency histogram (ms -> records) and per-second figures of one sink of one job."""
    total, latency = 0, defaultdict(int)
    seconds: dict[int, dict[str, Any]] = defaultdict(lambda: {"count": 0, "latency": defaultdict(int)})
    pattern = re.compile(rf"\.{re.escape(job)}-{sink}-\d+\.json$")
    for path in out.iterdir():
        if not pattern.search(path.name):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        for second, count in data["counts"].items():
            total += count
            seconds[int(second)]["count"] += count
        for second, histogram in data["latency"].items():
            for ms, count in histogram.items():
                latency[int(ms)] += count
                seconds[int(second)]["latency"][int(ms)] += count
    return total, dict(latency), dict(seconds)


def _quantile(histogram: dict[int, int], q: float) -> float | None:
    total = sum(histogram.values())
    seen = 0
    for ms in sorted(histogram):
        seen += histogram[ms]
        if seen >= q * total:
            return float(ms)
    return None


def _plot(run: dict[str, Any], path: Path) -> None:
    """Throughput, p99 latency, parallelism and shed rate per second of the run with the policies on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = int(run["began"])
    seconds = sorted(set(run["per_second"]) | set(run["shed_per_second"]))
    xs = [second - start for second in seconds]
    delivered = [run["per_second"].get(second, {"count": 0})["count"] for second in seconds]
    shed = [run["shed_per_second"].get(second, {"count": 0})["count"] for second in seconds]
    p99 = [_quantile(run["per_second"].get(second, {"latency": {}})["latency"], 0.99) for second in seconds]
    steps = [
        (d["at"] - start, int(d["action"].rsplit("-> ", 1)[1])) for d in run["decisions"] if d["policy"] == "autoscale"
    ]
    times = [0.0, *(at for at, _ in steps), float(xs[-1])]
    parallelism = [1, *(count for _, count in steps)]
    parallelism.append(parallelism[-1])
    figure, axes = plt.subplots(4, 1, sharex=True, figsize=(8, 9))
    axes[0].plot(xs, delivered, label="delivered")
    axes[0].set_ylabel("records/s")
    axes[1].plot(xs, [None if v is None else v / 1000 for v in p99], color="tab:red")
    axes[1].axhline(QOS.max_latency, linestyle="--", color="grey", label="QoS")
    axes[1].set_ylabel("p99 latency (s)")
    axes[1].legend()
    axes[2].step(times, parallelism, where="post", color="tab:green")
    axes[2].set_ylabel("instances of work")
    axes[3].plot(xs, shed, color="tab:orange")
    axes[3].set_ylabel("shed records/s")
    axes[3].set_xlabel("seconds")
    figure.suptitle("surge: 10x the load for 20 s, --adapt autoscale,shed, QoS 1 s / 50 %")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
