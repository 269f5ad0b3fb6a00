"""What ``submit``, ``jobs``, ``kill``, ``rescale``, ``migrate``, ``rebalance`` and ``rm`` do, talking to the
cluster through ZooKeeper.

Reading needs nothing; changing the cluster needs its secret (the store is
opened with it, and ZooKeeper refuses writes from anyone without it).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import structlog

from streamlet.adaptation.rebalance import Migration
from streamlet.backends.cluster.client import following, job_commands, live_changes, savepoints
from streamlet.backends.cluster.client.following import Relocate, Watcher
from streamlet.backends.cluster.tree import jobs, rebalancing
from streamlet.backends.cluster.tree import layouts as reconfigure
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.outline import BUILD_SECONDS
from streamlet.backends.cluster.tree.paths import JobSpec, ReconfigureRequest
from streamlet.backends.cluster.tree.reports import dead_letters_of
from streamlet.backends.cluster.tree.sealed import seal
from streamlet.backends.cluster.tree.zk import StoreSettings
from streamlet.core.model import world
from streamlet.core.model.topology import Topology
from streamlet.core.model.validation import surprising_defaults
from streamlet.errors import BuildFailed, JobError

log = structlog.get_logger("streamlet.client")


@dataclass(frozen=True, slots=True)
class Submission:
    """What to run: a topology reference, the job name, parallelism overrides, checkpoint settings."""

    target: str
    job: str | None = None
    parallelism: dict[str, int] = field(default_factory=dict)
    checkpoint: dict[str, Any] | None = None  # {"interval": seconds, "replicas": K or None (one when possible)}
    from_savepoint: Path | None = None  # start from this savepoint (on a path every worker reaches)
    adapt: dict[str, Any] | None = None  # AdaptSettings.to_data(): the adaptation policies it runs under
    params: dict[str, str] = field(default_factory=dict)  # --param: the building function's arguments, as text
    spread: bool = False  # --spread: every node's instances over different workers from the start
    secret_params: dict[str, str] = field(default_factory=dict)  # --secret-param: sealed in the spec, never shown
    state: dict[str, Any] | None = None  # --state-backend rocksdb: {"backend": "rocksdb", "cache_mb": N}


async def build_within(spec: JobSpec, seconds: float) -> Topology:
    """The spec's topology, built here (its errors raised as they are) in a thread of its own, within ``seconds``:
    a build that never returns (a loop, a wait for what never comes) is a :class:`BuildFailed` saying so, and
    nothing is submitted. (The thread is a daemon's: the command exits without it. The cluster bounds its own
    builds the same way, in a process it kills.)"""
    outcome: dict[str, Any] = {}
    finished = anyio.Event()
    token = anyio.lowlevel.current_token()

    def build() -> None:
        try:
            outcome["topology"] = jobs.topology_of(spec)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there as it was
            outcome["error"] = exc
        with contextlib.suppress(RuntimeError):  # the caller gave up and its loop is gone
            anyio.from_thread.run_sync(finished.set, token=token)

    threading.Thread(target=build, name="build-topology", daemon=True).start()
    with anyio.move_on_after(seconds):
        await finished.wait()
    if "error" in outcome:
        raise outcome["error"]
    if "topology" not in outcome:
        raise BuildFailed(
            f"building the topology of {spec['target']} took longer than {seconds:g} s in this client (it never "
            "returned: a loop, or a wait for something that does not come); nothing was submitted"
        )
    topology: Topology = outcome["topology"]
    return topology


async def submit_and_wait(
    settings: StoreSettings, submission: Submission, wait: bool, seconds: float,
    watch: Watcher | None = None, relocate: Relocate | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Submit a signed job; with ``wait``, follow its state until it ends (or ``seconds`` pass), showing each
    status read to ``watch`` (``submit``'s progress line) and following the cluster to where ``relocate`` says
    it is recorded when its ZooKeeper goes away (``cluster down`` and ``up`` on the same state dir)."""
    secret = _secret_of(settings, "submit")
    async with settings.open() as store:  # the secret is checked before any code is loaded
        spec = job_commands.new_spec(
            submission.target,
            submission.parallelism,
            submission.checkpoint,
            submission.adapt,
            submission.params,
            submission.spread,
            submission.state,
        )
        # built here with the secret parameters in clear; recorded with them sealed (``tree.sealed``)
        plain: JobSpec = {**spec, "params": {**spec["params"], **submission.secret_params}}
        if submission.from_savepoint is not None:
            if spec["checkpoint"] is None:
                raise JobError("--from-savepoint needs --checkpoint-interval (the job keeps checkpoints of its own)")
            spec["checkpoint"]["from_savepoint"] = savepoints.check_for_submit(submission.from_savepoint, plain)
        built = await build_within(plain, BUILD_SECONDS)
        name = job_commands.check_job_name(submission.job or built.name)
        for event, fields in surprising_defaults(built, checkpointed=spec["checkpoint"] is not None):
            log.warning(event, job=name, **fields)  # here, once: the workers build parts, which do not warn
        if submission.secret_params:
            spec["sealed"] = seal(submission.secret_params, secret, spec["uid"])
        await job_commands.submit(store, name, spec, secret)
        status = await jobs.job_status(store, name)
    if not wait:
        return status
    follower = following.JobFollower(name, status, watch, relocate)
    with anyio.move_on_after(seconds):
        return await follower.until_ended(settings)
    last = follower.status
    raise JobError(
        f"job '{name}' has not ended after {seconds:g} s; it is {last['state']}: {last['reason']} "
        f"(it goes on; 'streamlet jobs' follows it, 'streamlet kill {name}' stops it)"
    )


