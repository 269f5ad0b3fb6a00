"""Checkpoint overhead: the word count job (100 k keys) with no checkpoints vs one per second.

Both runs use the same topology and data in the same process; the
checkpointed one writes to a fresh temporary directory each time (fsync and
rename included) and also takes the final checkpoint at the end of the job.
The ratio is checkpointed throughput / plain throughput.
"""

from __future__ import annotations

import tempfile
from typing import Any

import streamlet as sl
from benchmarks.common import alternating, median_rate, report
from benchmarks.wordcount import build, make_words


def run(words: list[str], checkpoint_dir: str | None) -> sl.JobResult:
    """The word count job, with checkpoints every second when ``checkpoint_dir`` is given."""
    if checkpoint_dir is None:
        return sl.run(build(words))
    return sl.run(build(words), checkpoint_dir=checkpoint_dir, checkpoint_interval=1.0)


def run_checkpointed(words: list[str]) -> sl.JobResult:
    """One checkpointed run in a fresh temporary directory."""
    with tempfile.TemporaryDirectory() as directory:
        return run(words, directory)


def main(records: int, repeats: int) -> dict[str, Any]:
    """Plain and checkpointed runs, alternating order; medians, plus the checkpoints' count, size and time."""
    words = make_words(records, vocabulary=100_000)
    timings = alternating(repeats, {"plain": lambda: run(words, None), "checkpointed": lambda: run_checkpointed(words)})
    results = [result for _, result in timings["checkpointed"]]
    last = results[-1].statistics.last_checkpoint
    return report(
        "checkpoint",
        median_rate(records, [seconds for seconds, _ in timings["checkpointed"]]),
        median_rate(records, [seconds for seconds, _ in timings["plain"]]),
        checkpoints_per_run=[result.statistics.checkpoints for result in results],
        snapshot_bytes=last.size_bytes,
        snapshot_seconds=round(last.seconds, 4),
        records=records,
        keys=100_000,
        repeats=repeats,
    )
