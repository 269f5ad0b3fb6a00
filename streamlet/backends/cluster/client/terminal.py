"""The terminal views: ``streamlet top`` (a live screen of workers and jobs) and ``submit --wait``'s progress.

Both read ZooKeeper like ``cluster status`` does; rates come from the
workers' heartbeats (see ``top``). ``top`` redraws every ``interval``
seconds with rich's ``Live``; ``top --once`` prints one frame, with rates
once every worker has beaten twice (at most :data:`ONCE_WAIT` seconds).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from streamlet.backends.cluster.client.top import Flow, HeartbeatRates, TopFrame, read_frame, read_loads
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.backends.cluster.tree.zk import StoreSettings

ONCE_WAIT = 5.0  # seconds top --once waits for every worker's second heartbeat (the slowest beats every 2 s)
PROGRESS_EVERY = 1.0  # seconds between progress updates while submit waits


def render_frame(frame: TopFrame) -> RenderableType:
    """The frame as a title line, a table of workers and a table of jobs."""
    status = frame.status
    lead = status["leader"]
    leader = f"leader {lead['name']} (epoch {lead['epoch']})" if lead else "no leader"
    title = Text(f"cluster '{status['cluster']}' · {leader} · {time.strftime('%H:%M:%S')}", style="bold")
    held = [Text(f"held the event loop: {key} on {worker}, {seconds:.1f} s", style="yellow")
            for key, worker, seconds in frame.held]  # fmt: skip
    return Group(title, Text(), _workers_table(frame), Text(), _jobs_table(frame), *held)


def _workers_table(frame: TopFrame) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for header, justify in (("worker", "left"), ("state", "left"), ("load", "left"), ("cpu%", "right"),
                            ("rss MB", "right"), ("instances", "right"), ("heartbeat", "left")):  # fmt: skip
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for worker in frame.status["workers"]:
        beat = worker.get("heartbeat") or ("stale" if worker["stale"] else "ok")
        table.add_row(
            worker["id"], worker["state"], worker["load"], str(worker["cpu"]), f"{worker['rss_mb']:.1f}",
            str(frame.instances.get(worker["id"], 0)), beat,
        )  # fmt: skip
    return table


def _jobs_table(frame: TopFrame) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for header, justify in (("job", "left"), ("state", "left"), ("attempt", "right"), ("in/s", "right"),
                            ("out/s", "right"), ("records in", "right"), ("records out", "right")):  # fmt: skip
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for job in frame.status["jobs"]:
        name = job["name"]
        total = frame.totals.get(name)  # None: no worker runs any of it now
        rate = None if frame.rates is None or total is None else frame.rates.get(name, Flow())
        table.add_row(
            name, job["state"], str(job["attempt"]), _count(rate, "records_in"), _count(rate, "records_out"),
            _count(total, "records_in"), _count(total, "records_out"),
        )  # fmt: skip
    return table


def _count(flow: Flow | None, which: str) -> str:
    return "-" if flow is None else f"{getattr(flow, which):,.0f}"


async def run_top(settings: StoreSettings, once: bool, interval: float, console: Console) -> None:
    """Show the cluster on ``console``: one frame (``once``), or a live view redrawn every ``interval`` s
    (the jobs and heartbeats are readable with the cluster secret only: without it, :class:`NotAuthorized`)."""
    rates = HeartbeatRates()
    async with settings.open() as zk:
        frame = await read_frame(zk, rates)
        if once:
            with anyio.move_on_after(ONCE_WAIT):
                while frame.rates is None:
                    await anyio.sleep(0.2)
                    frame = await read_frame(zk, rates)
            console.print(render_frame(frame))
            return
        with Live(render_frame(frame), console=console, auto_refresh=False) as live:
            while True:
                await anyio.sleep(interval)
                live.update(render_frame(await read_frame(zk, rates)), refresh=True)


class SubmitProgress:
    """While ``submit`` waits: a spinner line with the job's state and its records in and out (so far and
    per second), redrawn every :data:`PROGRESS_EVERY` seconds; gone once the job ends."""

    def __init__(self, console: Console) -> None:
        self.live = Live(Spinner("dots", "submitted"), console=console, transient=True, auto_refresh=True)
        self.rates = HeartbeatRates()
        self.shown_at = 0.0

    def __enter__(self) -> SubmitProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.live.__exit__(None, None, None)

    async def __call__(self, zk: ClusterStore, status: dict[str, Any]) -> None:
        """Called with each status ``submit`` reads; reads the heartbeats at most every second."""
        now = time.monotonic()
        if now - self.shown_at < PROGRESS_EVERY:
            return
        self.shown_at = now
        self.rates.update(await read_loads(zk))
        self.live.update(Spinner("dots", progress_line(status, self.rates)))


def progress_line(status: dict[str, Any], rates: HeartbeatRates) -> str:
    """``job 'wc' RUNNING (attempt 1) · in 12,000 (4,000/s) · out 11,500 (3,900/s)``."""
    job = status["job"]
    line = f"job '{job}' {status['state']} (attempt {status['attempt']})"
    total = rates.totals().get(job, Flow())
    rate = rates.rates().get(job, Flow())
    return (
        f"{line} · in {total.records_in:,.0f} ({rate.records_in:,.0f}/s)"
        f" · out {total.records_out:,.0f} ({rate.records_out:,.0f}/s)"
    )
