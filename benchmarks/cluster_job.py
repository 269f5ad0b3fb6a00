"""The word count the cluster benchmark submits (by reference): 1 M words, keyed count with parallelism 2."""

from __future__ import annotations

import os

import streamlet as sl
from benchmarks.wordcount import CountWords, make_words


def build_topology(scale: int = 1) -> sl.Topology:
    """words -> pair -> count (x2, SAME_KEY) -> totals."""
    words = make_words(scale * int(os.environ.get("STREAMLET_BENCH_RECORDS", "1000000")))
    topology = sl.Topology("cluster-wordcount")
    source = topology.add_source("words", words)
    pairs = topology.map("pair", lambda record: (record.value, 1)).set_input(source)
    count = topology.add_task("count", CountWords, parallelism=2).set_input(pairs, partitioning=sl.SAME_KEY)
    topology.add_sink("totals", sl.CollectSink()).set_input(count)
    return topology


def build_long_topology() -> sl.Topology:
    """The same job on 4 times the words: long enough to see a checkpoint interval at work."""
    return build_topology(scale=4)
