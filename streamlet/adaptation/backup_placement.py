"""Where each task's checkpoint backup is kept and where the task is redeployed after a node loss (seed 001,
Fujitsu's backup location controller), for a cluster without a shared disk.

The model. Task ``i`` runs on server ``host(i)``; every checkpoint sends ``backup_bytes`` from there to each
of its ``replicas`` backup servers (never its host: the backup must survive the host). When the host is
lost the task restarts on its redeploy server ``d(i)`` (never its host either), which must first receive
the task's state, ``transfer_bytes``, from the nearest backup server: ``transfer_bytes / bandwidth(s, d)``
seconds, or nothing at all when ``d(i)`` holds a backup. A plan chooses the backup servers and the
redeploy server of every task so that the total restore time, :func:`restore_time`, is least subject to:

- CPU: each redeploy server keeps room for every task it would take (``load + sum(cpu) <= cpu``); the room
  is reserved for all of them at once, so a plan still holds when several hosts are lost together;
- backup bandwidth: the checkpoint traffic a host sends on a link, ``backup_bytes / checkpoint_interval_s``
  for each task backed up over it, stays within ``backup_share`` of the link's bandwidth (the rest is the
  stream's own);
- latency: a task's restore finishes within its ``deadline_s`` (latency-critical tasks set a tight one).

Two controllers solve it: :func:`greedy_placement`, the seed's greedy with a local search on top
(milliseconds, for the cluster master), and :func:`exact_placement`, a MILP solved by HiGHS through
``scipy.optimize.milp`` (imported only there, so the master needs no scipy), to measure the greedy's gap.
Both give the best partial plan they can when not every task fits, naming each task left out and why.
Pure: a problem in, a plan out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

EPS = 1e-9  # slack on CPU comparisons: a task that fits exactly must fit, float sums or not
RATE_EPS = 1e-3  # the same on backup bytes/s (sums of 1e8-sized rates drift by far more than 1e-9)
DEFAULT_TIME_LIMIT_S = 10.0
INSTALL_HINT = "pip install 'streamlet[test]'"  # or [bench]: the extras that bring scipy
SEARCH_PASSES = 2  # measured on the benchmark's instances: a 3rd changed no plan (the search's budget is spent)
ORDERS: tuple[Callable[[Task], tuple[float, ...]], ...] = (  # the greedy's task orders, see greedy_placement
    # the seed's: the tightest latency requirement first; then the largest, as a task placed late may find no
    # server with room; then the costliest to move, as a task placed late may have to restore over a link
    lambda task: (task.deadline_s, -task.cpu, -task.transfer_bytes),
    lambda task: (-task.cpu, task.deadline_s, -task.transfer_bytes),  # the largest first
)


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
        _unique("server", names)
        _unique("task", [task.name for task in self.tasks])
        known = set(names)
        for task in self.tasks:
            if task.host not in known:
                raise ValueError(f"task '{task.name}' runs on '{task.host}', which is not a server")
        _check_links(self.bandwidth, known)
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
class _State:
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


def _state(problem: Problem) -> _State:
    names = [server.name for server in problem.servers]
    index = {name: i for i, name in enumerate(names)}
    bandwidth = [[0.0] * len(names) for _ in names]
    for (a, b), rate in problem.bandwidth.items():
        bandwidth[index[a]][index[b]] = bandwidth[index[b]][index[a]] = float(rate)
    inbound = [max(row, default=0.0) for row in bandwidth]
    return _State(
        names,
        [max(0.0, server.cpu - server.load) for server in problem.servers],
        bandwidth,
        [[rate * problem.backup_share if rate > 0 else -math.inf for rate in row] for row in bandwidth],
        [index[task.host] for task in problem.tasks],
        [task.backup_bytes / problem.checkpoint_interval_s for task in problem.tasks],
        [_fastest_first(row) for row in bandwidth],
        inbound,
        sorted((s for s, rate in enumerate(inbound) if rate > 0), key=lambda s: (-inbound[s], s)),
    )


def _fastest_first(links: list[float]) -> list[int]:
    return sorted((s for s, rate in enumerate(links) if rate > 0), key=lambda s: -links[s])


def greedy_placement(problem: Problem, replicas: int = 1, *, seed_only: bool = False) -> Plan:
    """The seed's greedy controller, improved. Tasks in order of latency requirement (the seed's) each take
    their best option with what is left (:func:`_best`); then a local search (``_backup_search.Search``)
    moves each task that restores over a link or was left out to a better option, making room for it by an
    ejection chain where that lowers the total. The same again with the largest tasks first, and the better
    plan of the two is kept (fewest tasks left out, then least restore time). ``seed_only``: the seed's
    greedy alone, without the search or the second order (to measure what they add). Never proven optimal.

    Why two orders: each order's search ends in a different local optimum, and the better of the two is
    closer to the optimum (the benchmark: mean gap 2.8 % with both, 8.7 % with the seed's order alone). The
    search's effort is bounded by a count of moves, so a run takes a few milliseconds (120 tasks x 30
    servers: 6.7 ms median, 14 ms on the hardest instance) and gives the same plan on any machine.

    >>> servers = (Server("a", 4), Server("b", 4), Server("c", 4))
    >>> task = Task("count", host="a", cpu=1, backup_bytes=1e6, transfer_bytes=1e9)
    >>> link = {("a", "b"): 1e9, ("a", "c"): 1e8, ("b", "c"): 1e9}
    >>> greedy_placement(Problem(servers, (task,), link)).placements[0]
    Placement(task='count', backups=('b',), redeploy='b', source='b', restore_s=0.0)
    """
    _check_replicas(problem, replicas)
    from streamlet.adaptation._backup_search import Search  # here: it builds on this module's helpers

    runs = [Search(problem, *_greedy(problem, order, replicas), replicas) for order in ORDERS[: 1 + (not seed_only)]]
    for search in runs:
        search.run(0 if seed_only else SEARCH_PASSES)
    search = min(runs, key=lambda search: search.score())  # the first on a tie: the seed's
    chosen = {i: option[1] for i, option in search.chosen.items()}
    return _plan(problem, search.state, chosen, replicas, False, "greedy")


def _greedy(
    problem: Problem, order: Callable[[Task], tuple[float, ...]], replicas: int
) -> tuple[_State, dict[int, Option]]:
    """The seed's greedy: the tasks in ``order`` each take their best option with what is left."""
    state = _state(problem)
    chosen: dict[int, Option] = {}
    for i in sorted(range(len(problem.tasks)), key=lambda i: order(problem.tasks[i])):
        option = _best(problem.tasks[i], i, state, replicas)
        if option is not None:
            _reserve(state, problem.tasks[i], i, option[1])
            chosen[i] = option
    return state, chosen


