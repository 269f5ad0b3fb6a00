"""The worker's load report: CPU share over the last heartbeat, queue depths, and the overload verdict."""

from __future__ import annotations

from typing import Any

from streamlet.backends.cluster.worker.load_meter import LoadMeter, QueueDepths


class Process:
    """A fake process whose CPU seconds and wall clock the test moves."""

    def __init__(self) -> None:
        self.cpu = 10.0
        self.now = 100.0

    def sample(self) -> dict[str, Any]:
        return {"cpu_seconds": self.cpu, "rss_bytes": 30 << 20, "pid": 1}

    def run(self, wall: float, cpu: float) -> None:
        self.now += wall
        self.cpu += cpu


def meter(process: Process, depths: QueueDepths) -> LoadMeter:
    return LoadMeter(lambda: depths, sample=process.sample, clock=lambda: process.now)


def test_a_busy_loop_with_a_full_inbox_is_overloaded() -> None:
    """95% of a core and senders waiting on count.1: OVERLOADED, and the report names the backed-up instance."""
    process = Process()
    depths = {"wc/count.0": (1, False), "wc/count.1": (4, True)}
    load = meter(process, depths)
    first = load()
    assert (first["cpu_share"], first["overloaded"]) == (0.0, False)  # no interval measured yet
    process.run(wall=1.0, cpu=0.95)
    report = load()
    assert report["cpu_share"] == 0.95
    assert report["queues"] == {"wc/count.0": 1, "wc/count.1": 4}
    assert report["backed_up"] == ["wc/count.1"]
    assert report["overloaded"] is True


def test_busy_but_keeping_up_is_normal() -> None:
    """A saturated core whose inboxes still have room is not overloaded."""
    process = Process()
    load = meter(process, {"wc/count.0": (1, False)})
    load()
    process.run(wall=2.0, cpu=2.0)
    report = load()
    assert (report["cpu_share"], report["overloaded"]) == (1.0, False)


def test_a_full_inbox_behind_an_idle_loop_is_normal() -> None:
    """A full inbox while the process idles (a slow await downstream) needs no other worker."""
    process = Process()
    load = meter(process, {"wc/slow.0": (2, True)})
    load()
    process.run(wall=1.0, cpu=0.1)
    report = load()
    assert (report["cpu_share"], report["backed_up"], report["overloaded"]) == (0.1, ["wc/slow.0"], False)
