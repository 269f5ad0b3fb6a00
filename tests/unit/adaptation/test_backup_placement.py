"""The backup location controller (seed 001) as pure functions: a problem in, a plan out, by the greedy and by
the exact MILP (HiGHS), checked on hand-made instances with a known optimum, on random ones for feasibility
and for the greedy's gap, and on bad input."""

from __future__ import annotations

import math
import random
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamlet.adaptation
from streamlet.adaptation.backup_placement import (
    Placement,
    Plan,
    Problem,
    Server,
    Task,
    Unplaced,
    exact_placement,
    greedy_placement,
    objective,
    random_placement,
    restore_time,
    synthetic_problem,
    violations,
)

GB = 1e9
NO_BACKUP_ROOM = 1e3  # a link too slow to carry any of these tasks' backups (half of 1 kB/s)


def knapsack_problem() -> Problem:
    """Host 'a' runs two tasks; only 'b' can hold their backups (a -> c is too slow), and 'b' and 'c' have
    one core each. The costlier task to move ('big', 4 GB) should restore on 'b' from its own backup, and the
    cheaper ('small', 1 GB, latency-critical) restore on 'c' from 'b' over 1 GB/s: 1 s in all."""
    servers = (Server("a", 8, 8), Server("b", 4, 3), Server("c", 4, 3))
    tasks = (
        Task("small", "a", cpu=1, backup_bytes=1e8, transfer_bytes=1 * GB, deadline_s=2.0),
        Task("big", "a", cpu=1, backup_bytes=1e8, transfer_bytes=4 * GB),
    )
    return Problem(servers, tasks, {("a", "b"): 1e9, ("a", "c"): NO_BACKUP_ROOM, ("b", "c"): 1e9})


def key(plan: Plan) -> tuple[int, float]:
    """How plans compare: the fewest tasks left out, then the least total restore time."""
    return len(plan.unplaced), plan.restore_s


def test_a_task_restores_where_its_backup_is() -> None:
    """The backup goes to the one server that can also take the task back: no transfer at all."""
    servers = (Server("a", 4, 4), Server("b", 4, 0), Server("c", 4, 3.5))
    problem = Problem(servers, (Task("count", "a", 1, 1e6, 1e9),), {("a", "b"): 1e9, ("a", "c"): 1e9})
    expected = Placement("count", ("b",), "b", "b", 0.0)
    for plan in (greedy_placement(problem), exact_placement(problem)):
        assert plan.placements == (expected,)
        assert (plan.unplaced, plan.restore_s) == ((), 0.0)
    assert exact_placement(problem).optimal
    assert not greedy_placement(problem).optimal


def test_both_solvers_find_the_known_optimum() -> None:
    """The costlier task keeps its backup where it restarts; the cheaper one restores over the fast link."""
    problem = knapsack_problem()
    expected = (Placement("small", ("b",), "c", "b", 1.0), Placement("big", ("b",), "b", "b", 0.0))
    exact = exact_placement(problem)
    assert (exact.placements, exact.restore_s, exact.optimal) == (expected, 1.0, True)
    assert exact.reason == "exact (proven optimal): 2 of 2 tasks placed, restore time 1.000 s in all"
    greedy = greedy_placement(problem)
    assert (greedy.placements, greedy.restore_s) == (expected, 1.0)
    assert greedy.reason == "greedy: 2 of 2 tasks placed, restore time 1.000 s in all"


def test_the_seed_order_alone_misses_it_and_the_search_repairs_it() -> None:
    """Latency-critical first, the seed's greedy gives 'b' to 'small' and 'big' restores over the link."""
    plain = greedy_placement(knapsack_problem(), seed_only=True)
    assert plain.by_task()["big"] == Placement("big", ("b",), "c", "b", 4.0)
    assert plain.restore_s == 4.0


