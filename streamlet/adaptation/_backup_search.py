"""The local search of :func:`streamlet.adaptation.backup_placement.greedy_placement`: a module of its own
so the controller's module stays readable. It works on the greedy's indexed state (``State``) and options.

The neighbourhood. Each task that restores over a link (or was left out) first takes the best option free
now; else it is given a server where it would restore for nothing (its backup there too) by an ejection
chain: the tasks redeployed there that are in the way move to their best other options, each of them in
turn making room the same way one level down (:data:`CHAIN_DEPTH`), and other tasks that restore over a
link fill whatever room is left on that server. The whole move is kept only if the total restore time
drops (or one more task is placed), else undone from a log of the changes. Why chains and the filling:
on the benchmark's worst instances the optimum moves one large task off a server to let two or three small
costly ones restore there, or moves a task that is in the way onto room that a third task makes.
"""

from __future__ import annotations

import math

from streamlet.adaptation.backup_model import EPS, RATE_EPS, Option, Problem, State, best_option, option_at, reserve

# measured on the benchmark's instances (mean gap to the optimum; 120 x 30 median time of the greedy):
CHAIN_DEPTH = 1  # how far down a task moved out of the way may move others: 0, 12 %; 1, 2.8 %; 2, 3.8 %
LEFT_OUT = 1e18  # the cost of a task left out: above any total restore time, so placing one more comes first
EFFORT = 60  # at most this many ejection moves tried for one task (a move: _move_for, at any depth) ...
BUDGET = 120  # ... and in one whole search: 2.8 %, 6.7 ms; 170: 1.5 %, 7.5-13 ms; no bound: 1.3 %, 24 ms
GAIN = 1e-9  # a move must lower the total by more than this (relative), so float noise never loops


