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
from collections.abc import Callable

from streamlet.adaptation._backup_search import Search
from streamlet.adaptation.backup_model import (
    EPS,
    RATE_EPS,
    Option,
    Placement,
    Plan,
    Problem,
    Server,
    State,
    Task,
    Unplaced,
    best_option,
    initial_state,
    objective,
    reserve,
    restore_time,
)

__all__ = [  # the model's names, as this module has always offered them, and the controllers
    "EPS", "RATE_EPS", "Placement", "Plan", "Problem", "Server", "Task", "Unplaced", "exact_placement",
    "greedy_placement", "objective", "random_placement", "restore_time", "synthetic_problem", "violations",
]  # fmt: skip

DEFAULT_TIME_LIMIT_S = 10.0
INSTALL_HINT = "pip install 'streamlet[test]'"  # or [bench]: the extras that bring scipy
SEARCH_PASSES = 2  # measured on the benchmark's instances: a 3rd changed no plan (the search's budget is spent)
ORDERS: tuple[Callable[[Task], tuple[float, ...]], ...] = (  # the greedy's task orders, see greedy_placement
    # the seed's: the tightest latency requirement first; then the largest, as a task placed late may find no
    # server with room; then the costliest to move, as a task placed late may have to restore over a link
    lambda task: (task.deadline_s, -task.cpu, -task.transfer_bytes),
    lambda task: (-task.cpu, task.deadline_s, -task.transfer_bytes),  # the largest first
)


def greedy_placement(problem: Problem, replicas: int = 1, *, seed_only: bool = False) -> Plan:
    """The seed's greedy controller, improved. Tasks in order of latency requirement (the seed's) each take
    their best option with what is left (:func:`best_option`); then a local search (``_backup_search.Search``)
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

    runs = [Search(problem, *_greedy(problem, order, replicas), replicas) for order in ORDERS[: 1 + (not seed_only)]]
    for search in runs:
        search.run(0 if seed_only else SEARCH_PASSES)
    search = min(runs, key=lambda search: search.score())  # the first on a tie: the seed's
    chosen = {i: option[1] for i, option in search.chosen.items()}
    return _plan(problem, search.state, chosen, replicas, False, "greedy")


def random_placement(problem: Problem, replicas: int, rng: random.Random) -> Plan:
    """Backups and redeploy servers drawn at random (no capacity, bandwidth or restore time considered):
    each task's ``replicas`` backups among the servers other than its host, its redeploy server among them
    too. What a cluster without a controller does, kept to measure the controller against for real.

    >>> servers = (Server("a", 4), Server("b", 4), Server("c", 4))
    >>> task = Task("count", host="a", cpu=1, backup_bytes=1e6, transfer_bytes=1e9)
    >>> link = {("a", "b"): 1e9, ("a", "c"): 1e9, ("b", "c"): 1e9}
    >>> placement = random_placement(Problem(servers, (task,), link), 1, random.Random(3)).placements[0]
    >>> "a" not in (*placement.backups, placement.redeploy)
    True
    """
    _check_replicas(problem, replicas)
    names = [server.name for server in problem.servers]
    placements = []
    for task in problem.tasks:
        others = [name for name in names if name != task.host]
        placements.append(_placement(problem, task, rng.sample(others, replicas), rng.choice(others)))
    total = objective(problem, placements)
    reason = f"random: {len(placements)} tasks placed at random, restore time {total:.3f} s in all"
    return Plan(tuple(placements), (), total, False, reason)


def _greedy(
    problem: Problem, order: Callable[[Task], tuple[float, ...]], replicas: int
) -> tuple[State, dict[int, Option]]:
    """The seed's greedy: the tasks in ``order`` each take their best option with what is left."""
    state = initial_state(problem)
    chosen: dict[int, Option] = {}
    for i in sorted(range(len(problem.tasks)), key=lambda i: order(problem.tasks[i])):
        option = best_option(problem.tasks[i], i, state, replicas)
        if option is not None:
            reserve(state, problem.tasks[i], i, option[1])
            chosen[i] = option
    return state, chosen


def _plan(
    problem: Problem, state: State, chosen: dict[int, tuple[list[int], int]], replicas: int, optimal: bool, how: str
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


def _why(task: Task, i: int, state: State, replicas: int) -> str:
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
    state = initial_state(problem)
    solution = _backup_milp.solve(problem, state, replicas, time_limit_s)
    greedy = greedy_placement(problem, replicas)
    if solution.chosen is None:  # no plan found in time (one always exists: leave every task out)
        return _fallback(greedy, f"HiGHS found no plan ({solution.message})")
    for i, choice in solution.chosen.items():
        reserve(state, problem.tasks[i], i, choice)
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
