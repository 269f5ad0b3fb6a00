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
    ENDED,
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


async def recover_lost_workers(zk: ZkCoordinator, epoch: int) -> list[str]:
    """Leader: give every unfinished job that lost a worker a new attempt over the live workers."""
    live = {v.worker_id for v in await workers(zk) if not v.stale(time.time(), STALE_AFTER)}
    recovered = []
    for job in await zk.children(JOBS):
        found = await zk.get(f"{JOBS}/{job}/assignment")
        if found is None or (await job_status(zk, job))["state"] in ENDED:
            continue
        lost = sorted(set(found[0]["instances"].values()) - live)
        spec = await spec_of(zk, job)
        if not lost or not live or spec is None:
            continue
        attempt = await _next_attempt(zk, job, found, topology_of(spec), epoch, {})
        if attempt is not None:
            recovered.append(f"{job} (attempt {attempt}, lost {', '.join(lost)})")
    return recovered


async def recover_failed_instances(zk: ZkCoordinator, epoch: int) -> list[str]:
    """Leader: restart crashed instances elsewhere, or give up on the job after ``max_failures`` crashes."""
    recovered = []
    for job in await zk.children(JOBS):
        status = await job_status(zk, job)
        found = await zk.get(f"{JOBS}/{job}/assignment")
        spec = await spec_of(zk, job)
        if status["state"] == "failed" and await zk.get(f"{JOBS}/{job}/failed") is None:
            await _fail(zk, job, status["errors"][0])  # tells the job's other workers to stop it too
            continue
        if status["state"] != "recovering" or found is None or spec is None:
            continue
        worker, report = next((w, r) for w, r in sorted(status["done"].items()) if r.get("retry"))
        instance = str(report["instance"])
        history = await _record_failure(zk, job, instance, status["attempt"], worker, report["error"])
        topology = topology_of(spec)
        node = topology.nodes[instance.rsplit(".", 1)[0]]
        if len(history) > node.max_failures:
            await _give_up(zk, job, instance, history, node.max_failures)
            recovered.append(f"{job}: {instance} failed {len(history)} times, job failed")
            continue
        avoid = {node.name: {entry["worker"] for entry in history}}
        attempt = await _next_attempt(zk, job, found, topology, epoch, avoid)
        if attempt is not None:
            recovered.append(f"{job} (attempt {attempt}, {instance} crashed on {worker})")
    return recovered


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
