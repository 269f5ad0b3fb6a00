"""Zipf keys over 4 instances on a local cluster of 2 workers: SAME_KEY hashing against the session table.

For each exponent (1.1, the headline, and 1.5 under ``s15``) two jobs of
``benchmarks.balance_job`` run one after the other on the same cluster
(ZooKeeper, a master, 2 workers, each its own process) for ``SECONDS``:
``hashed`` (SAME_KEY, contiguous segment ranges, nothing moves) and
``session`` (SESSION_TABLE with ``--adapt balance``: the leader's loop moves
segments from the windows the heartbeats carry). Each instance of ``work``
is a server of fixed capacity (see the job), so the fullest instance limits
the job. Measured from heartbeats of every worker, in windows after the
balancer converged (``LOADS_WINDOW`` in the paced phase, ``RATES_WINDOW`` in
the closed-loop one, seconds after the job runs):

- ``imbalance_*``: max over mean of the records each instance of ``work``
  processed in that window (``imbalance_pkg``: Partial Key Grouping's
  routing rule applied to the same key sequence, computed, not run: it splits
  a key's state over two instances and needs a merge step streamlet's keyed
  tasks do not have);
- ``speedstream_s_*``: the seed's S over the workers (CPU as a share of a
  core, memory as a share of the machine's), from the heartbeats of the
  paced phase (the same offered load for both: 20 000 records/s);
- ``records_per_s`` / ``baseline_records_per_s``: records processed per
  second by all instances in the window, session table / hashing;
- ``convergence_s``: from the job running to the balancer's last decision;
- ``bound``: what no key -> instance mapping can beat, max(1, 4 x the top
  key's share).

``--repeats R`` runs each pair R times, alternating which of the two goes
first; the numbers are medians over the repeats (``ratios`` lists each
repeat's ratio), the lists those of the median repeat.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from benchmarks.balance_job import zipf_keys
from benchmarks.common import median_of_repeats
from streamlet.adaptation.session_table import imbalance, partial_key_grouping, speedstream_s
from streamlet.adaptation.settings import AdaptSettings

SECONDS = 26.0  # each job's run: paced for PACED_SECONDS, then as fast as it goes
LOADS_WINDOW = (5.0, 11.0)  # seconds after the job runs: the paced window the workers' loads (S) come from
RATES_WINDOW = (15.0, 24.0)  # and the closed-loop window of the throughput and imbalance figures
ADAPT = AdaptSettings(frozenset({"balance"}), interval=1.0, cooldown=2.0)
Beat = dict[str, tuple[float, float, int, dict[str, Any]]]  # worker -> (time, cpu seconds, rss, instances)


def main(repeats: int) -> dict[str, Any]:
    """Both exponents, hashing and the session table, on one local cluster."""
    from streamlet.backends.cluster.local import local_cluster

    figures: dict[float, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        os.environ.update({
            "STREAMLET_BENCH_SECONDS": str(SECONDS),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
        })  # fmt: skip
        # room for 3 instances a worker: the source and 4 instances of 'work' spread 3 + 2 (with more room
        # the dispatcher co-locates all of 'work' with its source, and the second worker idles)
        state = local_cluster.up(root / "state", "balance", 2, 1, None, capacity=3)
        try:
            anyio.run(_ready, state)
            for exponent, suffix in ((1.1, "11"), (1.5, "15")):
                figures[exponent] = median_of_repeats([_pair(state, exponent, suffix, r) for r in range(repeats)])
        finally:
            local_cluster.down(root / "state")
    line: dict[str, Any] = {"name": "balance", **figures[1.1], "s15": figures[1.5]}
    return line


async def _ready(state: Any) -> None:
    from streamlet.backends.cluster.client.status import wait_until_ready

    await wait_until_ready(state.settings(), 2)


def _pair(state: Any, exponent: float, suffix: str, repeat: int) -> dict[str, Any]:
    """Hashing and the session table once each, the first one alternating with ``repeat``."""
    runs = {"hashed": (f"hashed_{suffix}", None), "session": (f"session_{suffix}", ADAPT)}
    order = ["hashed", "session"] if repeat % 2 == 0 else ["session", "hashed"]
    done = {variant: _run(state, *runs[variant], repeat) for variant in order}
    return _compare(exponent, done["hashed"], done["session"])


def _run(state: Any, job: str, adapt: AdaptSettings | None, repeat: int = 0) -> dict[str, Any]:
    """Submit ``job``, take the two heartbeats of the window, wait for its end; what they show."""
    from streamlet.backends.cluster.client import api as client

    name = f"{job.replace('_', '-')}-{repeat}"  # a job name is taken until the job is removed
    settings = None if adapt is None else adapt.to_data()
    submission = client.Submission(f"benchmarks.balance_job:{job}", name, {}, None, None, settings)
    anyio.run(client.submit_and_wait, state.settings(), submission, False, 60)
    running = _wait_state(state, name, {"RUNNING"})
    beats = []
    for offset in (*LOADS_WINDOW, *RATES_WINDOW):
        time.sleep(max(0.0, running + offset - time.time()))  # a benchmark driver waiting for its window
        beats.append(anyio.run(_beats, state))
    _wait_state(state, name, {"FINISHED"})
    status = {s["job"]: s for s in anyio.run(client.list_jobs, state.settings())}[name]
    decisions = [d["at"] for d in status.get("decisions", [])]
    return {
        "loads": _window(name, beats[0], beats[1]),
        "window": _window(name, beats[2], beats[3]),
        "convergence_s": round(max(decisions) - running, 2) if decisions else 0.0,
        "decisions": len(decisions),
    }


def _wait_state(state: Any, job: str, wanted: set[str]) -> float:
    from streamlet.backends.cluster.client import api as client

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = {status["job"]: status["state"] for status in anyio.run(client.list_jobs, state.settings())}
        if states.get(job) in wanted:
            return time.time()
        time.sleep(0.05)  # a benchmark driver polling the cluster, not a test
    raise RuntimeError(f"job '{job}' did not reach {wanted}")


async def _beats(state: Any) -> Beat:
    from streamlet.backends.cluster.tree.registry import workers
    from streamlet.backends.cluster.tree.zk import ZkStore

    async with ZkStore(state.zk, state.name, secret=state.secret()) as store:
        views = await workers(store)
    return {
        view.worker_id: (float(load["ts"]), float(load["cpu_seconds"]), int(load["rss_bytes"]), load["instances"])
        for view in views
        if (load := view.load)
    }


def _window(job: str, first: Beat, last: Beat) -> dict[str, Any]:
    """Per instance of 'work': records per second; per worker: CPU share and memory share."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    rates: dict[str, float] = {}
    cpu, rss = [], []
    for worker, (at, cpu_seconds, resident, instances) in last.items():
        then = first[worker]
        seconds = at - then[0]
        cpu.append((cpu_seconds - then[1]) / seconds)
        rss.append(resident / memory)
        for name, snapshot in instances.items():
            if name.startswith(f"{job}/work.") and name in then[3]:
                rates[name] = (snapshot["records_in"] - then[3][name]["records_in"]) / seconds
    return {"instances": dict(sorted(rates.items())), "cpu": cpu, "memory": rss}


