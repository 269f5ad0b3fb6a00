"""What ``streamlet top`` and ``submit --wait`` show of running jobs, from the workers' heartbeats.

Each heartbeat (``/loads/<worker>``) carries every local instance's cumulative
counters under ``instances`` (``"job/node.index"`` -> ``InstanceSnapshot.to_data()``).
A job's records *in* are what its sources emitted, its records *out* what its
sinks received. Rates are differences between a worker's last two distinct
samples of those counters, divided by the seconds between the samples, summed
over the workers; a counter that went back (a new attempt started counting
afresh) counts from 0. A sample is told by its ``sampled`` time, not the beat's
``ts``: the heart thread beats on its own clock and may send the loop's last
sample twice, and two beats of one sample are no evidence that nothing flowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamlet.backends.cluster.tree.registry import workers
from streamlet.backends.cluster.tree.status import read_status
from streamlet.backends.cluster.tree.store import ClusterStore

Load = dict[str, Any]  # one heartbeat, as a worker writes it to /loads/<id>


@dataclass(frozen=True, slots=True)
class Flow:
    """A job's records in (emitted by its sources) and out (received by its sinks): counts or per second."""

    records_in: float = 0.0
    records_out: float = 0.0

    def __add__(self, other: Flow) -> Flow:
        return Flow(self.records_in + other.records_in, self.records_out + other.records_out)


def job_flows(load: Load) -> dict[str, Flow]:
    """Per job, the records in and out counted by the instances one heartbeat describes.

    Example:
        >>> job_flows({"instances": {"wc/in.0": {"kind": "source", "records_in": 0, "records_out": 8},
        ...                          "wc/out.0": {"kind": "sink", "records_in": 5, "records_out": 0}}})
        {'wc': Flow(records_in=8.0, records_out=5.0)}
    """
    flows: dict[str, Flow] = {}
    for name, counters in (load.get("instances") or {}).items():
        job = name.partition("/")[0]
        flows[job] = flows.get(job, Flow()) + _instance_flow(counters)
    return flows


def flow_rates(before: Load, after: Load) -> dict[str, Flow]:
    """Per job, records per second in and out between two samples of one worker (none if no time passed)."""
    seconds = sampled_at(after) - sampled_at(before)
    if seconds <= 0:
        return {}
    earlier = before.get("instances") or {}
    rates: dict[str, Flow] = {}
    for name, counters in (after.get("instances") or {}).items():
        now, then = _instance_flow(counters), _instance_flow(earlier.get(name, {}))
        grown = Flow(
            _grown(then.records_in, now.records_in) / seconds, _grown(then.records_out, now.records_out) / seconds
        )
        job = name.partition("/")[0]
        rates[job] = rates.get(job, Flow()) + grown
    return rates


def sampled_at(load: Load) -> float:
    """When the worker read the counters a heartbeat carries (an older worker's beat: when it beat)."""
    return float(load.get("sampled") or load.get("ts") or 0.0)


def _instance_flow(counters: dict[str, Any]) -> Flow:
    """What one instance adds to its job's flow: a source's records out, a sink's records in."""
    kind = counters.get("kind")
    return Flow(
        float(counters.get("records_out", 0)) if kind == "source" else 0.0,
        float(counters.get("records_in", 0)) if kind == "sink" else 0.0,
    )


def _grown(before: float, after: float) -> float:
    return after - before if after >= before else after  # went back: counting started afresh


@dataclass
class HeartbeatRates:
    """Each worker's last two distinct samples of its counters, and the jobs' rates between them."""

    pairs: dict[str, tuple[Load | None, Load]] = field(default_factory=dict)

    def update(self, loads: dict[str, Load]) -> None:
        """Take the workers' current heartbeats (a worker gone is forgotten)."""
        for worker in set(self.pairs) - set(loads):
            del self.pairs[worker]
        for worker, load in loads.items():
            last = self.pairs.get(worker)
            if last is None:
                self.pairs[worker] = (None, load)
            elif sampled_at(load) != sampled_at(last[1]):
                self.pairs[worker] = (last[1], load)

    def complete(self) -> bool:
        """Every worker has sampled twice since the first update: every rate is known."""
        return all(before is not None for before, _ in self.pairs.values())

    def rates(self) -> dict[str, Flow]:
        """Per job, records per second in and out, over the workers whose rate is known."""
        total: dict[str, Flow] = {}
        for before, after in self.pairs.values():
            for job, flow in ({} if before is None else flow_rates(before, after)).items():
                total[job] = total.get(job, Flow()) + flow
        return total

    def totals(self) -> dict[str, Flow]:
        """Per job, records in and out so far by the last heartbeats (this attempt's instances)."""
        total: dict[str, Flow] = {}
        for _, after in self.pairs.values():
            for job, flow in job_flows(after).items():
                total[job] = total.get(job, Flow()) + flow
        return total


@dataclass(frozen=True, slots=True)
class TopFrame:
    """One screen of ``streamlet top``: the cluster's status (as ``cluster status --json`` has it), each
    worker's instance count, and each job's flow so far and per second (``None``: not known yet)."""

    status: dict[str, Any]
    instances: dict[str, int]
    totals: dict[str, Flow]
    rates: dict[str, Flow] | None
    held: list[tuple[str, str, float]] = field(default_factory=list)  # (instance, worker, seconds it held a loop)


async def read_loads(zk: ClusterStore) -> dict[str, Load]:
    """Every registered worker's last heartbeat."""
    return {view.worker_id: view.load for view in await workers(zk) if view.load is not None}


async def read_frame(zk: ClusterStore, rates: HeartbeatRates) -> TopFrame:
    """Read the status and the heartbeats now; ``rates`` keeps the heartbeats for the next frame."""
    status = await read_status(zk)
    loads = await read_loads(zk)
    rates.update(loads)
    instances = {worker: len(load.get("instances") or {}) for worker, load in loads.items()}
    known = rates.rates() if rates.complete() else None
    return TopFrame(status, instances, rates.totals(), known, loop_held(loads))


def loop_held(loads: dict[str, Load]) -> list[tuple[str, str, float]]:
    """Every instance whose calls held its worker's event loop (``loop_held`` seconds, most first)."""
    found = [
        (key, worker, float(snapshot.get("loop_held", 0.0)))
        for worker, load in loads.items()
        for key, snapshot in (load.get("instances") or {}).items()
        if snapshot.get("loop_held")
    ]
    return sorted(found, key=lambda row: -row[2])
