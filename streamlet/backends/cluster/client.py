"""What ``submit``, ``jobs`` and ``kill`` do, talking to the cluster through ZooKeeper."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from streamlet.backends.cluster.coordinator import ZkCoordinator
from streamlet.backends.cluster.jobs import JOBS, job_status, submit, topology_of
from streamlet.errors import JobError


@dataclass(frozen=True, slots=True)
class Submission:
    """What to run: a topology reference, the job name, parallelism overrides, checkpoint settings."""

    target: str
    job: str | None = None
    parallelism: dict[str, int] = field(default_factory=dict)
    checkpoint: dict[str, Any] | None = None  # {"interval": seconds, "directory": path every worker reaches}


async def submit_and_wait(
    hosts: str, cluster: str, submission: Submission, wait: bool, seconds: float
) -> dict[str, Any]:
    """Submit a job; with ``wait``, poll until it finishes or fails."""
    async with ZkCoordinator(hosts, cluster) as zk:
        target, parallelism = submission.target, submission.parallelism
        name = submission.job or topology_of({"target": target, "parallelism": parallelism}).name
        await submit(zk, name, target, parallelism, submission.checkpoint)
        status = await job_status(zk, name)
        if not wait:
            return status
        with anyio.fail_after(seconds):
            while status["state"] not in ("finished", "failed"):
                await anyio.sleep(0.1)
                status = await job_status(zk, name)
        return status


async def list_jobs(hosts: str, cluster: str) -> list[dict[str, Any]]:
    """Every job's status."""
    async with ZkCoordinator(hosts, cluster) as zk:
        return [await job_status(zk, job) for job in await zk.children(JOBS)]


async def kill(hosts: str, cluster: str, job: str) -> None:
    """Ask the workers to stop ``job``."""
    async with ZkCoordinator(hosts, cluster) as zk:
        if await zk.get(f"{JOBS}/{job}/spec") is None:
            raise JobError(f"no job called '{job}' on cluster '{cluster}'")
        await zk.create(f"{JOBS}/{job}/kill", {"by": "streamlet kill"})


def collected(status: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """Sink records the workers reported, merged by sink name."""
    merged: dict[str, list[list[Any]]] = {}
    for report in status["done"].values():
        for sink, records in report.get("sinks", {}).items():
            merged.setdefault(sink, []).extend(records)
    return merged


def describe(status: dict[str, Any]) -> str:
    """One line per fact: state, workers, errors, records per collecting sink."""
    lines = [f"job '{status['job']}' {status['state']} on {', '.join(status['workers']) or 'no worker yet'}"]
    lines.extend(f"  error: {error}" for error in status["errors"])
    lines.extend(f"  {sink}: {len(records)} records" for sink, records in sorted(collected(status).items()))
    return "\n".join(lines)
