"""The leader's recovery: new attempts for jobs that lost a worker or whose instance crashed.

Node failover: when a worker holding instances of an unfinished job is gone
(its ephemeral node went, or its heartbeat is stale), the job gets its next
attempt over the live workers.

Instance failover: an instance whose task asks for restarts
(``on_error="restart"``) and still fails after restarting in place makes
its worker report the crash. The leader records it under
``/jobs/<job>/failures/<instance>`` and starts the next attempt with the
task's instances kept off the workers where it crashed, when others can
take them. After ``max_failures`` such crashes it gives up: the job is
marked failed with a reason naming the instance, and is not rescheduled.

Either way the new attempt resumes from the job's last completed
checkpoint when it takes checkpoints.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from streamlet.backends.cluster.coordinator import NodeExists, VersionConflict, ZkCoordinator
from streamlet.backends.cluster.jobs import (
    JOBS,
    STALE_AFTER,
    job_status,
    live_loads,
    place,
    spec_of,
    topology_of,
)
from streamlet.backends.cluster.registry import workers
from streamlet.core.topology import Topology


async def recover(zk: ZkCoordinator, epoch: int) -> list[str]:
    """Leader: one pass over the jobs, each looked at once: a new attempt for every unfinished job that
    lost a worker or whose instance crashed; a failed job is marked so its other workers stop it."""
    live = {v.worker_id for v in await workers(zk) if not v.stale(time.time(), STALE_AFTER)}
    recovered = []
    for job in await zk.children(JOBS):
        status = await job_status(zk, job)
        if status["state"] == "failed" and not status["given_up"]:
            await _fail(zk, job, status["errors"][0])  # tells the job's other workers to stop it too
        if status["state"] not in ("running", "recovering"):
            continue
        found = await zk.get(f"{JOBS}/{job}/assignment")
        spec = await spec_of(zk, job)
        if found is None or spec is None:
            continue
        if status["state"] == "recovering":
            note = await _restart_crashed(zk, job, status, found, topology_of(spec), epoch)
        else:
            note = await _replace_lost(zk, job, found, topology_of(spec), live, epoch)
        if note is not None:
            recovered.append(note)
    return recovered


async def _replace_lost(
    zk: ZkCoordinator, job: str, found: tuple[dict[str, Any], int], topology: Topology, live: set[str], epoch: int
) -> str | None:
    """Node failover: the next attempt over the live workers, if a worker of this one is gone."""
    lost = sorted(set(found[0]["instances"].values()) - live)
    if not lost or not live:
        return None
    attempt = await _next_attempt(zk, job, found, topology, epoch, {})
    return None if attempt is None else f"{job} (attempt {attempt}, lost {', '.join(lost)})"


async def _restart_crashed(
    zk: ZkCoordinator,
    job: str,
    status: dict[str, Any],
    found: tuple[dict[str, Any], int],
    topology: Topology,
    epoch: int,
) -> str | None:
    """Instance failover: the next attempt away from where the instance crashed, or give up on the job."""
    worker, report = next((w, r) for w, r in sorted(status["done"].items()) if r.get("retry"))
    instance = str(report["instance"])
    history = await _record_failure(zk, job, instance, status["attempt"], worker, report["error"])
    node = topology.nodes[instance.rsplit(".", 1)[0]]
    if len(history) > node.max_failures:
        await _give_up(zk, job, instance, history, node.max_failures)
        return f"{job}: {instance} failed {len(history)} times, job failed"
    avoid = {node.name: {entry["worker"] for entry in history}}
    attempt = await _next_attempt(zk, job, found, topology, epoch, avoid)
    return None if attempt is None else f"{job} (attempt {attempt}, {instance} crashed on {worker})"


async def _record_failure(
    zk: ZkCoordinator, job: str, instance: str, attempt: int, worker: str, error: str
) -> list[dict[str, Any]]:
    # one entry per attempt, so a leader that looks twice (or a new leader) does not count a crash twice
    path = f"{JOBS}/{job}/failures/{instance}/{attempt}"
    with contextlib.suppress(NodeExists):
        await zk.create(path, {"attempt": attempt, "worker": worker, "error": error})
    entries = []
    for name in await zk.children(f"{JOBS}/{job}/failures/{instance}"):
        found = await zk.get(f"{JOBS}/{job}/failures/{instance}/{name}")
        if found is not None:
            entries.append(found[0])
    return sorted(entries, key=lambda entry: int(entry["attempt"]))


async def _give_up(
    zk: ZkCoordinator, job: str, instance: str, history: list[dict[str, Any]], max_failures: int
) -> None:
    where = ", ".join(sorted({entry["worker"] for entry in history}))
    reason = (
        f"instance '{instance}' failed {len(history)} times (max_failures={max_failures}) on {where}; "
        f"last error: {history[-1]['error']}"
    )
    await _fail(zk, job, reason)


async def _fail(zk: ZkCoordinator, job: str, reason: str) -> None:
    with contextlib.suppress(NodeExists):
        await zk.create(f"{JOBS}/{job}/failed", {"reason": reason})


async def _next_attempt(
    zk: ZkCoordinator,
    job: str,
    found: tuple[dict[str, Any], int],
    topology: Topology,
    epoch: int,
    avoid: dict[str, set[str]],
) -> int | None:
    """Write the job's next attempt over the live workers; ``None`` if another leader got there first."""
    assignment, version = found
    attempt = int(assignment.get("attempt", 1)) + 1
    mapping = place(topology, await live_loads(zk, exclude=job), avoid)
    try:
        await zk.set(f"{JOBS}/{job}/assignment", {"epoch": epoch, "attempt": attempt, "instances": mapping}, version)
    except VersionConflict:
        return None
    return attempt