def test_objective_recomputes_the_total_restore_time() -> None:
    """The objective both solvers minimise is the sum of restore_time over the placements."""
    problem = knapsack_problem()
    small, big = problem.tasks
    assert restore_time(problem, small, ["b"], "c") == 1.0
    assert restore_time(problem, big, ["b"], "c") == 4.0
    assert restore_time(problem, big, ["c", "b"], "c") == 0.0
    assert objective(problem, greedy_placement(problem, seed_only=True).placements) == 4.0


def test_two_replicas_go_to_two_servers_other_than_the_host() -> None:
    """With replicas=2 each task has two distinct backup servers, one of them where it is redeployed."""
    servers = tuple(Server(name, 4, 2) for name in "abcd")
    links = {(x, y): 1e9 for x in "abcd" for y in "abcd" if x < y}
    problem = Problem(servers, (Task("t", "a", 1, 1e6, 1e9), Task("u", "b", 1, 1e6, 1e9)), links)
    for plan in (greedy_placement(problem, replicas=2), exact_placement(problem, replicas=2)):
        assert plan.restore_s == 0.0
        assert violations(problem, plan, replicas=2) == []
        for placement, host in zip(plan.placements, "ab", strict=True):
            assert len(set(placement.backups)) == 2
            assert host not in placement.backups
            assert placement.redeploy in placement.backups


def test_a_task_too_big_for_any_server_is_left_out_with_the_reason() -> None:
    """No server but the host has 4 cores free: the plan places the other task and says why not this one."""
    servers = (Server("a", 8, 0), Server("b", 4, 2))
    tasks = (Task("big", "a", 4, 1e6, 1e9), Task("small", "a", 1, 1e6, 1e9))
    problem = Problem(servers, tasks, {("a", "b"): 1e9})
    reason = "task 'big' needs 4 CPU and no server but its host 'a' has that much free (the most: 1)"
    for plan in (greedy_placement(problem), exact_placement(problem)):
        assert plan.placements == (Placement("small", ("b",), "b", "b", 0.0),)
        assert plan.unplaced == (Unplaced("big", reason),)
        assert plan.reason.endswith("1 of 2 tasks placed, restore time 0.000 s in all; left out: 'big'")


def test_a_task_whose_backups_fit_no_link_is_left_out_with_the_reason() -> None:
    """8 MB/s of backups, and the only link leaves 0.5 MB/s for backups."""
    problem = Problem((Server("a", 4), Server("b", 4)), (Task("t", "a", 1, 8e7, 1e9),), {("a", "b"): 1e6})
    reason = (
        "task 't' sends 8 MB/s of backups and 0 link(s) from its host 'a' have that much backup bandwidth left "
        "(1 needed)"
    )
    for plan in (greedy_placement(problem), exact_placement(problem)):
        assert (plan.placements, plan.unplaced) == ((), (Unplaced("t", reason),))


def test_a_restore_that_would_miss_its_deadline_is_left_out_with_the_reason() -> None:
    """The backup can only live on 'b', the CPU only on 'c', and 1 GB over 1 GB/s misses a 0.5 s deadline."""
    servers = (Server("a", 4, 4), Server("b", 4, 4), Server("c", 4, 0))
    links = {("a", "b"): 1e9, ("a", "c"): NO_BACKUP_ROOM, ("b", "c"): 1e9}
    problem = Problem(servers, (Task("t", "a", 1, 1e6, 1e9, deadline_s=0.5),), links)
    reason = (
        "task 't': no server with 1 CPU free can get its 1 GB from a server with backup bandwidth left within "
        "its 0.5 s deadline"
    )
    for plan in (greedy_placement(problem), exact_placement(problem)):
        assert (plan.placements, plan.unplaced) == ((), (Unplaced("t", reason),))
    relaxed = Problem(servers, (Task("t", "a", 1, 1e6, 1e9, deadline_s=1.0),), links)
    assert exact_placement(relaxed).placements == (Placement("t", ("b",), "c", "b", 1.0),)


