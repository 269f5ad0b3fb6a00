"""The backup placement problem (seed 001): its servers, tasks, links and plans, and the bookkeeping every
controller shares: the room and link capacity left as tasks take options (State), a task's best option, and
reserving one. The model itself is told in backup_placement; the controllers (the greedy there, the local
search in _backup_search, the MILP in _backup_milp) build on this module, which imports none of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

EPS = 1e-9  # slack on CPU comparisons: a task that fits exactly must fit, float sums or not
RATE_EPS = 1e-3  # the same on backup bytes/s (sums of 1e8-sized rates drift by far more than 1e-9)


@dataclass(frozen=True, slots=True)
class Server:
    """A server: ``cpu`` cores in all, ``load`` of them in use now (by the tasks it runs, among others)."""

    name: str
    cpu: float
    load: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a server needs a name")
        for what, value in (("cpu", self.cpu), ("load", self.load)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"server '{self.name}': {what} must be a finite number >= 0, not {value}")


@dataclass(frozen=True, slots=True)
class Task:
    """A task running on ``host`` that needs ``cpu`` cores wherever it is redeployed, checkpoints
    ``backup_bytes`` each interval and needs ``transfer_bytes`` moved to a redeploy server that holds no
    backup of it, within ``deadline_s`` (its latency requirement; infinite: none)."""

    name: str
    host: str
    cpu: float
    backup_bytes: float
    transfer_bytes: float
    deadline_s: float = math.inf

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a task needs a name")
        for what, value in (
            ("cpu", self.cpu),
            ("backup_bytes", self.backup_bytes),
            ("transfer_bytes", self.transfer_bytes),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"task '{self.name}': {what} must be a finite number >= 0, not {value}")
        if not self.deadline_s > 0:  # also refuses NaN
            raise ValueError(f"task '{self.name}': deadline_s must be > 0, not {self.deadline_s}")


@dataclass(frozen=True, slots=True)
class Problem:
    """The servers, the tasks, and ``bandwidth``: bytes per second of the link between two servers, keyed by
    the pair in either order, each direction having it all (a pair not given has no link)."""

    servers: tuple[Server, ...]
    tasks: tuple[Task, ...]
    bandwidth: Mapping[tuple[str, str], float]
    checkpoint_interval_s: float = 10.0
    backup_share: float = 0.5

    def __post_init__(self) -> None:
        names = [server.name for server in self.servers]
        check_unique("server", names)
        check_unique("task", [task.name for task in self.tasks])
        known = set(names)
        for task in self.tasks:
            if task.host not in known:
                raise ValueError(f"task '{task.name}' runs on '{task.host}', which is not a server")
        check_links(self.bandwidth, known)
        object.__setattr__(self, "bandwidth", MappingProxyType(dict(self.bandwidth)))  # a copy: checked once
        if not (math.isfinite(self.checkpoint_interval_s) and self.checkpoint_interval_s > 0):
            raise ValueError(f"checkpoint_interval_s must be > 0, not {self.checkpoint_interval_s}")
        if not 0 < self.backup_share <= 1:
            raise ValueError(f"backup_share must be in (0, 1], not {self.backup_share}")

    def link(self, a: str, b: str) -> float:
        """Bytes per second between ``a`` and ``b`` (0.0: no link)."""
        return self.bandwidth.get((a, b), self.bandwidth.get((b, a), 0.0))


@dataclass(frozen=True, slots=True)
class Placement:
    """Task ``task``'s backups live on ``backups``; after a loss of its host it restarts on ``redeploy``,
    receiving its state from ``source`` (one of ``backups``; ``redeploy`` itself when restore_s is 0)."""

    task: str
    backups: tuple[str, ...]
    redeploy: str
    source: str
    restore_s: float


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A task no plan could place, and why."""

    task: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """A controller's answer: placements (input order), the tasks left out, the total restore time of the
    placed ones (:func:`restore_time`), whether it is proven optimal, and a one-line summary."""

    placements: tuple[Placement, ...]
    unplaced: tuple[Unplaced, ...]
    restore_s: float
    optimal: bool
    reason: str

    def by_task(self) -> dict[str, Placement]:
        """``{task: placement}``."""
        return {placement.task: placement for placement in self.placements}


def restore_time(problem: Problem, task: Task, backups: Sequence[str], redeploy: str) -> float:
    """The restore transfer time of ``task`` redeployed on ``redeploy``: 0 when it holds a backup, else
    ``transfer_bytes`` over the fastest link from a backup server (infinite when there is none)."""
    if redeploy in backups:
        return 0.0
    fastest = max((problem.link(source, redeploy) for source in backups), default=0.0)
    return task.transfer_bytes / fastest if fastest > 0 else math.inf


def objective(problem: Problem, placements: Iterable[Placement]) -> float:
    """What both controllers minimise (once as many tasks as can be are placed): the total restore time of
    ``placements``, recomputed from ``problem``. The greedy's gap is ``objective(greedy) / objective(exact) - 1``.
    """
    tasks = {task.name: task for task in problem.tasks}
    return math.fsum(restore_time(problem, tasks[p.task], p.backups, p.redeploy) for p in placements)


Choice = tuple[list[int], int]  # (backup servers, redeploy server), as indexes into Problem.servers
Option = tuple[float, Choice]  # a choice and its restore time


@dataclass(slots=True)
class State:
    """The indexed problem, and what a plan has used so far (the controllers' working state)."""

    names: list[str]
    free: list[float]  # cores each server can still reserve
    bandwidth: list[list[float]]  # bytes/s, 0.0: no link
    room: list[list[float]]  # backup bytes/s each host may still send on each link (-inf: no link)
    host: list[int]
    rate: list[float]  # each task's backup traffic, bytes/s
    fastest_to: list[list[int]]  # for each server, the servers linked to it, fastest link first
    inbound: list[float]  # for each server, its fastest link's bytes/s (0.0: none)
    by_inbound: list[int]  # the servers with a link, fastest link first


