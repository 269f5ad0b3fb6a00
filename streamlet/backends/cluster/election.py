"""Master election: candidates race for the ephemeral ``/leader`` node; the winner's epoch fences the rest.

Every candidate registers under ``/candidates`` (ephemeral, sequential) and
waits for ``/leader`` to be absent. It then takes the next epoch from
``/epoch`` (a versioned compare-and-set, so epochs only grow) and tries to
create ``/leader`` holding its identity and that epoch. The loser goes back
to waiting. A leader's session ending deletes ``/leader``, and the race starts
again. Workers keep the highest epoch they have seen and refuse commands that
carry an older one (:class:`EpochFence`), so a deposed leader that has not
noticed yet can change nothing.
"""

from __future__ import annotations

from typing import Any

from streamlet.backends.cluster import paths
from streamlet.backends.cluster.store import ClusterStore
from streamlet.errors import NodeExists, VersionConflict

LEADER = paths.LEADER
EPOCH = paths.EPOCH


class LeaderElection:
    """One candidate's part in the election."""

    def __init__(self, zk: ClusterStore, identity: dict[str, Any]) -> None:
        self.zk = zk
        self.identity = identity
        self.epoch: int | None = None
        self.candidate: str | None = None

    async def campaign(self) -> int:
        """Wait until this candidate leads; returns its epoch (the fencing token)."""
        if self.candidate is None:
            prefix = paths.candidate_prefix()
            self.candidate = await self.zk.create(prefix, self.identity, ephemeral=True, sequence=True)
        while True:
            await self.zk.wait_gone(LEADER)
            epoch = await next_epoch(self.zk)
            try:
                await self.zk.create(LEADER, {**self.identity, "epoch": epoch}, ephemeral=True)
            except NodeExists:
                continue  # another candidate was quicker; this epoch number is simply skipped
            self.epoch = epoch
            return epoch

    async def still_leading(self) -> bool:
        """Whether ``/leader`` still names this candidate's epoch (check before acting after SUSPENDED)."""
        current = await leader(self.zk)
        return current is not None and current.get("epoch") == self.epoch

    async def resign(self) -> None:
        """Step down (if still leading) and leave the candidates."""
        if self.epoch is not None and await self.still_leading():
            await self.zk.delete(LEADER)
        self.epoch = None
        if self.candidate is not None:
            await self.zk.delete(self.candidate)
            self.candidate = None


async def next_epoch(zk: ClusterStore) -> int:
    """Increment ``/epoch`` atomically and return the new value."""
    while True:
        found = await zk.get(EPOCH)
        if found is None:
            try:
                await zk.create(EPOCH, {"epoch": 1})
                return 1
            except NodeExists:
                continue
        data, version = found
        epoch = int(data["epoch"]) + 1
        try:
            await zk.set(EPOCH, {"epoch": epoch}, version=version)
            return epoch
        except VersionConflict:
            continue


async def leader(zk: ClusterStore) -> dict[str, Any] | None:
    """The current leader's identity and epoch, if there is one."""
    found = await zk.get(LEADER)
    return None if found is None else found[0]


async def candidates(zk: ClusterStore) -> list[dict[str, Any]]:
    """Every registered candidate's identity, oldest first."""
    found = []
    for name in await zk.children(paths.CANDIDATES):
        entry = await zk.get(f"{paths.CANDIDATES}/{name}")
        if entry is not None:
            found.append(entry[0])
    return found


class EpochFence:
    """What a worker keeps: the highest leader epoch seen; older commands are refused."""

    def __init__(self) -> None:
        self.highest = 0
        self.refused = 0

    def accept(self, epoch: int) -> bool:
        """True for a command from the current (or a newer) leader."""
        if epoch < self.highest:
            self.refused += 1
            return False
        self.highest = epoch
        return True
