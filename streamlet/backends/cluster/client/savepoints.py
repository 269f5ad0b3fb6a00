"""Savepoints of cluster jobs: ``streamlet savepoint``, ``stop --savepoint``, ``submit --from-savepoint``.

A savepoint is one of the job's checkpoints, taken at once: the client writes
the next epoch into the attempt's trigger node (as the attempt's first worker
does every interval; it waits while a live change holds the trigger), waits
until ZooKeeper records that epoch complete, and writes the workers' parts
merged to the file the user names, in the checkpoint format
(``core.state.savepoints``). The trigger names a folder beside that file,
``<file>.parts/``, where every worker writes its part of that epoch as well
(the savepoint's path is external storage every worker reaches, as a file
sink's folder is; their checkpoint files stay on their own disks). ``stop --savepoint`` asks the sources to stop
reading before that barrier (everything read is in it), then kills the job.
A job submitted with ``--from-savepoint`` restores its first attempt from the
file when it has no checkpoint of its own yet.
"""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from streamlet.backends.cluster.tree import jobs, paths
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.paths import JobSpec
from streamlet.backends.cluster.tree.signing import sign_export
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model import world
from streamlet.core.state.parts import merge_parts
from streamlet.core.state.savepoints import check_fits, read_savepoint, write_savepoint
from streamlet.core.state.store import decode
from streamlet.errors import JobError, NodeExists, VersionConflict


async def take(
    store: ClusterStore, job: str, path: Path, secret: bytes, pause: bool = False, seconds: float = 120
) -> int:
    """A checkpoint of running ``job`` now, written to ``path``; returns its epoch. ``pause``: the sources
    stop reading first (for a stop). The folder the workers write their parts into is signed with
    ``secret`` (a worker writes nowhere else)."""
    status = await jobs.job_status(store, job)
    if status["state"] != JobState.RUNNING.value:
        raise JobError(f"job '{job}' is {status['state']}: a savepoint is taken of a RUNNING job")
    spec = await store.get(paths.spec(job))
    settings = None if spec is None else spec.data.get("checkpoint")
    if settings is None:
        raise JobError(f"job '{job}' takes no checkpoints: submit it with --checkpoint-interval to take savepoints")
    attempt = int(status["attempt"])
    folder = (await world.blocking(path.resolve)).with_name(f"{path.name}.parts")
    await world.blocking(partial(folder.mkdir, parents=True, exist_ok=True))
    try:
        with anyio.fail_after(seconds):
            asked = await _trigger(store, job, attempt, pause, str(folder), secret)
            _, workers = await _completed(store, job, attempt, asked)
        epoch = asked  # complete (a later one may be too): its parts are in the folder

        def merged() -> dict[str, Any]:
            files = [folder / f"{worker}.msgpack" for worker in workers]
            return merge_parts([decode(file.read_bytes(), str(file)) for file in files])

        try:
            document = await world.blocking(merged)
        except (OSError, ValueError) as exc:
            raise JobError(f"checkpoint {epoch} of job '{job}' cannot be read for the savepoint: {exc}") from exc
        await world.blocking(write_savepoint, path, document)
    finally:
        await world.blocking(partial(shutil.rmtree, folder, ignore_errors=True))
    return epoch


async def _trigger(store: ClusterStore, job: str, attempt: int, pause: bool, export: str, secret: bytes) -> int:
    """Write the next epoch into the attempt's trigger (waiting while a live change holds it), asking every
    worker to write its part into ``export`` too; returns the epoch."""
    path = paths.trigger_path(job, attempt)
    while True:
        found = await store.get(path)
        if found is not None and found.data.get("hold") is not None:
            await store.wait_changed(path, found.version)
            continue
        if found is not None and found.data["final"]:
            raise JobError(f"job '{job}' is finishing: its final checkpoint is under way")
        completed = await store.get(paths.completed(job))
        done = 0 if completed is None else int(completed.data["epoch"])
        epoch = max(done, 0 if found is None else int(found.data["epoch"])) + 1
        trigger = paths.next_trigger(
            None if found is None else found.data, epoch, final=False, pause=pause, at=world.wall_time(),
            export=export, export_signature=sign_export(secret, job, epoch, export),
        )  # fmt: skip
        try:
            if found is None:
                await store.create(path, trigger)
            else:
                await store.set(path, trigger, found.version)
            return epoch
        except (NodeExists, VersionConflict):
            continue  # a worker triggered meanwhile: look again


async def _completed(store: ClusterStore, job: str, attempt: int, epoch: int) -> tuple[int, list[str]]:
    """Wait until ``epoch`` (or a later one) of ``attempt`` is complete everywhere; that epoch, and the workers
    whose parts make it up (a later one is as good: it too holds everything read before the request)."""
    version: int | None = -2
    while True:
        data, version = await store.wait_changed(paths.completed(job), version)
        if data is not None and (int(data["attempt"]), int(data["epoch"])) >= (attempt, epoch):
            if int(data["attempt"]) != attempt:
                raise JobError(f"job '{job}' moved on to attempt {data['attempt']} before the savepoint completed")
            return int(data["epoch"]), list(data["workers"])


def check_for_submit(path: Path, spec: JobSpec) -> str:
    """The savepoint a job will start from, checked against its topology now (a clear error naming the node
    before anything is written); returns its absolute path for the spec."""
    source = path.resolve()
    _, document = read_savepoint(source)
    check_fits(document, jobs.topology_of(spec), f"savepoint {source}")
    return str(source)
