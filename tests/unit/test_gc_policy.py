"""The garbage-collector policy: applied by the processes streamlet owns, never by the library when embedded."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import streamlet as sl
from streamlet.gc_policy import MIDDLE, OLD, YOUNG, tuned_gc

THRESHOLDS_JOB = """
import gc
import streamlet as sl

def build_topology():
    topology = sl.Topology("thresholds")
    source = topology.add_source("one", [1])
    seen = topology.map("seen", lambda record: ("thresholds", list(gc.get_threshold()))).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(seen)
    return topology
"""


def test_the_policy_raises_the_thresholds_freezes_what_is_alive_and_undoes_it() -> None:
    """Inside: the policy's thresholds and a non-empty permanent generation; after: as before."""
    before = gc.get_threshold()
    gc.unfreeze()  # a test before may have run the CLI in this process, which applies the policy
    with tuned_gc():
        assert gc.get_threshold() == (YOUNG, MIDDLE, OLD)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_an_embedded_run_leaves_the_interpreter_as_it_was() -> None:
    """sl.run in someone else's program changes no collector setting."""
    before = gc.get_threshold()
    topology = sl.Topology("embedded")
    source = topology.add_source("numbers", range(10))
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    assert len(sl.run(topology).sink("out")) == 10
    assert gc.get_threshold() == before


def test_streamlet_run_applies_the_policy_before_the_job(tmp_path: Path) -> None:
    """A task inside 'streamlet run' sees the policy's thresholds."""
    job = tmp_path / "thresholds.py"
    job.write_text(THRESHOLDS_JOB, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "streamlet.cli", "run", str(job), "--json"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    [row] = json.loads(run.stdout)["sinks"]["out"]["records"]
    assert row["value"] == [YOUNG, MIDDLE, OLD]
