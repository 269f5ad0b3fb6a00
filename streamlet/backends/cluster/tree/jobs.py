"""What clients do to jobs through the store: submit, read status, kill, remove.

A job is submitted by reference and signed (``signing``); its spec and its
SUBMITTED state are created in one transaction. From then on the leader
writes its state (``leader``, ``lifecycle``) and the workers report how
their parts ended under ``/jobs/<job>/done/<attempt>/``.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from pathlib import Path
from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.lifecycle import JobState, state_of, submitted
from streamlet.backends.cluster.tree.paths import Assignment, JobSpec
from streamlet.backends.cluster.tree.signing import sign
from streamlet.backends.cluster.tree.store import ClusterStore, Create, read_all
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.cycles import refuse_checkpoints_with_cycles
from streamlet.errors import JobError, NodeExists
from streamlet.loading import load_topology


def new_spec(
    target: str,
    parallelism: dict[str, int],
    checkpoint: dict[str, Any] | None,
    adapt: dict[str, Any] | None = None,
) -> JobSpec:
    """An unsigned spec; a file target is made absolute so that every worker finds the same file."""
    location, colon, name = target.partition(":")
    if location.endswith(".py"):
        target = str(Path(location).resolve()) + colon + name
    return {
        "target": target, "parallelism": parallelism, "checkpoint": checkpoint, "submitted": time.time(),
        "uid": uuid.uuid4().hex[:12], "adapt": adapt,
    }  # fmt: skip


def topology_of(spec: JobSpec | dict[str, Any]) -> Topology:
    """Load and validate the job's topology from its reference; refuse what the cluster cannot run."""
    # from the bytes the spec signs (when signed): an edited file resubmitted is new code, never a cached copy
    topology = load_topology(spec["target"], spec.get("parallelism") or {}, digest=spec.get("module_sha256"))
    topology.validate()
    if spec.get("checkpoint") is not None:
        refuse_checkpoints_with_cycles(topology)  # at submit, before anything is written or started
    return topology


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
    topology = topology_of(signed)
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


async def held_instances(store: ClusterStore, job: str, assignment: Assignment) -> dict[str, str]:
    """The running instances of ``job``'s attempt -> worker: as assigned, then as live changes left them
    (moved, added, and without those a rescale took out)."""
    held = dict(assignment["instances"])
    found = await store.get(paths.layout(job))
    if found is None or found[0]["attempt"] != assignment["attempt"]:
        return held
    layout = found[0]
    held.update(layout["placed"])
    counts = layout["parallelism"]
    return {
        instance: worker
        for instance, worker in held.items()
        if (task := paths.task_of(instance)) not in counts or int(instance.rsplit(".", 1)[1]) < counts[task]
    }


async def job_status(store: ClusterStore, job: str) -> dict[str, Any]:
    """What is known of a job: state with reason and times, attempt, where its instances run (live changes
    included) and on which workers, their reports, errors."""
    found = await store.get(paths.state(job))
    if found is None:
        raise JobError(f"no job called '{job}' on cluster '{store.cluster}'")
    node = found[0]
    assignment = await store.get(paths.assignment(job))
    attempt = 0 if assignment is None else int(assignment[0]["attempt"])
    done = await read_all(store, paths.done(job, attempt)) if attempt else {}
    held = {} if assignment is None else await held_instances(store, job, assignment[0])
    decisions = await read_all(store, paths.decisions(job))
    state = state_of(node)
    errors = [node["reason"]] if state == JobState.FAILED else []
    return {
        "job": job, "name": job, "state": state.value, "reason": node["reason"], "at": node["at"],
        "attempt": attempt, "reconfigurations": node.get("reconfigurations", 0),
        "workers": sorted(set(held.values())), "instances": held,
        "started": node.get("started"), "ended": node.get("ended"), "done": done, "errors": errors,
        "decisions": [decisions[name] for name in sorted(decisions)],
    }  # fmt: skip


async def all_jobs(store: ClusterStore) -> list[dict[str, Any]]:
    """Every job's status (jobs half-created or being removed are left out)."""
    statuses = []
    for job in await store.children(paths.JOBS):
        try:
            statuses.append(await job_status(store, job))
        except JobError:
            continue
    return statuses


async def kill(store: ClusterStore, job: str, by: str = "streamlet kill") -> str:
    """Ask the leader to stop ``job``; asking again, or for an ended job, changes nothing. Returns its state."""
    state = str((await job_status(store, job))["state"])
    if JobState(state).ended:
        return state
    with contextlib.suppress(NodeExists):  # asked already: kill is idempotent
        await store.create(paths.kill(job), {"by": by, "at": time.time()})
    return state


async def remove(store: ClusterStore, job: str) -> None:
    """Delete an ended job and everything under it, so that its name can be used again."""
    state = (await job_status(store, job))["state"]
    if not JobState(state).ended:
        raise JobError(f"job '{job}' is {state}: only an ended job can be removed ('streamlet kill {job}' first)")
    await store.delete(paths.job(job), recursive=True)
