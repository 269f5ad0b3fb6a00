"""The CPU-bound job the parallel benchmark submits to a local cluster (by reference)."""

from __future__ import annotations

import os

import streamlet as sl
from benchmarks.parallel import build


def build_topology() -> sl.Topology:
    """The parallel benchmark's job (``work`` at parallelism 2) on ``STREAMLET_BENCH_RECORDS`` records."""
    return build(int(os.environ.get("STREAMLET_BENCH_RECORDS", "100000")), 2)
