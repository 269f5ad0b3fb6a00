"""``streamlet top``'s frames and ``submit``'s progress line from heartbeats in memory, and how ``jobs`` lists
a failed job and one with dead letters."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from streamlet.backends.cluster.client.api import describe_listed
from streamlet.backends.cluster.client.terminal import progress_line, render_frame
from streamlet.backends.cluster.client.top import Flow, HeartbeatRates, flow_rates, read_frame
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.election import LeaderElection
from streamlet.backends.cluster.tree.store import MemoryClusterStore
from tests.unit.backends.cluster.conftest import MemoryCluster


def beat(ts: float, **instances: tuple[str, int, int]) -> dict[str, Any]:
    """A heartbeat at ``ts`` whose instances (``"job/node.index"`` with ``/`` written ``__``) have
    (kind, records in, records out)."""
    counters = {
        name.replace("__", "/"): {"kind": kind, "records_in": records_in, "records_out": records_out}
        for name, (kind, records_in, records_out) in instances.items()
    }
    return {"ts": ts, "beat": int(ts), "cpu_share": 0.25, "rss_bytes": 31 * 2**20, "queues": {}, "instances": counters}


def test_rates_are_source_records_out_and_sink_records_in_per_second() -> None:
    """Two beats 2 s apart: the source emitted 400 more (200/s), the sink took 300 more (150/s); a task's
    counters count for neither; another job is apart."""
    before = beat(10.0, wc__in_0=("source", 0, 100), wc__split_0=("task", 100, 900), wc__out_0=("sink", 50, 0))
    after = beat(12.0, wc__in_0=("source", 0, 500), wc__split_0=("task", 500, 4000), wc__out_0=("sink", 350, 0),
                 other__in_0=("source", 0, 20))  # fmt: skip
    assert flow_rates(before, after) == {"wc": Flow(200.0, 150.0), "other": Flow(10.0, 0.0)}


def test_a_counter_that_went_back_counts_from_zero() -> None:
    """A new attempt's instance starts at 0: 30 records in 3 s is 10/s, not a negative rate."""
    before = beat(1.0, wc__in_0=("source", 0, 900))
    after = beat(4.0, wc__in_0=("source", 0, 30))
    assert flow_rates(before, after) == {"wc": Flow(10.0, 0.0)}


def test_rates_are_known_once_every_worker_beat_twice() -> None:
    """The same beat read twice is no second beat; rates add up over workers; a worker gone is forgotten."""
    rates = HeartbeatRates()
    rates.update({"w0": beat(1.0, wc__in_0=("source", 0, 0)), "w1": beat(1.5, wc__out_0=("sink", 0, 0))})
    rates.update({"w0": beat(2.0, wc__in_0=("source", 0, 100)), "w1": beat(1.5, wc__out_0=("sink", 0, 0))})
    assert (rates.complete(), rates.rates()) == (False, {"wc": Flow(100.0, 0.0)})
    rates.update({"w0": beat(2.0, wc__in_0=("source", 0, 100)), "w1": beat(2.5, wc__out_0=("sink", 80, 0))})
    assert (rates.complete(), rates.rates(), rates.totals()) == (True, {"wc": Flow(100.0, 80.0)}, {"wc": Flow(100, 80)})
    rates.update({"w0": beat(2.0, wc__in_0=("source", 0, 100))})
    assert (sorted(rates.pairs), rates.totals()) == (["w0"], {"wc": Flow(100.0, 0.0)})


def test_beats_of_one_sample_are_one_sample_and_rates_span_the_samples() -> None:
    """A heart thread beats on its own clock and may send the loop's last sample twice: a beat with a new
    ``ts`` but the same ``sampled`` is no second sample (no rate of 0 from it), and the rate divides by the
    seconds between the samples (2.5 s), not between the beats."""
    rates = HeartbeatRates()
    rates.update({"w0": {**beat(1.0, wc__in_0=("source", 0, 100)), "sampled": 0.5}})
    rates.update({"w0": {**beat(2.0, wc__in_0=("source", 0, 100)), "sampled": 0.5}})
    assert (rates.complete(), rates.rates()) == (False, {})
    rates.update({"w0": {**beat(3.0, wc__in_0=("source", 0, 600)), "sampled": 3.0}})
    assert (rates.complete(), rates.rates()) == (True, {"wc": Flow(200.0, 0.0)})


