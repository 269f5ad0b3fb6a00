"""``streamlet run`` on a terminal: one line, redrawn every second while the job runs, with its records in (what
its sources emitted) and out (what its sinks received), so far and per second, and the time it has run.

Only where someone watches (stderr is a terminal, no ``--json``): a script reading the report gets the report
alone. Like ``submit``'s progress line, it is gone once the job ends.
"""

from __future__ import annotations

from typing import Any

import anyio
from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner

from streamlet.backends.local import start
from streamlet.core.model import world
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.job import JobResult
from streamlet.core.runtime.statistics import JobStatistics

EVERY = 1.0  # seconds between redraws


def flow(statistics: JobStatistics) -> tuple[int, int]:
    """Records in (emitted by the sources) and out (received by the sinks) so far."""
    nodes = statistics.nodes.values()
    return (
        sum(node.records_out for node in nodes if node.kind == "source"),
        sum(node.records_in for node in nodes if node.kind == "sink"),
    )


def progress_line(name: str, now: tuple[int, int], before: tuple[int, int], seconds: float, elapsed: float) -> str:
    """``job 'wc' · in 12,000 (4,000/s) · out 11,500 (3,900/s) · 3.2 s``: ``before`` was ``seconds`` ago.

    Example:
        >>> progress_line("wc", (12000, 11500), (8000, 7600), 1.0, 3.25)
        "job 'wc' · in 12,000 (4,000/s) · out 11,500 (3,900/s) · 3.2 s"
    """
    rate_in, rate_out = ((now[0] - before[0]) / seconds, (now[1] - before[1]) / seconds) if seconds > 0 else (0, 0)
    return f"job '{name}' · in {now[0]:,} ({rate_in:,.0f}/s) · out {now[1]:,} ({rate_out:,.0f}/s) · {elapsed:.1f} s"


async def run_showing_progress(topology: Topology, console: Console, every: float = EVERY, **options: Any) -> JobResult:
    """Run ``topology`` in this event loop (``options`` as for ``sl.start``), drawing its progress line on
    ``console`` every ``every`` seconds; the job's result."""
    async with start(topology, **options) as job:
        began = world.monotonic()
        with Live(Spinner("dots", f"job '{topology.name}' starting"), console=console, transient=True) as live:
            async with anyio.create_task_group() as group:

                async def draw() -> None:
                    before, at = (0, 0), began
                    while True:
                        await anyio.sleep(every)
                        now, clock = flow(job.statistics()), world.monotonic()
                        line = progress_line(topology.name, now, before, clock - at, clock - began)
                        live.update(Spinner("dots", line))
                        before, at = now, clock

                group.start_soon(draw)
                result = await job.wait()
                group.cancel_scope.cancel()
    return result
