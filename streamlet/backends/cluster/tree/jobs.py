"""What clients do to jobs through the store: submit, read status, kill, remove.

A job is submitted by reference and signed (``signing``); its spec and its
SUBMITTED state are created in one transaction. From then on the leader
writes its state (``leader``, ``lifecycle``) and the workers report how
their parts ended under ``/jobs/<job>/done/<attempt>/``.
"""

from __future__ import annotations

from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.lifecycle import JobState, state_of
from streamlet.backends.cluster.tree.paths import Assignment, JobSpec
from streamlet.backends.cluster.tree.reports import dead_letters_of
from streamlet.backends.cluster.tree.sealed import opened
from streamlet.backends.cluster.tree.store import ClusterStore, read_all
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.cycles import refuse_checkpoints_with_cycles
from streamlet.errors import JobError
from streamlet.loading import load_topology


def topology_of(spec: JobSpec | dict[str, Any], secret: bytes | None = None) -> Topology:
    """Load and validate the job's topology from its reference, its parameters and (with the cluster ``secret``)
    its sealed ones; refuse what the cluster cannot run."""
    # from the bytes the spec signs (when signed): an edited file resubmitted is new code, never a cached copy
    params = {**(spec.get("params") or {}), **opened(spec, secret)}
    topology = load_topology(spec["target"], spec.get("parallelism") or {}, params, digest=spec.get("module_sha256"))
    topology.validate()
    if spec.get("checkpoint") is not None:
        refuse_checkpoints_with_cycles(topology)  # at submit, before anything is written or started
    return topology


async def held_instances(store: ClusterStore, job: str, assignment: Assignment) -> dict[str, str]:
    """The running instances of ``job``'s attempt -> worker: as assigned, then as live changes left them
    (moved, added, and without those a rescale took out)."""
    held = dict(assignment["instances"])
    found = await store.get(paths.layout(job))
    if found is None or found.data["attempt"] != assignment["attempt"]:
        return held
    layout = found.data
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
    node = found.data
    assignment = await store.get(paths.assignment(job))
    attempt = 0 if assignment is None else int(assignment.data["attempt"])
    done = await read_all(store, paths.done(job, attempt)) if attempt else {}
    held = {} if assignment is None else await held_instances(store, job, assignment.data)
    decisions = await read_all(store, paths.decisions(job))
    spec = await store.get(paths.spec(job))
    state = state_of(node)
    errors = [node["reason"]] if state == JobState.FAILED else []
    return {
        "job": job, "name": job, "state": state.value, "reason": node["reason"], "at": node["at"],
        "attempt": attempt, "reconfigurations": node.get("reconfigurations", 0),
        "workers": sorted(set(held.values())), "instances": held,
        "started": node.get("started"), "ended": node.get("ended"), "done": done, "errors": errors,
        "decisions": [decisions[name] for name in sorted(decisions)],
        "params": {} if spec is None else dict(spec.data.get("params") or {}),
        "secret_params": [] if spec is None else sorted(spec.data.get("sealed") or {}),  # names: never a value
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


def public(status: dict[str, Any]) -> dict[str, Any]:
    """A status as ``jobs --json`` prints it (without the workers' full reports): the dead letters as
    ``{"count": N, "first": [...]}``, added up over the current attempt's reports."""
    keys = (
        "name", "state", "reason", "attempt", "reconfigurations", "workers", "instances", "decisions", "started",
        "ended", "params", "secret_params",
    )  # fmt: skip
    letters = dead_letters_of(status["done"])
    return {**{key: status[key] for key in keys}, "dead_letters": {"count": letters.count, "first": letters.first}}
