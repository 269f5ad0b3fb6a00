"""The nemesis's job: keyed running counts into an exactly-once :class:`~streamlet.FileSink`, paced to last.

Every record's count is emitted, so a record processed twice or lost shows in
the committed output as a count missing or repeated: the checker compares the
multiset of committed (key, count) pairs with a plain count.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from streamlet.core.model.record import Record

JOB = "nemesis"
RECORDS = 60_000
KEYS = 30
PACE = 0.3  # seconds per batch (the source reads 1 000 records at a time): about 18 s when nothing goes wrong

JOB_TEXT = """
import asyncio

import streamlet as sl

RECORDS, KEYS, PACE = {records}, {keys}, {pace}


class Pace(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(PACE)
        outputs.emit_batch(inputs.get())


class RunningCount(sl.Task):
    def execute(self, inputs, outputs):
        for record in inputs.get():
            count = self.state.get(record.key, 0) + 1
            self.state.put(record.key, count)
            outputs.emit(record.key, count)


def build_topology():
    topology = sl.Topology("nemesis-counts")
    items = topology.add_source("items", [(f"k{{i % KEYS}}", i) for i in range(RECORDS)])
    pace = topology.add_task("pace", Pace).set_input(items)
    count = topology.add_task("count", RunningCount, parallelism=2).set_input(pace, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.FileSink({output!r})).set_input(count)
    return topology
"""


def write_job(directory: Path, output: Path) -> Path:
    """The job's file in ``directory``, its sink writing to ``output``."""
    path = directory / "nemesis_counts.py"
    path.write_text(JOB_TEXT.format(records=RECORDS, keys=KEYS, pace=PACE, output=str(output)), encoding="utf-8")
    return path


def expected() -> dict[str, list[Record]]:
    """What a run without faults commits: each key's counts 1..n, once each."""
    totals = Counter(f"k{i % KEYS}" for i in range(RECORDS))
    return {"out": [Record(key, n) for key, total in totals.items() for n in range(1, total + 1)]}


def committed(output: Path) -> dict[str, list[Record]]:
    """What the sink published: every line of every visible part file (staged files are not output)."""
    records = []
    for part in sorted(output.glob("part-*.jsonl")):
        for line in part.read_text(encoding="utf-8").splitlines():
            key, value, ts = json.loads(line)
            records.append(Record(key, value, ts))
    return {"out": records}
