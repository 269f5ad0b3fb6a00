"""``python -m streamlet.testing.nemesis``: seeded fault schedules against real processes on test hosts, checked.

Runs seeds ``S`` … ``S+N-1`` (``--seed S --runs N``) one after another, each
on a fresh cluster of its own hosts (network namespaces: needs root, ``ip``
and ``nft``), under the faults its seed draws (``--faults kill,pause,...``;
default: every kind real processes have). Prints a line per run and, for a
run that broke a rule, its violations, schedule and the command that replays
it, keeping that run's folder (logs, ``cluster.json``, the output). With
``--json`` the last line is one JSON object: ``runs``, ``violations``,
``seeds_failed``, ``faults_injected``, ``fault_kinds``, ``committed``,
``outcomes``, ``attempts``, ``seconds``. Exit status 1 when any run broke a
rule.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from streamlet.testing.chaos.faults import check_kinds
from streamlet.testing.nemesis.hosts import unavailable
from streamlet.testing.nemesis.runner import KINDS, NemesisRun, draw, run_seed


def report(runs: list[NemesisRun], seconds: float) -> dict[str, Any]:
    """The summary printed as the last line with ``--json``."""
    outcomes: dict[str, int] = {}
    for run in runs:
        outcomes[run.state] = outcomes.get(run.state, 0) + 1
    return {
        "runs": len(runs),
        "violations": sum(len(run.violations) for run in runs),
        "seeds_failed": [run.seed for run in runs if run.violations],
        "faults_injected": sum(len(run.faults) for run in runs),
        "fault_kinds": sorted({fault.kind for run in runs for fault in run.faults}),
        "committed": sum(run.committed for run in runs),
        "outcomes": outcomes,
        "attempts": {str(run.seed): run.attempts for run in runs},
        "seconds": round(seconds, 1),
    }


@click.command()
@click.option("--seed", type=int, default=0, show_default=True, help="The first seed.")
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True, help="Seeds to run, from --seed on.")
@click.option("--faults", default=None, help=f"Comma-separated fault kinds (default: {','.join(KINDS)}).")
@click.option(
    "--keep", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Keep each run's folder under this one (default: only a failed run's, in a temporary folder).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary as the last line.")
def main(seed: int, runs: int, faults: str | None, keep: Path | None, as_json: bool) -> None:
    """Seeded fault schedules against a real cluster on test hosts, every answer checked."""
    reason = unavailable()
    if reason is not None:
        raise click.ClickException(f"the nemesis needs test hosts: {reason}")
    try:
        kinds = tuple(check_kinds(faults.split(","))) if faults else KINDS
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--faults") from None
    began, done = time.monotonic(), []
    for current in range(seed, seed + runs):
        folder = Path(tempfile.mkdtemp(prefix=f"nemesis-{current}-", dir=keep))
        run = run_seed(current, folder, draw(current, kinds))
        done.append(run)
        line = f"seed {current}: {run.state} in attempt {run.attempts}, {run.committed} committed, "
        line += f"{len(run.faults)} faults, {run.seconds:.1f} s"
        line += "" if run.state == "FINISHED" else f" ({run.reason})"
        click.echo(line + (" — BROKE A RULE" if run.violations else ""))
        if run.violations:
            click.echo("\n".join([f"  ! {violation}" for violation in run.violations]))
            click.echo("\n".join([f"    {fault}" for fault in run.faults]))
            replay = f"python -m streamlet.testing.nemesis --seed {current} --runs 1"
            click.echo(f"  folder: {folder}\n  replay: {replay}" + (f" --faults {faults}" if faults else ""))
        elif keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    if as_json:
        click.echo(json.dumps(report(done, time.monotonic() - began)))
    sys.exit(1 if any(run.violations for run in done) else 0)


if __name__ == "__main__":
    main()