def test_the_exact_solver_places_as_many_tasks_as_fit() -> None:
    """Three one-core tasks and two free cores: two are placed (both without transfer), one is left out."""
    servers = (Server("a", 8), Server("b", 2, 1), Server("c", 2, 1))
    links = {("a", "b"): 1e9, ("a", "c"): 1e9, ("b", "c"): 1e9}
    tasks = tuple(Task(f"t{size}", "a", 1, 1e6, size * GB) for size in (1, 2, 3))
    plan = exact_placement(Problem(servers, tasks, links))
    assert (len(plan.placements), plan.restore_s, plan.optimal) == (2, 0.0, True)
    assert sorted(p.redeploy for p in plan.placements) == ["b", "c"]
    (left,) = plan.unplaced
    assert (
        left.reason == f"task '{left.task}' needs 1 CPU and no server but its host 'a' has that much free (the most: 0)"
    )


def test_a_time_limit_too_short_to_prove_gives_a_feasible_unproven_plan() -> None:
    """1 ms is too short for 120 tasks on 30 servers: the answer is feasible and not claimed optimal."""
    problem = synthetic_problem(120, 30, seed=3)
    plan = exact_placement(problem, time_limit_s=0.001)
    assert not plan.optimal
    assert violations(problem, plan) == []
    assert key(plan) <= key(greedy_placement(problem))  # never worse than the greedy it falls back to


def test_the_greedy_is_deterministic() -> None:
    """The same problem always gives the same plan."""
    assert greedy_placement(synthetic_problem(60, 30, 1)) == greedy_placement(synthetic_problem(60, 30, 1))


def test_the_greedy_gap_on_small_random_instances() -> None:
    """On 20 seeded 12-task x 9-server instances the greedy places as many tasks as the optimum and restores
    within 1 % of it in all (measured 0.64 %); the seed's greedy alone, without the local search, leaves one
    more task out once and is within 10 % where it does not (measured 9.7 %). The bounds sit just above the
    measured figures (everything here is deterministic) to catch a regression of either part."""
    exact, greedy, plain = [], [], []
    for seed in range(20):
        problem = synthetic_problem(12, 9, seed)
        exact.append(exact_placement(problem))
        greedy.append(greedy_placement(problem))
        plain.append(greedy_placement(problem, seed_only=True))
    assert all(plan.optimal for plan in exact)
    assert [len(plan.unplaced) for plan in greedy] == [len(plan.unplaced) for plan in exact]
    assert all(e.restore_s <= g.restore_s * (1 + 1e-6) + 1e-9 for e, g in zip(exact, greedy, strict=True))
    assert gap(greedy, exact) <= 0.01
    assert sum(len(p.unplaced) > len(e.unplaced) for p, e in zip(plain, exact, strict=True)) == 1
    assert gap(plain, exact) <= 0.10


def gap(plans: list[Plan], optima: list[Plan]) -> float:
    """Total restore time over the optimum's, less 1, where as many tasks were placed as in the optimum."""
    same = [(plan, best) for plan, best in zip(plans, optima, strict=True) if len(plan.unplaced) == len(best.unplaced)]
    return math.fsum(plan.restore_s for plan, _ in same) / math.fsum(best.restore_s for _, best in same) - 1


@st.composite
def problems(draw: st.DrawFn) -> tuple[Problem, int]:
    """2-6 servers with 0-4 cores free, links of 1-100 MB/s or none, 1-7 tasks, 1 or 2 replicas."""
    count = draw(st.integers(2, 6))
    names = [f"s{k}" for k in range(count)]
    servers = tuple(Server(name, 8, 8 - draw(st.sampled_from([0, 0.5, 1, 2, 4]))) for name in names)
    links = {
        (a, b): rate
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if (rate := draw(st.sampled_from([0.0, 1e6, 1e7, 1e8]))) > 0
    }
    tasks = tuple(
        Task(
            f"t{i}",
            draw(st.sampled_from(names)),
            draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
            draw(st.sampled_from([0.0, 1e6, 1e7, 1e8])),
            draw(st.sampled_from([0.0, 1e7, 1e8, 1e9])),
            draw(st.sampled_from([math.inf, 1.0, 10.0])),
        )
        for i in range(draw(st.integers(1, 7)))
    )
    return Problem(servers, tasks, links), draw(st.sampled_from([1, 2] if count >= 3 else [1]))