async def list_jobs(settings: StoreSettings) -> list[dict[str, Any]]:
    """Every job's status (job data is readable only with ``secret``: without it, :class:`NotAuthorized`)."""
    async with settings.open() as store:
        return await jobs.all_jobs(store)


async def kill(settings: StoreSettings, job: str) -> str:
    """Ask the cluster to stop ``job``; returns the state it was in."""
    async with settings.open() as store:
        return await job_commands.kill(store, job)


async def rescale(settings: StoreSettings, job: str, task: str, instances: int, seconds: float) -> dict[str, Any]:
    """Give ``task`` of running ``job`` ``instances`` instances without restarting it; the job's status after."""
    return await change(settings, job, reconfigure.request_node(task, instances), seconds)


async def migrate(settings: StoreSettings, job: str, instance: str, worker: str, seconds: float) -> dict[str, Any]:
    """Move ``instance`` (``task.index``) of running ``job`` to ``worker`` with its state, live; the status after."""
    task, _, index = instance.rpartition(".")
    if not task or not index.isdigit():
        raise JobError(f"name the instance as TASK.INDEX (e.g. count.1), not {instance!r}")
    request = reconfigure.request_node(task, migrate=(int(index), worker))
    return await change(settings, job, request, seconds)


async def change(settings: StoreSettings, job: str, request: ReconfigureRequest, seconds: float) -> dict[str, Any]:
    """Ask for a live change of running ``job`` and wait until the leader has carried it out (or refused it)."""
    async with settings.open() as store:
        asked_at = world.wall_time()
        asked = await live_changes.ask(store, job, request, settings.secret)
        return await live_changes.wait_done(store, job, asked, asked_at, seconds)


async def rebalance(
    settings: StoreSettings, job: str, seconds: float, dry_run: bool = False
) -> tuple[list[Migration], dict[str, Any]]:
    """Spread running ``job`` over the live workers by live migrations, one after the other (``dry_run``:
    only say which); returns the moves and the job's status after them."""
    async with settings.open() as store:
        moves = await rebalancing.planned_moves(store, job, world.wall_time(), settings.secret)
        if not dry_run:
            await live_changes.carry_out(store, job, moves, seconds, settings.secret)
        return moves, await jobs.job_status(store, job)


async def savepoint(settings: StoreSettings, job: str, path: Path, stop: bool = False) -> int:
    """A savepoint of running ``job`` at ``path`` (with ``stop``: sources stop first, then the job is killed);
    returns its epoch."""
    async with settings.open() as store:
        epoch = await savepoints.take(store, job, path, _secret_of(settings, "savepoint"), pause=stop)
        if stop:
            await job_commands.kill(store, job, by="streamlet stop --savepoint")
        return epoch


async def remove(settings: StoreSettings, job: str) -> None:
    """Remove an ended job so that its name can be used again."""
    async with settings.open() as store:
        await job_commands.remove(store, job)


def _secret_of(settings: StoreSettings, action: str) -> bytes:
    """The cluster secret ``action`` signs or writes with (the command line checks it is there first)."""
    if settings.secret is None:
        raise JobError(f"{action} needs the cluster secret")
    return settings.secret


def collected(status: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """Sink records the workers reported, merged by sink name."""
    merged: dict[str, list[list[Any]]] = {}
    for report in status["done"].values():
        for sink, records in report.get("sinks", {}).items():
            merged.setdefault(sink, []).extend(records)
    return merged


def describe(status: dict[str, Any]) -> str:
    """One line per fact: state and reason, workers, errors, records per collecting sink."""
    workers = ", ".join(status["workers"]) or "no worker yet"
    lines = [f"job '{status['job']}' {status['state']} on {workers}: {status['reason']}"]
    lines.extend(f"  error: {error}" for error in status["errors"])
    lines.extend(f"  {sink}: {len(records)} records" for sink, records in sorted(collected(status).items()))
    return "\n".join(lines)


def describe_listed(status: dict[str, Any]) -> str:
    """How ``streamlet jobs`` lists a job: state, attempt and workers; why it is in that state (why it failed);
    its dead letters, when its workers reported some (their count, the first few)."""
    workers = ", ".join(status["workers"]) or "-"
    lines = [f"{status['job']:<24} {status['state']:<13} attempt {status['attempt']:<3} workers: {workers}"]
    why = "failed: " if status["state"] == JobState.FAILED.value else ""
    lines.append(f"{'':<24} {why}{status['reason']}")
    if status.get("params"):
        lines.append(f"{'':<24} params: {', '.join(f'{k}={v}' for k, v in sorted(status['params'].items()))}")
    if status.get("secret_params"):
        lines.append(f"{'':<24} secret params: {', '.join(f'{name}=(sealed)' for name in status['secret_params'])}")
    letters = dead_letters_of(status["done"])
    if letters.count:
        shown = f" (the first {len(letters.first)})" if len(letters.first) < letters.count else ""
        lines.append(f"{'':<24} dead letters: {letters.count}{shown}")
        lines.extend(f"{'':<26} {line}" for line in letters.first)
    return "\n".join(lines)
