"""Word count: lines -> split (parallel, ROUND_ROBIN) -> count (parallel, SAME_KEY) -> sink.

Run it in-process with ``python examples/wordcount.py [PATH]``, or with
``streamlet run examples/wordcount.py --sort -value`` (most frequent first;
``--param path=PATH`` counts another file, ``--param parallelism=4`` spreads
it wider). It counts the words of a bundled text unless given a path.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import streamlet as sl

BUNDLED_TEXT = Path(__file__).parent / "data" / "river.txt"
WORD = re.compile(r"[a-z']+")


class CountWords(sl.Task):
    """Counts each word in keyed state and emits the totals when the input ends."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        counts = self.state
        for record in inputs.get():
            counts.put(record.key, counts.get(record.key, 0) + record.value)

    def finish(self, outputs: sl.Outputs) -> None:
        for word, total in self.state.items():
            outputs.emit(word, total)


def split_line(record: sl.Record) -> list[tuple[str, int]]:
    """``"The river"`` -> ``[("the", 1), ("river", 1)]``."""
    return [(word, 1) for word in WORD.findall(record.value.lower())]


def build_topology(path: Path = BUNDLED_TEXT, parallelism: int = 2) -> sl.Topology:
    """The word-count topology over the lines of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    topology = sl.Topology("wordcount")
    source = topology.add_source("lines", lines)
    split = topology.flat_map("split", split_line, parallelism=parallelism).set_input(source)
    count = topology.add_task("count", CountWords, parallelism=parallelism)
    count.set_input(split, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(count)
    return topology


def word_counts(result: sl.JobResult) -> dict[str, int]:
    """The job's totals as a dict."""
    return {record.key: record.value for record in result.sink("totals")}


def main(argv: list[str]) -> None:
    """Count the words of the file named in ``argv`` (or the bundled text) and print the top ten."""
    path = Path(argv[1]) if len(argv) > 1 else BUNDLED_TEXT
    result = sl.run(build_topology(path))
    counts = word_counts(result)
    print(f"{sum(counts.values())} words, {len(counts)} distinct, in {result.statistics.wall_time * 1000:.1f} ms")
    for word, total in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:10]:
        print(f"{total:6d}  {word}")


if __name__ == "__main__":
    main(sys.argv)
