"""Prometheus metrics of streamlet: families named ``streamlet_*`` built at scrape time from samples.

A *sample* is what one worker reports of itself: its heartbeat's load report (CPU share, RSS, every local
instance's statistics snapshot under ``instances``, every local job part's counters under ``jobs``) and
its data server's counters under ``tcp``. A worker's own ``/metrics`` builds its sample locally; the
dashboard's ``/metrics`` reads every worker's heartbeat from ZooKeeper and covers the cluster. Nothing is
counted on the hot path for this: the runtime's counters exist anyway, and a scrape only reads them.

Labels: ``job``, ``task``, ``instance`` (the index), ``port`` (input port) and ``worker``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from streamlet.core.model.histogram import LatencyHistogram

Sample = dict[str, Any]  # {"worker": id, "load": heartbeat load report, "tcp": data server counters}
INSTANCE_LABELS = ["job", "task", "instance", "worker"]
JOB_LABELS = ["job", "worker"]
JOB_COUNTERS = {  # heartbeat "jobs" key -> (family, help)
    "late": ("streamlet_late_records", "Records that reached an event-time window after it closed"),
    "dead_lettered": ("streamlet_dead_letters", "Records a task with on_error='skip' set aside"),
    "dropped": ("streamlet_dropped_records", "Records removed on purpose (past a loop's limit)"),
    "shed": ("streamlet_shed_records", "Records the sources shed under the job's QoS"),
    "restarts": ("streamlet_restarts", "Task instances restarted after a failure"),
    "checkpoints": ("streamlet_checkpoints", "Checkpoints completed"),
}
TCP_COUNTERS = {
    "records": ("streamlet_tcp_records_received", "Records received over TCP"),
    "frames": ("streamlet_tcp_frames_received", "Frames received over TCP"),
    "bytes": ("streamlet_tcp_bytes_received", "Bytes received over TCP, frame headers included"),
    "bad_frames": ("streamlet_tcp_bad_frames", "Frames refused (the connection was closed)"),
    "tls_refused": ("streamlet_tls_refused", "TLS handshakes refused (no certificate, another CA's, too slow)"),
}


def _split(key: str) -> tuple[str, str, str]:
    """``job/task.index`` -> (job, task, index)."""
    job, _, instance = key.partition("/")
    task, _, index = instance.rpartition(".")
    return job, task, index


def _histogram(family: HistogramMetricFamily, labels: list[str], counts: list[int]) -> None:
    """Add a :class:`LatencyHistogram`'s counts (doubling buckets from 1 µs) as cumulative buckets. The
    runtime keeps bucket counts only, so the sum is estimated: each value at the middle of its bucket."""
    buckets, running = [], 0
    for bucket, count in enumerate(counts):
        running += count
        buckets.append((repr((1 << bucket) / 1_000_000), running))
    buckets.append(("+Inf", running))
    middle = sum(0.75 * (1 << bucket) / 1_000_000 * count for bucket, count in enumerate(counts))
    family.add_metric(labels, buckets, middle)


def families(samples: Iterable[Sample]) -> list[Metric]:
    """Every ``streamlet_*`` family for ``samples``."""
    records_in = CounterMetricFamily("streamlet_records_in", "Records into an instance", labels=INSTANCE_LABELS)
    records_out = CounterMetricFamily("streamlet_records_out", "Records out of an instance", labels=INSTANCE_LABELS)
    batches = CounterMetricFamily("streamlet_batches", "Batches an instance processed", labels=INSTANCE_LABELS)
    shed = CounterMetricFamily("streamlet_instance_shed_records", "Records a source shed", labels=INSTANCE_LABELS)
    held = CounterMetricFamily(
        "streamlet_loop_blocked_seconds",
        "Seconds calls of a task's user code held the event loop, each past the job's loop_warning",
        labels=INSTANCE_LABELS,
    )
    fill = GaugeMetricFamily("streamlet_queue_fill", "The fullest input channel's share of its capacity",
                             labels=INSTANCE_LABELS)  # fmt: skip
    lag = GaugeMetricFamily(
        "streamlet_lag_items",
        "Items (batches, markers) waiting at an input port: how far it lags its senders",
        labels=["job", "task", "instance", "port", "worker"],
    )
    latency = HistogramMetricFamily(
        "streamlet_latency_seconds",
        "Seconds from a batch's arrival to the end of its processing",
        labels=INSTANCE_LABELS,
    )
    job_counters = {
        key: CounterMetricFamily(name, text, labels=JOB_LABELS) for key, (name, text) in JOB_COUNTERS.items()
    }
    checkpoint = HistogramMetricFamily(
        "streamlet_checkpoint_duration_seconds",
        "Seconds from a checkpoint's start to its completion",
        labels=JOB_LABELS,
    )
    tcp = {key: CounterMetricFamily(name, text, labels=["worker"]) for key, (name, text) in TCP_COUNTERS.items()}
    cpu = GaugeMetricFamily("streamlet_worker_cpu_share", "Share of a core the worker used", labels=["worker"])
    rss = GaugeMetricFamily("streamlet_worker_rss_bytes", "Resident memory of the worker", labels=["worker"])
    loop_lag = GaugeMetricFamily(
        "streamlet_loop_lag_seconds", "How late the worker's event loop runs a 100 ms tick", labels=["worker"]
    )
    for sample in samples:
        worker, load = str(sample["worker"]), sample.get("load") or {}
        cpu.add_metric([worker], float(load.get("cpu_share", 0.0)))
        rss.add_metric([worker], float(load.get("rss_bytes", 0)))
        loop_lag.add_metric([worker], float(load.get("loop_lag", 0.0)))
        for key, snapshot in (load.get("instances") or {}).items():
            job, task, index = _split(key)
            labels = [job, task, index, worker]
            records_in.add_metric(labels, snapshot["records_in"])
            records_out.add_metric(labels, snapshot["records_out"])
            batches.add_metric(labels, snapshot["batches"])
            shed.add_metric(labels, snapshot.get("shed", 0))
            held.add_metric(labels, float(snapshot.get("loop_held", 0.0)))
            fill.add_metric(labels, snapshot["fill"])
            for port, queued in enumerate(snapshot.get("ports") or []):
                lag.add_metric([job, task, index, str(port), worker], queued)
            if snapshot["kind"] != "source":
                _histogram(latency, labels, snapshot["latency"])
        for job, counters in (load.get("jobs") or {}).items():
            for key, family in job_counters.items():
                family.add_metric([job, worker], counters.get(key, 0))
            durations = counters.get("checkpoint_durations") or [0] * LatencyHistogram.BUCKETS
            _histogram(checkpoint, [job, worker], durations)
        for key, family in tcp.items():
            family.add_metric([worker], (sample.get("tcp") or {}).get(key, 0))
    return [records_in, records_out, batches, shed, held, fill, lag, latency, *job_counters.values(), checkpoint,
            *tcp.values(), cpu, rss, loop_lag]  # fmt: skip


class StreamletCollector(Collector):
    """A Prometheus collector that asks ``samples()`` at every scrape."""

    def __init__(self, samples: Callable[[], list[Sample]]) -> None:
        self.samples = samples

    def collect(self) -> Iterator[Metric]:
        """The families for the samples now."""
        yield from families(self.samples())


def exposition(samples: list[Sample]) -> bytes:
    """The Prometheus text format for ``samples`` (what ``/metrics`` answers)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StreamletCollector(lambda: samples))
    return generate_latest(registry)
