"""What a client does to jobs through the store: submit (signed, spec and state in one transaction), kill, remove."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.jobs import job_status, topology_of
from streamlet.backends.cluster.tree.lifecycle import JobState, submitted
from streamlet.backends.cluster.tree.paths import JobSpec
from streamlet.backends.cluster.tree.signing import sign
from streamlet.backends.cluster.tree.store import ClusterStore, Create
from streamlet.core.model import world
from streamlet.errors import JobError, NodeExists


def new_spec(
    target: str,
    parallelism: dict[str, int],
    checkpoint: dict[str, Any] | None,
    adapt: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
    spread: bool = False,
    state: dict[str, Any] | None = None,
) -> JobSpec:
    """An unsigned spec; a file target is made absolute so that every worker finds the same file. ``params``
    (``--param``) go to the function that builds the topology, in every process that builds it, exactly as
    ``streamlet run`` passes them: nothing of the submitting shell's environment reaches the cluster."""
    location, colon, name = target.partition(":")
    if location.endswith(".py"):
        target = str(Path(location).resolve()) + colon + name
    return {
        "target": target, "parallelism": parallelism, "checkpoint": checkpoint, "submitted": world.wall_time(),
        "uid": world.token_hex(6), "adapt": adapt, "params": dict(params or {}), "spread": spread, "state": state,
    }  # fmt: skip


JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def check_job_name(job: str) -> str:
    """``job`` if it can name a job (a ZooKeeper node, part of file names and run tokens)."""
    if not JOB_NAME.fullmatch(job):
        raise JobError(
            f"job name {job!r} is not allowed: use 1-64 letters, digits, '_' or '-', starting with a letter or digit"
        )
    return job


async def submit(store: ClusterStore, job: str, spec: JobSpec, secret: bytes) -> None:
    """Record a signed job, SUBMITTED; the leader schedules it. The topology is loaded here first, to fail early."""
    check_job_name(job)
    signed = sign(spec, secret)  # the digest of the bytes read once; the check loads exactly those
    topology = topology_of(signed, secret)
    if "shed" in (spec.get("adapt") or {}).get("policies", ()) and topology.qos is None:
        raise JobError(f"--adapt shed keeps a QoS: topology '{topology.name}' has none (topology.set_qos(...))")
    await _refuse_replicas_beyond_workers(store, spec.get("checkpoint"))
    await store.ensure(paths.JOBS)
    steps = [
        Create(paths.job(job), {"uid": spec["uid"]}),
        Create(paths.spec(job), signed),
        Create(paths.state(job), submitted()),
    ]
    if not await store.commit(steps):
        raise JobError(
            f"a job called '{job}' already exists on cluster '{store.cluster}' "
            f"(when it has ended, 'streamlet rm {job}' removes it)"
        )


async def _refuse_replicas_beyond_workers(store: ClusterStore, checkpoint: dict[str, Any] | None) -> None:
    """An explicit replica count needs that many workers besides each instance's own (the default, 1, takes
    what there is: none on a one-worker cluster)."""
    wanted = None if checkpoint is None else checkpoint.get("replicas")
    if wanted is None:
        return
    registered = len(await store.children(paths.WORKERS))
    if int(wanted) > max(registered - 1, 0):
        raise JobError(
            f"--replicas {wanted} needs {int(wanted) + 1} workers (each copy on a worker other than the "
            f"instance's own); the cluster has {registered} registered"
        )


async def kill(store: ClusterStore, job: str, by: str = "streamlet kill") -> str:
    """Ask the leader to stop ``job``; asking again, or for an ended job, changes nothing. Returns its state."""
    state = str((await job_status(store, job))["state"])
    if JobState(state).ended:
        return state
    with contextlib.suppress(NodeExists):  # asked already: kill is idempotent
        await store.create(paths.kill(job), {"by": by, "at": world.wall_time()})
    return state


async def remove(store: ClusterStore, job: str) -> None:
    """Delete an ended job and everything under it, so that its name can be used again."""
    state = (await job_status(store, job))["state"]
    if not JobState(state).ended:
        raise JobError(f"job '{job}' is {state}: only an ended job can be removed ('streamlet kill {job}' first)")
    await store.delete(paths.job(job), recursive=True)
