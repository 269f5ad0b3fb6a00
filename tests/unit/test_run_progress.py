"""``streamlet run`` on a terminal draws a progress line while the job runs: records in and out, so far and per
second, and the time run; the job's result is the plain run's."""

from __future__ import annotations

import asyncio
import io
import re

import anyio
from rich.console import Console

import streamlet as sl
from streamlet.run_progress import run_showing_progress


async def paced():
    for n in range(40):
        await asyncio.sleep(0.01)  # about 0.4 s in all: a few redraws at every=0.05
        yield f"k{n % 4}", n


def test_the_line_shows_records_in_and_out_while_the_job_runs() -> None:
    topology = sl.Topology("paced")
    doubled = topology.map("double", lambda r: (r.key, 2 * r.value)).set_input(topology.add_source("in", paced()))
    topology.add_sink("out", sl.CollectSink()).set_input(doubled)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    result = anyio.run(lambda: run_showing_progress(topology, console, every=0.05))
    assert sorted(r.value for r in result.sink("out")) == [2 * n for n in range(40)]
    lines = re.findall(
        r"job 'paced' · in ([\d,]+) \([\d,]+/s\) · out ([\d,]+) \([\d,]+/s\) · \d+\.\d s", screen.getvalue()
    )
    assert lines, screen.getvalue()
    counts = [(int(a.replace(",", "")), int(b.replace(",", ""))) for a, b in lines]
    assert all(0 <= out <= in_ <= 40 for in_, out in counts)  # what the sink took, the sources sent first
    assert counts == sorted(counts)  # counted so far: it never goes back
