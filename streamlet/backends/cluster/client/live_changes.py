"""The client's side of a live change: ask the leader for one, follow it until done or refused, and carry out a
rebalance's moves one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio

from streamlet.adaptation.rebalance import Migration
from streamlet.backends.cluster.tree import jobs, paths
from streamlet.backends.cluster.tree.layouts import new_table, request_node, with_layout
from streamlet.backends.cluster.tree.lifecycle import JobState
from streamlet.backends.cluster.tree.paths import ReconfigureRequest
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model import world
from streamlet.errors import NodeExists, ReconfigurationError

POLL = 0.1  # seconds between looks while a client waits for a change (as ``submit --wait`` does)


@dataclass(frozen=True, slots=True)
class Asked:
    """Where the job stood when a change was asked: its count of changes done and its attempt."""

    reconfigurations: int
    attempt: int


async def ask(store: ClusterStore, job: str, request: ReconfigureRequest, secret: bytes | None = None) -> Asked:
    """Check ``request`` against the running job and leave it for the leader; returns where the job stood
    (what :func:`wait_done` follows it from)."""
    status = await jobs.job_status(store, job)
    if status["state"] != JobState.RUNNING.value:
        raise ReconfigurationError(f"job '{job}' is {status['state']}: only a RUNNING job changes shape")
    found = await store.get(paths.spec(job))
    if found is None:
        raise ReconfigurationError(f"job '{job}' has no spec")
    layout = await store.get(paths.layout(job))
    topology = with_layout(jobs.topology_of(found.data, secret), None if layout is None else layout.data)
    new_table(topology, None if layout is None else layout.data, request)  # refused here, with the reason, at once
    try:
        await store.create(paths.reconfigure_request(job), request)
    except NodeExists:
        raise ReconfigurationError(f"a change of job '{job}' is waiting already: one at a time") from None
    return Asked(int(status["reconfigurations"]), int(status["attempt"]))


async def wait_done(store: ClusterStore, job: str, asked: Asked, asked_at: float, seconds: float) -> dict[str, Any]:
    """Follow the job until the change is done (its status then), or refused or dropped (a
    :class:`ReconfigurationError` at once, saying why)."""
    with anyio.move_on_after(seconds):
        while True:
            status = await jobs.job_status(store, job)
            if int(status["reconfigurations"]) > asked.reconfigurations and status["state"] == JobState.RUNNING.value:
                return status
            if JobState(status["state"]).ended:
                raise ReconfigurationError(f"job '{job}' ended ({status['state']}) before the change was done")
            refused = await store.get(paths.reconfigure_refused(job))
            if refused is not None and float(refused.data["at"]) >= asked_at:
                if refused.data.get("dropped"):
                    raise ReconfigurationError(
                        f"the cluster dropped the change ({refused.data['error']}): job '{job}' runs on in its "
                        "old shape, in a new attempt from its last checkpoint; ask again once it runs"
                    )
                raise ReconfigurationError(f"the leader refused the change: {refused.data['error']}")
            if int(status["attempt"]) > asked.attempt:  # the leader fell back to a new attempt: in the old shape
                raise ReconfigurationError(
                    f"the cluster dropped the change: job '{job}' went on to attempt {status['attempt']} in its "
                    "old shape; ask again once it runs"
                )
            await anyio.sleep(POLL)
    raise ReconfigurationError(f"job '{job}' has not finished the change after {seconds:g} s ({status['reason']})")


async def carry_out(
    store: ClusterStore, job: str, moves: list[Migration], seconds: float, secret: bytes | None = None
) -> None:
    """Each move as a live migration, waiting for one before asking the next (the leader takes one change
    at a time); a refused or unfinished one stops here, saying how far it got."""
    for done, move in enumerate(moves):
        asked_at = world.wall_time()
        request = request_node(paths.task_of(move.instance), migrate=(move.index, move.target))
        try:
            asked = await ask(store, job, request, secret)
            await wait_done(store, job, asked, asked_at, seconds)
        except ReconfigurationError as exc:
            raise ReconfigurationError(f"{exc} (moving {move.instance}; {done} of {len(moves)} moves done)") from exc