def initial_state(problem: Problem) -> State:
    names = [server.name for server in problem.servers]
    index = {name: i for i, name in enumerate(names)}
    bandwidth = [[0.0] * len(names) for _ in names]
    for (a, b), rate in problem.bandwidth.items():
        bandwidth[index[a]][index[b]] = bandwidth[index[b]][index[a]] = float(rate)
    inbound = [max(row, default=0.0) for row in bandwidth]
    return State(
        names,
        [max(0.0, server.cpu - server.load) for server in problem.servers],
        bandwidth,
        [[rate * problem.backup_share if rate > 0 else -math.inf for rate in row] for row in bandwidth],
        [index[task.host] for task in problem.tasks],
        [task.backup_bytes / problem.checkpoint_interval_s for task in problem.tasks],
        [fastest_first(row) for row in bandwidth],
        inbound,
        sorted((s for s, rate in enumerate(inbound) if rate > 0), key=lambda s: (-inbound[s], s)),
    )


def fastest_first(links: list[float]) -> list[int]:
    return sorted((s for s, rate in enumerate(links) if rate > 0), key=lambda s: -links[s])


def best_option(task: Task, i: int, state: State, replicas: int, limit: float = math.inf) -> Option | None:
    """Task ``i``'s best option with what is left: a redeploy server that also holds a backup (no
    transfer), the least loaded then the best connected to the host (the seed's server order); else the
    redeploy server with room that a backup server can restore to soonest, within the deadline; ``None`` if
    there is none (or none restoring sooner than ``limit``)."""
    host, free, link = state.host[i], state.free, state.bandwidth[state.host[i]]
    room, rate = state.room[host], state.rate[i]
    local, key = -1, (-1.0, -1.0)
    for d, cores in enumerate(free):
        if d != host and cores + EPS >= task.cpu and room[d] + RATE_EPS >= rate and (cores, link[d]) > key:
            local, key = d, (cores, link[d])
    if local >= 0 and (option := option_at(task, i, state, local, replicas)) is not None:
        return option
    best: Option | None = None
    rank = (math.inf, 0.0, 0)  # best's: the soonest restore, then the most room left, then the first server
    for d in state.by_inbound:
        # no restore to d is faster than over its fastest link, and the servers come fastest link first: once
        # even that loses, so do all the rest (the hot loop of the search, which calls this for each task moved)
        soonest = task.transfer_bytes / state.inbound[d]
        if soonest >= limit or soonest > rank[0]:
            break
        if d == host or free[d] + EPS < task.cpu or soonest > task.deadline_s:  # as option_at would say, sooner
            continue
        option = option_at(task, i, state, d, replicas)
        if option is not None and option[0] < limit and (option[0], -free[d], d) < rank:
            best, rank = option, (option[0], -free[d], d)
    return best


def option_at(task: Task, i: int, state: State, d: int, replicas: int) -> Option | None:
    """Task ``i`` redeployed on ``d``: its backup there too if the host's link to ``d`` has room (no
    transfer), else on the server with room whose link to ``d`` is fastest; ``None`` if ``d`` has no CPU
    for it or the restore misses the deadline."""
    host, rate, room = state.host[i], state.rate[i], state.room[state.host[i]]
    if d == host or state.free[d] + EPS < task.cpu:
        return None
    if room[d] + RATE_EPS >= rate:
        source, seconds = d, 0.0
    else:
        source = next((s for s in state.fastest_to[d] if s != host and room[s] + RATE_EPS >= rate), -1)
        if source < 0 or (seconds := task.transfer_bytes / state.bandwidth[source][d]) > task.deadline_s:
            return None
    extra = extra_holders(state, i, replicas - 1, {source})
    return None if extra is None else (seconds, ([source, *extra], d))


def extra_holders(state: State, i: int, count: int, taken: set[int]) -> list[int] | None:
    """``count`` more backup servers for task ``i``, those with the most backup bandwidth left from its host
    first (they add no restore time: the restore reads the nearest); ``None`` if there are not enough."""
    if count == 0:
        return []
    host, rate, room = state.host[i], state.rate[i], state.room[state.host[i]]
    spare = [s for s in range(len(room)) if s != host and s not in taken and room[s] + RATE_EPS >= rate]
    return sorted(spare, key=lambda s: -room[s])[:count] if len(spare) >= count else None


def reserve(state: State, task: Task, i: int, choice: Choice, sign: float = 1.0) -> None:
    """Take ``choice``'s CPU and backup bandwidth from what is left (``sign=-1``: give them back)."""
    backups, redeploy = choice
    state.free[redeploy] -= sign * task.cpu
    for s in backups:
        state.room[state.host[i]][s] -= sign * state.rate[i]


def check_unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"two {what}s are named '{name}'")
        seen.add(name)


def check_links(bandwidth: Mapping[tuple[str, str], float], known: set[str]) -> None:
    for (a, b), rate in bandwidth.items():
        for name in (a, b):
            if name not in known:
                raise ValueError(f"bandwidth ({a!r}, {b!r}) names '{name}', which is not a server")
        if a == b:
            raise ValueError(f"bandwidth ({a!r}, {b!r}) links a server to itself")
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"bandwidth ({a!r}, {b!r}) must be a finite number of bytes/s > 0, not {rate}")
        if (b, a) in bandwidth and bandwidth[b, a] != rate:
            raise ValueError(f"bandwidth ({a!r}, {b!r}) is {rate} one way and {bandwidth[b, a]} the other")