@given(problems())
@settings(max_examples=60, deadline=None)
def test_every_plan_keeps_the_constraints(case: tuple[Problem, int]) -> None:
    """Both solvers' plans respect CPU, backup bandwidth, deadlines and the host rule, and account for every
    task once; the local search never makes the seed's greedy worse; the proven optimum is never worse."""
    problem, replicas = case
    plain = greedy_placement(problem, replicas, seed_only=True)
    greedy = greedy_placement(problem, replicas)
    exact = exact_placement(problem, replicas)
    for plan in (plain, greedy, exact):
        assert violations(problem, plan, replicas) == []
        placed = [p.task for p in plan.placements] + [u.task for u in plan.unplaced]
        assert sorted(placed) == sorted(task.name for task in problem.tasks)
        assert plan.restore_s == objective(problem, plan.placements)
        tasks = {task.name: task for task in problem.tasks}
        for p in plan.placements:
            assert tasks[p.task].host not in (*p.backups, p.redeploy)
            assert p.source in p.backups
            assert p.restore_s == restore_time(problem, tasks[p.task], p.backups, p.redeploy)
    assert exact.optimal
    assert key(greedy) <= (len(plain.unplaced), plain.restore_s * (1 + 1e-9))
    assert len(exact.unplaced) <= len(greedy.unplaced)
    if len(exact.unplaced) == len(greedy.unplaced):
        assert exact.restore_s <= greedy.restore_s * (1 + 1e-6) + 1e-9


def test_violations_names_what_a_plan_breaks() -> None:
    """A hand-written plan that overbooks a server, backs up on its host and misses a deadline."""
    problem = knapsack_problem()
    bad = Plan(
        (Placement("small", ("a",), "c", "a", 8.0), Placement("big", ("b",), "c", "b", 4.0)), (), 12.0, False, ""
    )
    assert violations(problem, bad) == [
        "task 'small': backups ('a',) and redeploy 'c' (host 'a')",
        "task 'small' restores past its 2 s deadline",
        "server 'c': load 3 + 2 > 4 CPU",
        "link a -> a: backups 10 MB/s, room for 0 MB/s",
    ]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Server("a", -1), "server 'a': cpu must be a finite number >= 0, not -1"),
        (lambda: Server("a", 4, math.nan), "server 'a': load must be a finite number >= 0, not nan"),
        (lambda: Task("t", "a", 1, -5, 1), "task 't': backup_bytes must be a finite number >= 0, not -5"),
        (lambda: Task("t", "a", 1, 5, math.inf), "task 't': transfer_bytes must be a finite number >= 0, not inf"),
        (lambda: Task("t", "a", 1, 5, 1, deadline_s=0), "task 't': deadline_s must be > 0, not 0"),
        (
            lambda: Problem((Server("a", 1),), (Task("t", "x", 1, 1, 1),), {}),
            "task 't' runs on 'x', which is not a server",
        ),
        (lambda: Problem((Server("a", 1), Server("a", 2)), (), {}), "two servers are named 'a'"),
        (
            lambda: Problem((Server("a", 1),), (), {("a", "z"): 1e9}),
            "bandwidth ('a', 'z') names 'z', which is not a server",
        ),
        (lambda: Problem((Server("a", 1),), (), {("a", "a"): 1e9}), "bandwidth ('a', 'a') links a server to itself"),
        (
            lambda: Problem((Server("a", 1), Server("b", 1)), (), {("a", "b"): 0}),
            "bandwidth ('a', 'b') must be a finite number of bytes/s > 0, not 0",
        ),
        (
            lambda: Problem((Server("a", 1), Server("b", 1)), (), {("a", "b"): 1e9, ("b", "a"): 1e8}),
            "bandwidth ('a', 'b') is 1000000000.0 one way and 100000000.0 the other",
        ),
        (lambda: Problem((), (), {}, checkpoint_interval_s=0), "checkpoint_interval_s must be > 0, not 0"),
        (lambda: Problem((), (), {}, backup_share=1.5), "backup_share must be in (0, 1], not 1.5"),
    ],
)
def test_invalid_input_is_refused(build: Callable[[], object], message: str) -> None:
    """Bad sizes, unknown servers and inconsistent links raise ValueError naming what was written."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build()


def test_more_replicas_than_other_servers_are_refused() -> None:
    """Three servers leave two for a task's backups; three replicas cannot be placed anywhere."""
    problem = Problem(tuple(Server(name, 4) for name in "abc"), (), {})
    message = r"^replicas=3: a task's backups need 3 servers other than its host, and there are only 2$"
    with pytest.raises(ValueError, match=message):
        greedy_placement(problem, replicas=3)
    with pytest.raises(ValueError, match=message):
        exact_placement(problem, replicas=3)
    with pytest.raises(ValueError, match=r"^replicas must be >= 1, not 0$"):
        greedy_placement(problem, replicas=0)
    with pytest.raises(ValueError, match=r"^time_limit_s must be > 0, not 0$"):
        exact_placement(problem, time_limit_s=0)


