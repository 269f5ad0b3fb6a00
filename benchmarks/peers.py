"""The word count of ``benchmarks.wordcount`` in streamlet and in its Python peers, Bytewax and streamz.

Not part of the project's dependencies: run it where they are installed
(``pip install bytewax streamz`` beside the project with its ``bench`` and ``columnar`` extras), e.g.
``python -m benchmarks peers --json``.
Every run counts the same 1 M words (10 k vocabulary); the baseline is the
hand-written asyncio pipeline of plain tuples in batches of 1000
(``benchmarks.wordcount``), in the same rounds. Bytewax runs its
``count_final`` over a ``TestingSource`` in batches of 1000 (one worker, as
``run_main``); streamz pushes each word through ``map`` and ``accumulate``
(it has no batches), keeping the counts in the accumulator's dict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.common import alternating, median_rate, report
from benchmarks.wordcount import make_words, run_streamlet, run_tuple_baseline


def run_bytewax(words: list[str]) -> dict[str, int]:
    """Bytewax's word count: ``count_final`` keyed by the word."""
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main

    found: list[tuple[str, int]] = []
    flow = Dataflow("wordcount")
    stream = op.input("words", flow, TestingSource(words, batch_size=1000))
    op.output("totals", op.count_final("count", stream, lambda word: word), TestingSink(found))
    run_main(flow)
    return dict(found)


def run_streamz(words: list[str]) -> dict[str, int]:
    """streamz's word count: every word through ``map`` and ``accumulate`` into one dict."""
    from streamz import Stream

    def add(counts: dict[str, int], pair: tuple[str, int]) -> dict[str, int]:
        counts[pair[0]] = counts.get(pair[0], 0) + pair[1]
        return counts

    source = Stream()
    totals: dict[str, int] = {}
    counting = source.map(lambda word: (word, 1)).accumulate(add, start=totals)  # held: streamz links weakly
    for word in words:
        source.emit(word)
    del counting
    return totals


def import_peers() -> None:
    """Import Bytewax and streamz before anything is timed: their first run must not pay their imports."""
    import bytewax.dataflow
    import bytewax.operators
    import bytewax.testing
    import streamz

    del bytewax, streamz


def main(records: int, repeats: int) -> dict[str, Any]:
    """Every run ``repeats`` times, alternating which goes first; medians; all counts checked equal."""
    import_peers()
    words = make_words(records)
    runs: dict[str, Callable[[], dict[str, int]]] = {
        "streamlet": lambda: run_streamlet(words), "baseline": lambda: run_tuple_baseline(words),
        "bytewax": lambda: run_bytewax(words), "streamz": lambda: run_streamz(words),
    }  # fmt: skip
    timings = alternating(repeats, runs)
    expected = timings["baseline"][0][1]
    if any(counts != expected for series in timings.values() for _, counts in series):
        raise AssertionError("the runs disagree on the counts")
    rates = {name: median_rate(records, [seconds for seconds, _ in series]) for name, series in timings.items()}
    return report(
        "peers", rates["streamlet"], rates["baseline"], bytewax_records_per_s=round(rates["bytewax"]),
        streamz_records_per_s=round(rates["streamz"]), over_bytewax=round(rates["streamlet"] / rates["bytewax"], 2),
        over_streamz=round(rates["streamlet"] / rates["streamz"], 2), records=records, repeats=repeats,
    )  # fmt: skip
