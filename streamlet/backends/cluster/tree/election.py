"""Master election: candidates race for the ephemeral ``/leader`` node; the winner's epoch fences the rest.

Every candidate registers under ``/candidates`` (ephemeral, sequential) and
waits for ``/leader`` to be absent. It then writes, in one transaction, the
next epoch to ``/epoch`` (versioned, so epochs only grow) and ``/leader``
holding its identity and that epoch. The loser's transaction fails whole and
it goes back to waiting, so ``/epoch`` always holds the current leader's
epoch. A leader's session ending deletes ``/leader``, and the race starts
again.

A deposed leader that has not noticed yet (stopped, partitioned) can change
nothing: every transaction it commits checks that ``/epoch`` is still at the
version its election wrote (:class:`LeaderFence`), and workers keep the
highest epoch they have seen and refuse commands that carry an older one
(:class:`EpochFence`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.store import Check, ClusterStore, Create, Op, SetData

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
            epoch, bump = await _next_epoch(self.zk)
            leading = Create(LEADER, {**self.identity, "epoch": epoch}, ephemeral=True)
            if await self.zk.commit([bump, leading]):
                self.epoch = epoch
                return epoch
            # another candidate was quicker: its epoch is in /epoch, ours was never written

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


async def _next_epoch(zk: ClusterStore) -> tuple[int, Op]:
    """The epoch after the one in ``/epoch``, and the step that writes it (only if ``/epoch`` did not move)."""
    found = await zk.get(EPOCH)
    if found is None:
        return 1, Create(EPOCH, {"epoch": 1})
    epoch = int(found.data["epoch"]) + 1
    return epoch, SetData(EPOCH, {"epoch": epoch}, found.version)


class LeaderFence:
    """A leader's writes, fenced on its term: each transaction also checks that ``/epoch`` is still at the
    version that holds this leader's epoch.

    Once another master is elected (its election moves ``/epoch``), nothing this leader commits lands,
    whatever it read before and however long it was stopped between its read and its write. A leader
    made without an election (tests, an embedding) first writes its epoch to ``/epoch`` when that holds
    an older one, or none.
    """

    def __init__(self, store: ClusterStore, epoch: int) -> None:
        self.store = store
        self.epoch = epoch
        self._version: int | None = None  # /epoch's version holding our epoch, once read

    async def commit(self, ops: Sequence[Op]) -> bool:
        """Apply ``ops`` all or nothing, with the fence's check; ``False`` when a step did not hold, or when a
        newer leader was elected."""
        version = await self._term()
        if version is None:
            return False
        return await self.store.commit([Check(EPOCH, version), *ops])

    async def _term(self) -> int | None:
        """The version of ``/epoch`` holding this leader's epoch (``None``: a newer leader's is there)."""
        while self._version is None:
            found = await self.store.get(EPOCH)
            held = None if found is None else int(found.data["epoch"])
            if found is not None and held == self.epoch:
                self._version = found.version
            elif held is not None and held > self.epoch:
                return None
            else:  # no election wrote this epoch: take /epoch for it (a newer leader's write wins the race)
                step = (
                    Create(EPOCH, {"epoch": self.epoch})
                    if found is None
                    else SetData(EPOCH, {"epoch": self.epoch}, found.version)
                )
                await self.store.commit([step])
        return self._version


async def leader(zk: ClusterStore) -> dict[str, Any] | None:
    """The current leader's identity and epoch, if there is one."""
    found = await zk.get(LEADER)
    return None if found is None else found.data


async def candidates(zk: ClusterStore) -> list[dict[str, Any]]:
    """Every registered candidate's identity, oldest first."""
    found = []
    for name in await zk.children(paths.CANDIDATES):
        entry = await zk.get(paths.candidate(name))
        if entry is not None:
            found.append(entry.data)
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