def test_the_module_imports_and_the_greedy_runs_without_scipy() -> None:
    """A cluster master without scipy (nor numpy) imports the module and plans; only the exact solver asks
    for the extra."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["scipy"] = sys.modules["numpy"] = None  # as if not installed
        from streamlet.adaptation.backup_placement import exact_placement, greedy_placement, synthetic_problem
        problem = synthetic_problem(30, 10, 0)
        print(len(greedy_placement(problem).placements))
        try:
            exact_placement(problem)
        except ImportError as exc:
            print(exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    placed = len(greedy_placement(synthetic_problem(30, 10, 0)).placements)
    assert done.stdout.splitlines() == [str(placed), "exact_placement needs scipy: pip install 'streamlet[test]'"]


def test_the_exact_solver_is_imported_only_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without scipy the exact solver raises ImportError naming the extra (in this process too)."""
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    monkeypatch.delitem(sys.modules, "streamlet.adaptation._backup_milp", raising=False)
    monkeypatch.delattr(streamlet.adaptation, "_backup_milp", raising=False)
    with pytest.raises(ImportError, match=r"^exact_placement needs scipy: pip install 'streamlet\[test\]'$"):
        exact_placement(knapsack_problem())


def test_a_random_plan_keeps_backups_and_redeploys_off_the_host_and_restores_over_a_link_when_apart() -> None:
    """Random placement (the comparison for the controller): every task's backups and redeploy server are
    other servers than its host; a task redeployed away from its backup restores over the link (its time
    is the transfer), one redeployed onto it restores in no time. The same seed gives the same plan."""
    problem = synthetic_problem(tasks=40, servers=5, seed=11)
    plan = random_placement(problem, 2, random.Random(5))
    hosts = {task.name: task.host for task in problem.tasks}
    by_task = {task.name: task for task in problem.tasks}
    assert [p.task for p in plan.placements] == [task.name for task in problem.tasks]
    for placement in plan.placements:
        assert len(set(placement.backups)) == 2
        assert hosts[placement.task] not in (*placement.backups, placement.redeploy)
        task = by_task[placement.task]
        apart = placement.redeploy not in placement.backups
        assert placement.restore_s == restore_time(problem, task, list(placement.backups), placement.redeploy)
        assert (placement.restore_s > 0) == (apart and task.transfer_bytes > 0)
    assert math.isclose(plan.restore_s, objective(problem, list(plan.placements)))
    assert random_placement(problem, 2, random.Random(5)) == plan
    assert random_placement(problem, 2, random.Random(6)) != plan