def _best(task: Task, i: int, state: _State, replicas: int, limit: float = math.inf) -> Option | None:
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
    if local >= 0 and (option := _at(task, i, state, local, replicas)) is not None:
        return option
    best: Option | None = None
    rank = (math.inf, 0.0, 0)  # best's: the soonest restore, then the most room left, then the first server
    for d in state.by_inbound:
        # no restore to d is faster than over its fastest link, and the servers come fastest link first: once
        # even that loses, so do all the rest (the hot loop of the search, which calls this for each task moved)
        soonest = task.transfer_bytes / state.inbound[d]
        if soonest >= limit or soonest > rank[0]:
            break
        if d == host or free[d] + EPS < task.cpu or soonest > task.deadline_s:  # as _at would say, sooner
            continue
        option = _at(task, i, state, d, replicas)
        if option is not None and option[0] < limit and (option[0], -free[d], d) < rank:
            best, rank = option, (option[0], -free[d], d)
    return best


def _at(task: Task, i: int, state: _State, d: int, replicas: int) -> Option | None:
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
    extra = _extra_holders(state, i, replicas - 1, {source})
    return None if extra is None else (seconds, ([source, *extra], d))


def _extra_holders(state: _State, i: int, count: int, taken: set[int]) -> list[int] | None:
    """``count`` more backup servers for task ``i``, those with the most backup bandwidth left from its host
    first (they add no restore time: the restore reads the nearest); ``None`` if there are not enough."""
    if count == 0:
        return []
    host, rate, room = state.host[i], state.rate[i], state.room[state.host[i]]
    spare = [s for s in range(len(room)) if s != host and s not in taken and room[s] + RATE_EPS >= rate]
    return sorted(spare, key=lambda s: -room[s])[:count] if len(spare) >= count else None


def _reserve(state: _State, task: Task, i: int, choice: Choice, sign: float = 1.0) -> None:
    """Take ``choice``'s CPU and backup bandwidth from what is left (``sign=-1``: give them back)."""
    backups, redeploy = choice
    state.free[redeploy] -= sign * task.cpu
    for s in backups:
        state.room[state.host[i]][s] -= sign * state.rate[i]


