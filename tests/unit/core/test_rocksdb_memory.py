"""Memory bounded by the cache, not by the state: a keyed state several times larger than RocksDB's cache keeps a
process's peak RSS within a stated bound, where the same state in the in-memory dict grows the process by about
its size. Each run is a fresh interpreter, measured by its own high-water mark (``VmHWM``: ``getrusage`` would
report the forking test process's peak, which Linux carries across ``exec``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KEYS = 600_000
VALUE_BYTES = 200  # 600 000 x 200 B: 120 MB of values, more in Python objects (measured: the dict grows ~230 MB)

JOB = """
import json, sys
sys.path.insert(0, {root!r})
import streamlet as sl

KEYS, SIZE = {keys}, {size}
seen = [0]


class Keep(sl.Task):
    def execute(self, inputs, outputs):
        values = self.state.values
        for key, value, _ in inputs.elements():
            values[key] = value

    def finish(self, outputs):
        seen[0] = sum(1 for _ in self.state.items())


def values():
    for i in range(KEYS):
        yield sl.Record(i, str(i).rjust(SIZE, "x"), 0.0)


topology = sl.Topology("keep")
keep = topology.add_task("keep", Keep).set_input(topology.add_source("numbers", values()))
topology.add_sink("nothing", lambda record: None).set_input(keep)


def peak_mb():  # this process's own peak (VmHWM): getrusage's maxrss keeps the forking parent's from before exec
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


before = peak_mb()
backend = None if {folder!r} is None else sl.RocksDBState({folder!r}, cache_mb=8, cache_entries=1000)
sl.run(topology, state_backend=backend)
after = peak_mb()
print(json.dumps({{"kept": seen[0], "grew_mb": after - before}}))
"""


def peak_growth(folder: Path | None) -> dict[str, float]:
    code = JOB.format(root=str(ROOT), keys=KEYS, size=VALUE_BYTES, folder=None if folder is None else str(folder))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_state_several_times_the_cache_keeps_the_process_within_its_bound(tmp_path: Path) -> None:
    """8 MB of block cache, memtables of 2 MB (two at most), 1 000 decoded values: the run grows the process by
    less than 60 MB (measured: 40) while holding 600 000 values of 200 B; in the dict the same state grows it by
    more than 150 MB (measured: 230)."""
    on_rocks = peak_growth(tmp_path / "rocks")
    in_memory = peak_growth(None)
    assert on_rocks["kept"] == in_memory["kept"] == KEYS
    assert on_rocks["grew_mb"] < 60, on_rocks
    assert in_memory["grew_mb"] > 150, in_memory