def _compare(exponent: float, hashed: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    keys = zipf_keys(exponent, 200_000)
    top = max(keys.count(key) for key in set(keys[:100])) / len(keys)
    hashed_rates = list(hashed["window"]["instances"].values())
    session_rates = list(session["window"]["instances"].values())
    records, baseline = sum(session_rates), sum(hashed_rates)
    return {
        "records_per_s": round(records),
        "baseline_records_per_s": round(baseline),
        "ratio": round(records / baseline, 3),
        "imbalance_hash": round(imbalance(hashed_rates), 3),
        "imbalance_pkg": round(imbalance(partial_key_grouping(keys, 4)), 3),
        "imbalance_session_table": round(imbalance(session_rates), 3),
        "bound": round(max(1.0, 4 * top), 3),
        "speedstream_s_hash": round(speedstream_s(hashed["loads"]["cpu"], hashed["loads"]["memory"]), 4),
        "speedstream_s_session_table": round(speedstream_s(session["loads"]["cpu"], session["loads"]["memory"]), 4),
        "cpu_hash": [round(share, 3) for share in hashed["loads"]["cpu"]],
        "cpu_session_table": [round(share, 3) for share in session["loads"]["cpu"]],
        "convergence_s": session["convergence_s"],
        "decisions": session["decisions"],
        "instances_hash": [round(rate) for rate in hashed_rates],
        "instances_session_table": [round(rate) for rate in session_rates],
        "exponent": exponent,
    }