async def test_a_frame_shows_workers_and_jobs_with_rates(cluster: MemoryCluster) -> None:
    """top's frame: the leader, each worker's state, load, CPU, RSS and instance count, and each job's state,
    attempt, rates and totals from the last two heartbeats."""
    await LeaderElection(MemoryClusterStore(cluster.tree), {"name": "master-0"}).campaign()
    await cluster.add_worker("worker-0")
    await cluster.add_worker("worker-1")
    await cluster.submit("wc")
    await cluster.leader.round()
    rates = HeartbeatRates()
    first = {"worker-0": beat(10.0, wc__numbers_0=("source", 0, 40)), "worker-1": beat(10.0)}
    second = {
        "worker-0": beat(11.0, wc__numbers_0=("source", 0, 1040), wc__double_0=("task", 500, 500)),
        "worker-1": beat(12.0, wc__double_1=("task", 500, 500), wc__out_0=("sink", 700, 0)),
    }
    for loads in (first, second):
        for worker, load in loads.items():
            await cluster.workers[worker].set(paths.load(worker), load)
        frame = await read_frame(cluster.client, rates)
    assert (frame.instances, frame.rates, frame.totals) == (
        {"worker-0": 2, "worker-1": 2}, {"wc": Flow(1000.0, 350.0)}, {"wc": Flow(1040.0, 700.0)},
    )  # fmt: skip
    console = Console(width=100, record=True, color_system=None)
    console.print(render_frame(frame))
    shown = console.export_text().splitlines()
    assert shown[0].startswith("cluster 'memory' · leader master-0 (epoch 1) · ")
    assert [line.rstrip() for line in shown[1:]] == [  # what 'top --once' prints below the title line
        "",
        "worker     state             load     cpu%   rss MB   instances   heartbeat",
        "─" * 75,
        "worker-0   STANDBY/waiting   NORMAL     25     31.0           2   stale",
        "worker-1   STANDBY/waiting   NORMAL     25     31.0           2   stale",
        "",
        "job   state       attempt    in/s   out/s   records in   records out",
        "─" * 68,
        "wc    SCHEDULED         1   1,000     350        1,040           700",
    ]


def test_the_progress_line_shows_records_so_far_and_per_second() -> None:
    """submit --wait's line: state, attempt, records in and out so far and per second."""
    rates = HeartbeatRates()
    rates.update({"w0": beat(1.0, wc__in_0=("source", 0, 1000), wc__out_0=("sink", 900, 0))})
    rates.update({"w0": beat(3.0, wc__in_0=("source", 0, 9000), wc__out_0=("sink", 8900, 0))})
    status = {"job": "wc", "state": "RUNNING", "attempt": 2}
    assert progress_line(status, rates) == "job 'wc' RUNNING (attempt 2) · in 9,000 (4,000/s) · out 8,900 (4,000/s)"


def listed(state: str, reason: str, done: dict[str, Any]) -> dict[str, Any]:
    return {"job": "parse", "state": state, "attempt": 1, "workers": ["worker-0", "worker-1"], "reason": reason,
            "done": done}  # fmt: skip


def test_jobs_lists_why_a_job_failed() -> None:
    """A FAILED job's second line says 'failed:' and the reason; no dead-letter line without dead letters."""
    reason = "TaskError: task 'parse' instance 0 failed on record with key 'k7': ValueError: poison (on worker-0)"
    assert describe_listed(listed("FAILED", reason, {"worker-0": {"error": reason}})).splitlines() == [
        "parse                    FAILED        attempt 1   workers: worker-0, worker-1",
        f"                         failed: {reason}",
    ]


def test_jobs_lists_the_dead_letters_its_workers_reported() -> None:
    """Counts add up over the reports; the first five lines are shown, worker by worker."""
    done = {
        "worker-1": {"dead_letters": {"count": 2, "first": ["parse.1 key='b' value=2: ValueError: x"] * 2}},
        "worker-0": {"dead_letters": {"count": 4, "first": ["parse.0 key='a' value=1: ValueError: x"] * 4}},
    }
    assert describe_listed(listed("FINISHED", "every worker finished", done)).splitlines() == [
        "parse                    FINISHED      attempt 1   workers: worker-0, worker-1",
        "                         every worker finished",
        "                         dead letters: 6 (the first 5)",
        *["                           parse.0 key='a' value=1: ValueError: x"] * 4,
        "                           parse.1 key='b' value=2: ValueError: x",
    ]