def _plan(
    problem: Problem, state: _State, chosen: dict[int, tuple[list[int], int]], replicas: int, optimal: bool, how: str
) -> Plan:
    """The plan of ``chosen`` (task -> (backup servers, redeploy server)), the others left out with why
    (given what the placed ones use: ``state`` has them reserved)."""
    placements, unplaced = [], []
    for i, task in enumerate(problem.tasks):
        if i in chosen:
            backups, redeploy = chosen[i]
            placements.append(_placement(problem, task, [state.names[s] for s in backups], state.names[redeploy]))
        else:
            unplaced.append(Unplaced(task.name, _why(task, i, state, replicas)))
    total = objective(problem, placements)
    summary = f"{how}: {len(placements)} of {len(problem.tasks)} tasks placed, restore time {total:.3f} s in all"
    if unplaced:
        summary += f"; left out: {', '.join(repr(u.task) for u in unplaced)}"
    return Plan(tuple(placements), tuple(unplaced), total, optimal, summary)


def _placement(problem: Problem, task: Task, backups: list[str], redeploy: str) -> Placement:
    """A placement, its source the backup server that restores soonest."""
    source = redeploy if redeploy in backups else max(backups, key=lambda s: problem.link(s, redeploy))
    return Placement(task.name, tuple(backups), redeploy, source, restore_time(problem, task, backups, redeploy))


def _why(task: Task, i: int, state: _State, replicas: int) -> str:
    """Why task ``i`` cannot be placed with what is left: CPU, backup bandwidth, or the restore itself."""
    host, names = state.host[i], state.names
    others = [d for d in range(len(names)) if d != host]
    if not any(state.free[d] + EPS >= task.cpu for d in others):
        most = max((state.free[d] for d in others), default=0.0)
        return (
            f"task '{task.name}' needs {task.cpu:g} CPU and no server but its host '{names[host]}' has that much "
            f"free (the most: {most:g})"
        )
    holders = sum(state.room[host][s] + RATE_EPS >= state.rate[i] for s in others)
    if holders < replicas:
        return (
            f"task '{task.name}' sends {_size(state.rate[i])}/s of backups and {holders} link(s) from its host "
            f"'{names[host]}' have that much backup bandwidth left ({replicas} needed)"
        )
    within = "" if math.isinf(task.deadline_s) else f" within its {task.deadline_s:g} s deadline"
    return (
        f"task '{task.name}': no server with {task.cpu:g} CPU free can get its {_size(task.transfer_bytes)} from a "
        f"server with backup bandwidth left{within}"
    )


def _size(size: float) -> str:
    """Bytes for a reader: '256 MB', '1.5 GB'."""
    return f"{size / 1e9:.3g} GB" if size >= 1e9 else f"{size / 1e6:.3g} MB"


