"""The MILP behind :func:`streamlet.adaptation.backup_placement.exact_placement`, solved by HiGHS through
``scipy.optimize.milp``. A module of its own, imported only by ``exact_placement``, so that a cluster master
running the greedy never loads scipy.

Variables (all in [0, 1]): binary ``x[i, s]``, task ``i`` has a backup on ``s``; binary ``z[i, d]``, it is
redeployed on ``d``; continuous ``u[i, s, d]``, it restores on ``d`` from ``s`` (cost: that restore time);
binary ``v[i]``, it is left out (cost: more than any total restore time). Rows: ``replicas`` backups and
one redeploy server per task, or neither (``v``); the restore reads from one holder of the redeploy
server's choosing (``sum_s u[i, s, d] = z[i, d]``, ``sum_d u[i, s, d] <= x[i, s]``: as one ``z`` is 1,
this is ``u <= x`` for it); CPU reserved on each server and backup traffic on each link within what is
left. Continuous ``u`` is enough: with ``x`` and ``z`` whole, the cheapest holder takes all of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from streamlet.adaptation.backup_model import EPS, RATE_EPS, Choice, Problem, State

MIP_REL_GAP = 1e-6  # 'proven optimal' means within a millionth (the benchmark prints its gap in percent)


@dataclass(frozen=True, slots=True)
class Solution:
    """What HiGHS found: ``chosen`` (task -> (backup servers, redeploy server); the others left out; ``None``
    when it found no plan in time), whether that is proven optimal, and its status message."""

    chosen: dict[int, Choice] | None
    proven: bool
    message: str


def solve(problem: Problem, state: State, replicas: int, time_limit_s: float) -> Solution:
    """Write the MILP down and solve it within ``time_limit_s``."""
    model = _Model()
    x, z, v = _build(problem, state, replicas, model)
    matrix = coo_array((model.values, (model.rows, model.columns)), shape=(len(model.lower), len(model.cost)))
    result = milp(
        np.array(model.cost),
        integrality=np.array(model.integer),
        bounds=Bounds(0, 1),
        constraints=LinearConstraint(matrix.tocsr(), np.array(model.lower), np.array(model.upper)),
        options={"time_limit": time_limit_s, "mip_rel_gap": MIP_REL_GAP},
    )
    proven = result.status == 0
    if proven:
        message = "optimal"
    elif result.status == 1 and result.mip_gap is not None:
        message = f"time limit reached, gap {result.mip_gap:.2%}"
    else:
        message = str(result.message)
    if result.x is None:
        return Solution(None, False, message)
    values = result.x
    holders: dict[int, list[int]] = {}
    for (i, s), column in x.items():
        if values[column] > 0.5:
            holders.setdefault(i, []).append(s)
    redeploy = {i: d for (i, d), column in z.items() if values[column] > 0.5}
    chosen = {i: (holders[i], redeploy[i]) for i in range(len(problem.tasks)) if values[v[i]] < 0.5}
    return Solution(chosen, proven, message)


@dataclass(slots=True)
class _Model:
    """A MILP being written down: objective, integrality, and the constraint matrix row by row."""

    cost: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    columns: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)

    def variable(self, cost: float, integer: bool) -> int:
        self.cost.append(cost)
        self.integer.append(int(integer))
        return len(self.cost) - 1

    def row(self, terms: list[tuple[int, float]], lower: float, upper: float) -> None:
        row = len(self.lower)
        for column, value in terms:
            self.rows.append(row)
            self.columns.append(column)
            self.values.append(value)
        self.lower.append(lower)
        self.upper.append(upper)


def _build(
    problem: Problem, state: State, replicas: int, model: _Model
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int], list[int]]:
    """Write the MILP of :func:`exact_placement` into ``model``; its x, z and v columns. Pairs no plan can
    use (no link, no room even alone, past the deadline) get no variable at all."""
    x, z, u = _columns(problem, state, model)
    slowest: dict[int, float] = {}
    for (i, _, _), column in u.items():
        slowest[i] = max(slowest.get(i, 0.0), model.cost[column])
    penalty = 1.0 + math.fsum(slowest.values())  # one more task placed beats any saving in restore time
    v = [model.variable(penalty, True) for _ in problem.tasks]
    by_task: dict[int, tuple[list[int], list[int]]] = {i: ([], []) for i in range(len(problem.tasks))}
    for (i, _), column in x.items():
        by_task[i][0].append(column)
    for (i, _), column in z.items():
        by_task[i][1].append(column)
    for i, (holders, redeploys) in by_task.items():
        model.row([(c, 1.0) for c in holders] + [(v[i], replicas)], replicas, replicas)  # K backups, or left out
        model.row([(c, 1.0) for c in redeploys] + [(v[i], 1.0)], 1.0, 1.0)  # one redeploy server, or left out
    into: dict[tuple[int, int], list[int]] = {}
    out_of: dict[tuple[int, int], list[int]] = {}
    for (i, s, d), column in u.items():
        into.setdefault((i, d), []).append(column)
        out_of.setdefault((i, s), []).append(column)
    for key, column in z.items():  # restored on d from exactly one holder, if redeployed on d
        model.row([(c, 1.0) for c in into.get(key, [])] + [(column, -1.0)], 0.0, 0.0)
    for key, column in x.items():  # ... which holds a backup (z picks one d, so this sums one d's u)
        model.row([(c, 1.0) for c in out_of.get(key, [])] + [(column, -1.0)], -math.inf, 0.0)
    _capacities(problem, state, x, z, model)
    return x, z, v


def _columns(
    problem: Problem, state: State, model: _Model
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int], dict[tuple[int, int, int], int]]:
    """The x, z and u variables (u keyed by (task, holder, redeploy server))."""
    x: dict[tuple[int, int], int] = {}
    z: dict[tuple[int, int], int] = {}
    u: dict[tuple[int, int, int], int] = {}
    servers = range(len(state.names))
    for i, task in enumerate(problem.tasks):
        host, rate = state.host[i], state.rate[i]
        holders = [
            s for s in servers if s != host and state.bandwidth[host][s] > 0 and state.room[host][s] + RATE_EPS >= rate
        ]
        redeploys = [d for d in servers if d != host and state.free[d] + EPS >= task.cpu]
        for s in holders:
            x[i, s] = model.variable(0.0, True)
        for d in redeploys:
            z[i, d] = model.variable(0.0, True)
            for s in holders:
                link = state.bandwidth[s][d]
                seconds = 0.0 if s == d else (task.transfer_bytes / link if link > 0 else math.inf)
                if seconds <= task.deadline_s and seconds < math.inf:  # no link: no restore that way
                    u[i, s, d] = model.variable(seconds, False)
    return x, z, u


def _capacities(
    problem: Problem, state: State, x: dict[tuple[int, int], int], z: dict[tuple[int, int], int], model: _Model
) -> None:
    """CPU rows (reserved on each redeploy server) and backup bandwidth rows (each host's link to a holder),
    as shares of the capacity: bytes/s next to core counts would span 9 orders of magnitude, which HiGHS's
    LPs do not survive."""
    rows: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
    for (i, d), column in z.items():
        rows.setdefault(("cpu", d, d), []).append((column, problem.tasks[i].cpu))
    for (i, s), column in x.items():
        rows.setdefault(("link", state.host[i], s), []).append((column, state.rate[i]))
    for (kind, a, b), terms in rows.items():
        capacity = state.free[b] if kind == "cpu" else state.room[a][b]
        if math.fsum(value for _, value in terms) > capacity + EPS:  # rows that cannot bind are left out
            model.row([(column, value / max(capacity, EPS)) for column, value in terms], -math.inf, 1.0)
