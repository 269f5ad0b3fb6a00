"""Backup placement (seed 001): the greedy controller against the exact MILP (HiGHS), on the seed's sizes.

Random instances from ``synthetic_problem`` (an edge cluster of 3 sites, spare CPU 1.2 times the tasks'
need, unevenly spread; see its docstring), ``INSTANCES`` seeds for each of the seed's sizes: 30 servers with
30, 60, 90 and 120 tasks, 30 tasks with 30, 45 and 60 servers. Each instance is solved by
``greedy_placement`` (timed ``repeats`` times), by the seed's greedy alone (``seed_only=True``) and once by
``exact_placement`` (``TIME_LIMIT_S``). Reported:

- ``greedy_ms_120x30``: median time of the greedy over the 120 x 30 instances and repeats, and
  ``greedy_ms_120x30_max`` of the slowest instance (its median over the repeats); ``greedy_ms`` and
  ``exact_ms``: the median by size (``"120x30"``: tasks x servers);
- ``instances_solved_exactly``: how many the MILP proved optimal within the limit (of ``instances``);
- ``mean_gap``: greedy restore time / optimum - 1, averaged over the instances proven optimal where the
  greedy placed as many tasks as the optimum and the optimum is above 0 (a ratio to 0 has no meaning; the
  instances where it is 0 are counted in ``zero_optimum`` with how many the greedy matched); ``median_gap``;
  ``total_gap``, total greedy restore time over total optimum, less 1, over the same instances (not swayed
  by an optimum close to 0); ``greedy_left_out_more``: the proven instances where the greedy left out more
  tasks than the optimum; ``seed_greedy_*``: the same for the seed's greedy without the local search;
- ``records_per_s`` / ``baseline_records_per_s``: **tasks placed per second** on 120 x 30, greedy / exact
  (the keys every benchmark line has; ``unit`` says so, and ``tasks_placed_per_s`` repeats the figure).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from typing import Any

from benchmarks.common import report
from streamlet.adaptation.backup_placement import Plan, Problem, exact_placement, greedy_placement, synthetic_problem

SIZES = ((30, 30), (60, 30), (90, 30), (120, 30), (30, 45), (30, 60))  # (tasks, servers), the seed's
INSTANCES = 10  # seeds 0..9 of each size
TIME_LIMIT_S = 10.0


def main(repeats: int) -> dict[str, Any]:
    """Every size and seed: greedy (timed ``repeats`` times), the seed's greedy, the MILP."""
    greedy_s: dict[str, list[float]] = {}
    slowest = 0.0  # of the 120 x 30 instances, the greedy's median time on the slowest
    exact_s: dict[str, list[float]] = {}
    rows: list[tuple[Plan, Plan, Plan]] = []  # (exact, greedy, seed's greedy)
    for tasks, servers in SIZES:
        size = f"{tasks}x{servers}"
        for seed in range(INSTANCES):
            problem = synthetic_problem(tasks, servers, seed)
            seconds = _greedy_seconds(problem, repeats)
            greedy_s.setdefault(size, []).extend(seconds)
            if size == "120x30":
                slowest = max(slowest, statistics.median(seconds))
            began = time.perf_counter()
            exact = exact_placement(problem, time_limit_s=TIME_LIMIT_S)
            exact_s.setdefault(size, []).append(time.perf_counter() - began)
            rows.append((exact, greedy_placement(problem), greedy_placement(problem, seed_only=True)))
    greedy_120 = statistics.median(greedy_s["120x30"])
    exact_120 = statistics.median(exact_s["120x30"])
    proven = [row for row in rows if row[0].optimal]
    return report(
        "placement",
        120 / greedy_120,
        120 / exact_120,
        unit="tasks placed per second",
        tasks_placed_per_s=round(120 / greedy_120),
        greedy_ms_120x30=round(greedy_120 * 1000, 3),
        greedy_ms_120x30_max=round(slowest * 1000, 3),
        greedy_ms={size: round(statistics.median(times) * 1000, 3) for size, times in greedy_s.items()},
        exact_ms={size: round(statistics.median(times) * 1000, 1) for size, times in exact_s.items()},
        instances=len(rows),
        instances_solved_exactly=len(proven),
        **_gaps([(exact, greedy) for exact, greedy, _ in proven], ""),
        **_gaps([(exact, plain) for exact, _, plain in proven], "seed_greedy_"),
        time_limit_s=TIME_LIMIT_S,
    )


def _greedy_seconds(problem: Problem, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        gc.collect()
        began = time.perf_counter()
        greedy_placement(problem)
        seconds.append(time.perf_counter() - began)
    return seconds


def _gaps(pairs: list[tuple[Plan, Plan]], prefix: str) -> dict[str, Any]:
    """The gap figures of (proven optimum, heuristic plan) pairs, names prefixed with ``prefix``."""
    same = [(best, plan) for best, plan in pairs if len(plan.unplaced) == len(best.unplaced)]
    positive = [(best, plan) for best, plan in same if best.restore_s > 0]
    zero = [plan for best, plan in same if best.restore_s == 0]
    gaps = [plan.restore_s / best.restore_s - 1 for best, plan in positive]
    total = math.fsum(plan.restore_s for _, plan in positive) / math.fsum(best.restore_s for best, _ in positive)
    return {
        f"{prefix}mean_gap": round(statistics.mean(gaps), 4),
        f"{prefix}median_gap": round(statistics.median(gaps), 4),
        f"{prefix}max_gap": round(max(gaps), 4),
        f"{prefix}total_gap": round(total - 1, 4),
        f"{prefix}gap_instances": len(gaps),
        f"{prefix}zero_optimum": {"instances": len(zero), "matched": sum(plan.restore_s == 0 for plan in zero)},
        f"{prefix}greedy_left_out_more": len(pairs) - len(same),
    }