def exact_placement(problem: Problem, replicas: int = 1, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Plan:
    """The least total restore time, solved as a MILP by HiGHS (``scipy.optimize.milp``) within
    ``time_limit_s``; ``Plan.optimal`` says whether it was proven. Binary ``x[i, s]``: task ``i`` has a
    backup on ``s``; binary ``z[i, d]``: it is redeployed on ``d``; ``u[i, s, d]`` in [0, 1]: it restores
    on ``d`` from ``s``, at ``transfer_bytes / bandwidth(s, d)`` seconds (0 when ``s == d``); binary
    ``v[i]``: it is left out, at a penalty above any total restore time, so the most tasks are placed first.
    When time runs out before the optimum is proven, the greedy plan is returned if it is better.

    Needs scipy (``pip install 'streamlet[test]'``), imported only here: the cluster master does without.
    """
    _check_replicas(problem, replicas)
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, not {time_limit_s}")
    try:
        from streamlet.adaptation import _backup_milp
    except ImportError as exc:
        raise ImportError(f"exact_placement needs scipy: {INSTALL_HINT}") from exc
    state = _state(problem)
    solution = _backup_milp.solve(problem, state, replicas, time_limit_s)
    greedy = greedy_placement(problem, replicas)
    if solution.chosen is None:  # no plan found in time (one always exists: leave every task out)
        return _fallback(greedy, f"HiGHS found no plan ({solution.message})")
    for i, choice in solution.chosen.items():
        _reserve(state, problem.tasks[i], i, choice)
    how = "exact (proven optimal)" if solution.proven else f"exact (time limit {time_limit_s:g} s, {solution.message})"
    plan = _plan(problem, state, solution.chosen, replicas, solution.proven, how)
    if not solution.proven and (len(greedy.unplaced), greedy.restore_s) < (len(plan.unplaced), plan.restore_s):
        return _fallback(greedy, f"HiGHS stopped at the time limit ({time_limit_s:g} s) with a worse plan")
    return plan


def _fallback(greedy: Plan, why: str) -> Plan:
    return Plan(greedy.placements, greedy.unplaced, greedy.restore_s, False, f"{why}; {greedy.reason}")


def violations(problem: Problem, plan: Plan, replicas: int = 1) -> list[str]:
    """What in ``plan`` breaks the model's constraints (empty: it is feasible); e.g. to check a standing plan
    against new loads and bandwidths before keeping it."""
    tasks = {task.name: task for task in problem.tasks}
    found: list[str] = []
    cpu = {server.name: 0.0 for server in problem.servers}
    sent: dict[tuple[str, str], float] = {}
    for p in plan.placements:
        task = tasks[p.task]
        if len(set(p.backups)) != replicas or task.host in p.backups or p.redeploy == task.host:
            found.append(f"task '{p.task}': backups {p.backups} and redeploy '{p.redeploy}' (host '{task.host}')")
        cpu[p.redeploy] += task.cpu
        for s in p.backups:
            sent[task.host, s] = sent.get((task.host, s), 0.0) + task.backup_bytes / problem.checkpoint_interval_s
        if restore_time(problem, task, p.backups, p.redeploy) > task.deadline_s:
            found.append(f"task '{p.task}' restores past its {task.deadline_s:g} s deadline")
    for server in problem.servers:
        if cpu[server.name] > max(0.0, server.cpu - server.load) * (1 + 1e-6) + EPS:
            found.append(f"server '{server.name}': load {server.load:g} + {cpu[server.name]:g} > {server.cpu:g} CPU")
    for (host, s), rate in sorted(sent.items()):
        budget = problem.link(host, s) * problem.backup_share
        if budget <= 0 or rate > budget * (1 + 1e-6) + EPS:
            found.append(f"link {host} -> {s}: backups {_size(rate)}/s, room for {_size(budget)}/s")
    return found


def synthetic_problem(tasks: int, servers: int, seed: int) -> Problem:
    """A random instance like the seed's evaluation, for benchmarks and tests: an edge cluster of 3 sites
    (10 Gb/s within a site, 100 Mb/s between sites, 50-100 % of it available); spare CPU 1.2 times what
    the tasks need, about 4 cores a server on at most half of them, unevenly spread over the sites; tasks
    of 0.5-2 cores with lognormal state (median 256 MB, 16 MB-2 GB) checkpointing 20-100 % of it every
    10 s, a third of them latency-critical (their restore needs 500 MB/s: a link within a site, or none)."""
    rng = random.Random(seed)
    names = [f"s{k:02d}" for k in range(servers)]
    site = [k * 3 // servers for k in range(servers)]
    bandwidth = {
        (names[a], names[b]): (1.25e9 if site[a] == site[b] else 1.25e7) * rng.uniform(0.5, 1.0)
        for a in range(servers)
        for b in range(a + 1, servers)
    }
    work = []
    for i in range(tasks):
        state = min(2e9, max(16e6, rng.lognormvariate(math.log(256e6), 1.0)))
        deadline = state / 5e8 if rng.random() < 1 / 3 else math.inf
        cores = rng.choice((0.5, 1.0, 2.0))
        work.append(Task(f"t{i:03d}", rng.choice(names), cores, state * rng.uniform(0.2, 1.0), state, deadline))
    need = 1.2 * math.fsum(task.cpu for task in work)
    share = [rng.uniform(0.3, 1.7) for _ in range(3)]
    spread = min(servers // 2, max(1, round(need / 4)))  # 4 spare cores a server on average, on at most half
    weights = {names[k]: rng.uniform(0.5, 1.5) * share[site[k]] for k in sorted(rng.sample(range(servers), spread))}
    spare = need / math.fsum(weights.values())
    hosted = {name: math.fsum(task.cpu for task in work if task.host == name) for name in names}
    machines = tuple(
        Server(name, 16.0 + hosted[name] + spare * weights.get(name, 0.0), 16.0 + hosted[name]) for name in names
    )
    return Problem(machines, tuple(work), bandwidth)


def _check_replicas(problem: Problem, replicas: int) -> None:
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, not {replicas}")
    if replicas > len(problem.servers) - 1:
        raise ValueError(
            f"replicas={replicas}: a task's backups need {replicas} servers other than its host, and there are "
            f"only {len(problem.servers) - 1}"
        )


def _unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"two {what}s are named '{name}'")
        seen.add(name)


def _check_links(bandwidth: Mapping[tuple[str, str], float], known: set[str]) -> None:
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
