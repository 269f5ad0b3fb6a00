"""``python -m streamlet.testing.chaos``: seeded runs of the simulated cluster under faults, checked.

Runs seeds ``S``, ``S+1``, ... ``S+N-1`` (``--seed S --runs N``), each on a
workload (``--workload``; default: the built-in ones in turn, by seed) under
the faults its seed draws (``--faults kill,pause,...``; default: every kind).
Prints a line per run, then, for each run that broke a rule, the seed, the
schedule, the end of its trace and the command that replays it. With
``--json`` the last line is one JSON object: ``runs``, ``violations``,
``seeds_failed``, ``trace_hashes`` (seed -> hash), ``faults_injected``,
``fault_kinds``, ``records`` (read by the sources), ``committed`` (by the
sinks), ``outcomes`` (final job states), ``seconds``. Exit status 1 when
any run broke a rule.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import click

from streamlet.testing.chaos.faults import KINDS, check_kinds
from streamlet.testing.chaos.runner import RunResult, run_once
from streamlet.testing.chaos.workloads import WORKLOADS


def workload_for(seed: int, name: str | None) -> str:
    """The workload a seed runs: the one named, or the built-in ones in turn."""
    if name is not None:
        return name
    names = sorted(WORKLOADS)
    return names[seed % len(names)]


def run_seed(seed: int, workload: str | None, kinds: tuple[str, ...]) -> RunResult:
    """One run (what each process of ``--jobs`` does)."""
    return run_once(seed, WORKLOADS[workload_for(seed, workload)], kinds=kinds)


def report(results: list[RunResult], seconds: float) -> dict[str, Any]:
    """The summary printed as the last line with ``--json``."""
    failed = [result for result in results if result.violations]
    outcomes: dict[str, int] = {}
    for result in results:
        outcomes[result.state] = outcomes.get(result.state, 0) + 1
    return {
        "runs": len(results),
        "violations": sum(len(result.violations) for result in results),
        "seeds_failed": [result.seed for result in failed],
        "trace_hashes": {str(result.seed): result.trace_hash for result in results},
        "faults_injected": sum(len(result.faults) for result in results),
        "fault_kinds": sorted({fault.kind for result in results for fault in result.faults}),
        "records": sum(result.records_in for result in results),
        "committed": sum(result.committed for result in results),
        "changes_done": sum(result.changes_done for result in results),
        "savepoints": sum(result.savepoints for result in results),
        "outcomes": outcomes,
        "seconds": round(seconds, 2),
    }


def describe_failure(result: RunResult, faults: str | None) -> str:
    """The seed, its schedule, the violations, the end of the trace, and how to replay it."""
    replay = f"python -m streamlet.testing.chaos --seed {result.seed} --runs 1 --workload {result.workload}"
    if faults:
        replay += f" --faults {faults}"
    lines = [f"seed {result.seed} ({result.workload}) broke {len(result.violations)} rule(s):"]
    lines += [f"  ! {violation}" for violation in result.violations]
    lines += ["  schedule:"] + [f"    {fault}" for fault in result.faults]
    lines += ["  the trace's end:"] + [f"    {line[:240]}" for line in result.trace_tail[-25:]]
    lines.append(f"  replay: {replay}")
    return "\n".join(lines)


@click.command()
@click.option("--seed", type=int, default=0, show_default=True, help="The first seed.")
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True, help="Seeds to run, from --seed on.")
@click.option("--faults", default=None, help=f"Comma-separated fault kinds (default: all of {', '.join(KINDS)}).")
@click.option("--workload", type=click.Choice(sorted(WORKLOADS)), default=None, help="Default: each in turn.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Processes running seeds.")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line summing up the runs.")
def main(seed: int, runs: int, faults: str | None, workload: str | None, jobs: int, as_json: bool) -> None:
    """Run seeded chaos runs of the simulated cluster and check every answer."""
    try:
        kinds = tuple(check_kinds(faults.split(","))) if faults else KINDS
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--faults") from None
    began = time.perf_counter()
    seeds = range(seed, seed + runs)
    results: list[RunResult] = []
    if jobs == 1:
        outcomes = (run_seed(s, workload, kinds) for s in seeds)
        for result in outcomes:
            results.append(result)
            _line(result)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for result in pool.map(run_seed, seeds, [workload] * runs, [kinds] * runs, chunksize=4):
                results.append(result)
                _line(result)
    for result in results:
        if result.violations:
            click.echo(describe_failure(result, faults))
    summary = report(results, time.perf_counter() - began)
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    sys.exit(1 if summary["violations"] else 0)


def _line(result: RunResult) -> None:
    mark = "FAIL" if result.violations else "ok"
    click.echo(
        f"{mark:4} seed {result.seed:6} {result.workload:8} {result.state:9} {result.trace_hash} "
        f"faults={len(result.faults)} committed={result.committed} virtual={result.virtual_seconds:.1f}s"
    )


if __name__ == "__main__":
    main()
