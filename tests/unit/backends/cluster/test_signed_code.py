"""On a cluster, the code that runs is the code that was signed: an edited job resubmitted runs its new code."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from streamlet.testing import SimulatedCluster
from tests.unit.test_job_code import write_job


async def test_an_edited_job_file_resubmitted_is_scheduled_and_run_from_its_new_code(tmp_path: Path) -> None:
    """v1, then v2 (task renamed, parallelism 2) of one file under a new job name: v2 runs everywhere."""
    path = tmp_path / "trustjob.py"
    write_job(path, "v1")
    async with SimulatedCluster(workers=2, checkpoint_interval=None) as cluster:
        first = await cluster.run(f"{path}:build_topology", job="trust-v1")
        write_job(path, "v2", task="stamp", parallelism=2)
        second = await cluster.run(f"{path}:build_topology", job="trust-v2")
    assert sorted((r.key, r.value) for r in first.collected["out"]) == [("v1", 1), ("v1", 2), ("v1", 3)]
    assert sorted((r.key, r.value) for r in second.collected["out"]) == [("v2", 1), ("v2", 2), ("v2", 3)]
    assert sorted(second.ran_on) == ["in.0", "out.0", "stamp.0", "stamp.1"]


async def test_a_job_by_module_name_runs_the_signed_file_not_the_imported_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module imported before its file was edited does not run: the workers load the signed bytes."""
    path = tmp_path / "trustjob_cluster.py"
    write_job(path, "v1")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("trustjob_cluster")
    try:
        write_job(path, "v2", task="renamed")
        async with SimulatedCluster(workers=1, checkpoint_interval=None) as cluster:
            outcome = await cluster.run("trustjob_cluster:build_topology", job="by-name")
    finally:
        sys.modules.pop("trustjob_cluster", None)
    assert sorted((r.key, r.value) for r in outcome.collected["out"]) == [("v2", 1), ("v2", 2), ("v2", 3)]
    assert sorted(outcome.ran_on) == ["in.0", "out.0", "renamed.0"]


async def test_a_job_file_named_after_a_standard_module_runs_on_the_cluster(tmp_path: Path) -> None:
    """A job file called random.py whose code imports random runs, and random stays the standard module."""
    path = tmp_path / "random.py"
    write_job(path, "v1")
    async with SimulatedCluster(workers=1, checkpoint_interval=None) as cluster:
        outcome = await cluster.run(f"{path}:build_topology", job="random-job")
    assert outcome.state == "FINISHED"
    assert sorted((r.key, r.value) for r in outcome.collected["out"]) == [("v1", 1), ("v1", 2), ("v1", 3)]
    assert sys.modules["random"].__file__ != str(path)