class Search:
    """The greedy's plan ``chosen`` (task -> option) and ``state`` (what it reserves), improved in place."""

    def __init__(self, problem: Problem, state: State, chosen: dict[int, Option], replicas: int) -> None:
        self.problem, self.state, self.chosen, self.replicas = problem, state, chosen, replicas
        self.on: list[set[int]] = [set() for _ in state.names]  # redeploy server -> the tasks redeployed there
        for i, (_, (_, d)) in chosen.items():
            self.on[d].add(i)
        self.costly = {i for i, (seconds, _) in chosen.items() if seconds > 0}  # placed, restoring over a link
        self.log: list[tuple[int, Option | None]] = []  # (task, its option before a change): undone backwards
        self.effort = EFFORT  # moves left to try for the task at hand: a count, not a clock, so the plan is
        self.budget = BUDGET  # the same on any machine; and in all

    def run(self, passes: int) -> None:
        """Up to ``passes`` passes (fewer if one changes nothing) over the tasks that restore over a link or
        are left out, costliest first. A move may push another task onto a link; the next pass revisits it."""
        for _ in range(passes):
            costly = [i for i in range(len(self.problem.tasks)) if self.cost(i) > 0]
            changed = [self.better(i) for i in sorted(costly, key=lambda i: (-self.cost(i), i))]
            self.log.clear()  # nothing is undone across tasks: the log only serves the move being tried
            if not any(changed):
                return

    def score(self) -> tuple[int, float]:
        """How good the plan is now: the tasks left out, then the total restore time."""
        return len(self.problem.tasks) - len(self.chosen), math.fsum(option[0] for option in self.chosen.values())

    def cost(self, i: int) -> float:
        """Task ``i``'s restore time now (:data:`LEFT_OUT` if it is left out)."""
        option = self.chosen.get(i)
        return LEFT_OUT if option is None else option[0]

    def better(self, i: int) -> bool:
        """Give task ``i`` a better option if there is one; whether it got one."""
        mark, before = len(self.log), self.cost(i)
        if before <= 0:  # an earlier move this pass already made it free
            return False
        self.effort = EFFORT
        self.assign(i, None)
        plain = best_option(self.problem.tasks[i], i, self.state, self.replicas, before)
        limit = before if plain is None else min(before, plain[0])
        if (plain is None or plain[0] > 0) and self.make_room(i, limit, CHAIN_DEPTH):
            return True
        if plain is not None and plain[0] < before * (1 - GAIN):
            self.assign(i, plain)
            return True
        self.undo(mark)
        return False

    def assign(self, i: int, option: Option | None) -> None:
        """Give task ``i`` ``option`` (``None``: leave it out), logged so that :meth:`undo` can take it back."""
        self.log.append((i, self.chosen.get(i)))
        self._set(i, option)

    def undo(self, mark: int) -> None:
        """Take back every change logged since ``mark``, the latest first."""
        while len(self.log) > mark:
            self._set(*self.log.pop())

    def _set(self, i: int, option: Option | None) -> None:
        task, old = self.problem.tasks[i], self.chosen.pop(i, None)
        if old is not None:
            reserve(self.state, task, i, old[1], -1.0)
            self.on[old[1][1]].discard(i)
        self.costly.discard(i)
        if option is not None:
            if option[0] > 0:
                self.costly.add(i)
            reserve(self.state, task, i, option[1])
            self.chosen[i] = option
            self.on[option[1][1]].add(i)

    def make_room(self, i: int, limit: float, depth: int) -> bool:
        """Place task ``i`` (left out for now) on a server where it restores for nothing, moving the tasks in
        the way (see the module docstring), if the total then drops below what it is with ``i`` at
        ``limit``; whether it did (applied, logged). Servers needing the least room made first."""
        state, tasks, task, host = self.state, self.problem.tasks, self.problem.tasks[i], self.state.host[i]
        free, room, rate = state.free, state.room[host], state.rate[i]
        servers = [
            d
            for d, there in enumerate(self.on)
            if there
            and d != host
            and free[d] + EPS < task.cpu <= free[d] + math.fsum(tasks[j].cpu for j in there) + EPS
            and room[d] + RATE_EPS >= rate
        ]
        for d in sorted(servers, key=lambda d: (task.cpu - free[d], d)):
            deficit = task.cpu - free[d]
            there = sorted(self.on[d], key=lambda j: (tasks[j].cpu, tasks[j].transfer_bytes, j))
            tries = [[j] for j in there if tasks[j].cpu + EPS >= deficit]
            tries.append(sorted(there, key=lambda j: (tasks[j].transfer_bytes, j)))
            for moved in tries:
                if self.effort <= 0 or self.budget <= 0:
                    return False
                if self._move_for(i, d, limit, moved, depth):
                    return True
        return False

    def _move_for(self, i: int, d: int, limit: float, candidates: list[int], depth: int) -> bool:
        """Move ``candidates`` (as many as it takes) off ``d`` for task ``i``, fill what room is left there,
        and move the ones taken off elsewhere; kept if the total drops (see :meth:`make_room`), else undone.
        Each one moved may cost no more than what the move has gained so far: a chain that can no longer
        pay for itself is cut there, which keeps the search to milliseconds."""
        tasks, state, mark = self.problem.tasks, self.state, len(self.log)
        self.effort -= 1
        self.budget -= 1
        moved = []
        for j in candidates:
            if state.free[d] + EPS >= tasks[i].cpu:
                break
            self.assign(j, None)
            moved.append(j)
        mine = option_at(tasks[i], i, state, d, self.replicas)
        if mine is None or mine[0] >= limit:
            self.undo(mark)
            return False
        self.assign(i, mine)
        self._fill(d, i, moved)
        was = {k: old for k, old in reversed(self.log[mark:])}  # the first logged option of each: before the move
        for n, j in enumerate(moved):
            before = was[j]
            allowance = (LEFT_OUT if before is None else before[0]) - self._change(mark, i, limit, moved[n:])
            if not self._place(j, allowance, depth):
                self.undo(mark)
                return False
        if self._change(mark, i, limit) < -GAIN * max(1.0, limit):
            return True
        self.undo(mark)
        return False

    def _fill(self, d: int, i: int, moved: list[int]) -> None:
        """Move onto ``d`` (where ``i`` just went) the tasks that restore over a link, costliest first, that
        then restore for nothing: room made for one task often fits two or three small ones."""
        state, tasks = self.state, self.problem.tasks
        if state.free[d] <= EPS:
            return
        for k in sorted(self.costly - {i, *moved}, key=lambda k: (-self.chosen[k][0], k)):
            host, old = state.host[k], self.chosen[k]
            spare = state.room[host][d] + (state.rate[k] if d in old[1][0] else 0.0)  # its own backup may be on d
            if host == d or state.free[d] + EPS < tasks[k].cpu or spare + RATE_EPS < state.rate[k]:
                continue
            reserve(state, tasks[k], k, old[1], -1.0)  # so that option_at sees that room
            option = option_at(tasks[k], k, state, d, self.replicas)
            reserve(state, tasks[k], k, old[1])
            if option is not None and option[0] < old[0]:
                self.assign(k, option)
            if state.free[d] <= EPS:
                return

    def _place(self, j: int, allowance: float, depth: int) -> bool:
        """Put task ``j``, moved out of the way, at its best option, or make room for a better one if
        ``depth`` allows, if it then costs less than ``allowance``; whether it did."""
        if allowance <= 0:  # nothing left to pay for it
            return False
        plain = best_option(self.problem.tasks[j], j, self.state, self.replicas, allowance)
        bound = allowance if plain is None else min(plain[0], allowance)
        if (plain is None or plain[0] > 0) and depth > 0 and self.make_room(j, bound, depth - 1):
            return True
        if plain is None or plain[0] >= allowance:
            return False
        self.assign(j, plain)
        return True

    def _change(self, mark: int, i: int, limit: float, pending: list[int] | None = None) -> float:
        """How much the changes since ``mark`` moved the total, counting task ``i`` as having been at ``limit``
        and leaving out the ``pending`` tasks (moved out of the way, not yet placed again)."""
        first: dict[int, float] = {}
        for k, old in self.log[mark:]:
            if k not in first:
                first[k] = LEFT_OUT if old is None else old[0]
        first[i] = limit
        for k in pending or ():
            del first[k]
        return math.fsum(self.cost(k) - was for k, was in first.items())
