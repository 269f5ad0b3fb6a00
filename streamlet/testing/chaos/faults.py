"""Fault schedules drawn from a seed: what goes wrong, to whom, when, and for how long.

:func:`schedule` is pure (a seed and the names of the parties in, a list of
:class:`Fault` out), so the simulation and a nemesis driving real processes
draw the same schedules from the same seeds.

Kinds (:data:`KINDS`):

- ``kill``: a master or worker dies at once (SIGKILL); it is started again
  ``lasts`` seconds later.
- ``disk``: a worker dies and comes back without its files.
- ``pause``: a master or worker stops (SIGSTOP) for ``lasts`` seconds while
  time runs, then goes on (a zombie if its session expired meanwhile).
- ``partition``: two parties cannot reach each other for ``lasts`` seconds.
- ``isolate``: a party cannot reach the store for ``lasts`` seconds.
- ``slow``: every link of a party is 20 times slower for ``lasts`` seconds.
- ``expire``: the store expires a party's session at once.
- ``crash-checkpoint``, ``crash-change``, ``crash-commit``: a worker dies at
  the next checkpoint it is asked for, the next live change, the next
  completed checkpoint (after ``at``); started again ``lasts`` seconds after.
- ``crash-savepoint``: a client asks for a savepoint at ``at``; a worker dies
  when the savepoint's checkpoint is triggered (started again ``lasts``
  seconds after). The savepoint completes or fails with a reason.
- ``pause-commit``: the master leading at ``at`` stops in the middle of its
  next write (its request on the way) for ``lasts`` seconds, longer than a
  session: another master leads meanwhile, and the request arrives late.

Kinds only real processes have (:data:`REAL_KINDS`, the nemesis's):

- ``zookeeper``: a ZooKeeper member dies (SIGKILL); it is started again
  ``lasts`` seconds later.
- ``cut-off``: a master or worker can reach nobody (ZooKeeper, peers, the
  client) for ``lasts`` seconds.

Example:
    >>> faults = schedule(7, ["master-0"], ["worker-0", "worker-1"], count=3)
    >>> len(faults), faults == schedule(7, ["master-0"], ["worker-0", "worker-1"], count=3)
    (3, True)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

FIRST_KINDS = (
    "kill", "disk", "pause", "partition", "isolate", "slow", "expire",
    "crash-checkpoint", "crash-change", "crash-commit", "pause-commit",
)  # fmt: skip
KINDS = (*FIRST_KINDS, "crash-savepoint")  # new kinds go last: FIRST_KINDS alone draws the schedules it always did
REAL_KINDS = ("zookeeper", "cut-off")  # the nemesis's only: the simulation has one store, no hosts to cut
LEADER = "leader"  # the target of a pause-commit: whichever master leads then
CRASH_POINTS = {
    "crash-checkpoint": "checkpoint", "crash-change": "change", "crash-commit": "commit",
    "crash-savepoint": "savepoint",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Fault:
    """``kind`` happens to ``target`` (and ``other``, for a partition) ``at`` seconds into the run and lasts
    ``lasts`` seconds (a restart, a resume, a heal comes then; 0 for ``expire``)."""

    at: float
    kind: str
    target: str
    other: str | None = None
    lasts: float = 0.0

    def __str__(self) -> str:
        between = f"|{self.other}" if self.other else ""
        return f"{self.at:.3f}s {self.kind} {self.target}{between} for {self.lasts:.3f}s"

    def to_data(self) -> dict[str, object]:
        """As JSON (the chaos command's report)."""
        return {"at": round(self.at, 6), "kind": self.kind, "target": self.target, "other": self.other,
                "lasts": round(self.lasts, 6)}  # fmt: skip


def check_kinds(kinds: Sequence[str]) -> list[str]:
    """``kinds`` if every one is known; else a ``ValueError`` naming the unknown and the known."""
    unknown = [kind for kind in kinds if kind not in (*KINDS, *REAL_KINDS)]
    if unknown:
        raise ValueError(f"unknown fault kind {unknown[0]!r}; the kinds are {', '.join((*KINDS, *REAL_KINDS))}")
    if not kinds:
        raise ValueError(f"no fault kind given; the kinds are {', '.join(KINDS)}")
    return list(kinds)


def schedule(
    seed: int,
    masters: Sequence[str],
    workers: Sequence[str],
    *,
    kinds: Sequence[str] = KINDS,
    count: int | None = None,
    horizon: float = 9.0,
    longest: float = 6.0,
    session: float = 4.0,
    zookeepers: Sequence[str] = (),
) -> list[Fault]:
    """``count`` faults (default: 3 to 6) of ``kinds``, at moments in (0.3, ``horizon``) seconds, in time order
    (``session``: the store's session timeout, which a pause-commit outlasts; ``zookeepers``: the members a
    ``zookeeper`` fault may take down)."""
    rng = random.Random(f"faults:{seed}")
    kinds = check_kinds(kinds)
    count = rng.randint(3, 6) if count is None else count
    parties = [*masters, *workers]
    faults = []
    for _ in range(count):
        kind = rng.choice(kinds)
        at = rng.uniform(0.3, horizon)
        lasts = 0.0 if kind == "expire" else rng.uniform(0.2, longest)
        other = None
        if kind == "pause-commit":
            target, lasts = LEADER, rng.uniform(session + 0.5, session + longest)
        elif kind in ("disk", *CRASH_POINTS):
            target = rng.choice(list(workers))
        elif kind == "zookeeper":
            target = rng.choice(list(zookeepers))
        elif kind == "partition":
            target, other = rng.sample(parties, 2)
        else:
            target = rng.choice(parties)
        faults.append(Fault(at, kind, target, other, lasts))
    return sorted(faults, key=lambda fault: fault.at)
