"""Memory bounded by the cache on a cluster: a worker keeping a state several times its RocksDB cache in RocksDB
grows by a fraction of the state's size (the one-process counterpart, with the in-memory dict beside it, is
``tests/unit/core/test_rocksdb_memory.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.faults import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.integration]

KEYS = 300_000
VALUE_BYTES = 200  # 300 000 x 200 B: 60 MB of values (in the in-memory dict, well over 100 MB of objects)
BOUND_MB = 40

# The job measures its own worker (it runs in the worker's process): the resident set when it first runs and
# after every batch, so the figure is this job's growth, whatever the worker did before. It reads nothing from
# the environment of the shell that submits it.
JOB = f"""
import streamlet as sl

KEYS, SIZE = {KEYS}, {VALUE_BYTES}


def resident_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


class Keep(sl.Task):
    first = None
    peak = 0.0

    def execute(self, inputs, outputs):
        if self.first is None:
            self.first = resident_mb()
        values = self.state.values
        for key, value, _ in inputs.elements():
            values[key] = value
        self.peak = max(self.peak, resident_mb())

    def finish(self, outputs):
        kept = sum(1 for _ in self.state.items())
        outputs.emit("kept", [kept, round(self.peak - self.first, 1)])


def values():
    for i in range(KEYS):
        yield sl.Record(i, str(i).rjust(SIZE, "x"), 0.0)


def build_topology():
    topology = sl.Topology("keep")
    keep = topology.add_task("keep", Keep).set_input(topology.add_source("numbers", values()))
    topology.add_sink("out", sl.CollectSink()).set_input(keep)
    return topology
"""


def test_a_worker_keeping_state_in_rocksdb_grows_by_a_fraction_of_it(
    new_cluster: Callable[..., LocalCluster], tmp_path: Path, figures: Callable[[str], None]
) -> None:
    cluster = new_cluster(workers=1)
    job = tmp_path / "keep.py"
    job.write_text(JOB, encoding="utf-8")
    submit = cluster.submit(job, "keep", "--state-backend", "rocksdb", "--state-cache-mb", "8").finish(120)
    assert submit.code == 0, submit.err
    [[key, [kept, grew_mb], _ts]] = submit.collected()["out"]
    figures(f"bounded state on a worker: {KEYS} keys x {VALUE_BYTES} B in RocksDB (cache 8 MB): +{grew_mb} MB RSS")
    assert (key, kept) == ("kept", KEYS)
    assert grew_mb < BOUND_MB
