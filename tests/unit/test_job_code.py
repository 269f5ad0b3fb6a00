"""Job code runs from the bytes that were signed, as a module of its own: no stale copy, no shadowing."""

from __future__ import annotations

import hashlib
import importlib
import sys
import traceback
from pathlib import Path

import pytest

import streamlet as sl
from streamlet.errors import SpecError
from streamlet.job_code import forget, load_module, module_name
from streamlet.loading import load_topology

JOB = """
import dataclasses
import random

import streamlet as sl

VERSION = "{version}"


@dataclasses.dataclass
class Stamp:
    version: str


def build_topology():
    topology = sl.Topology("trust")
    source = topology.add_source("in", [1, 2, 3])
    rng = random.Random(7)
    tag = topology.map("{task}", lambda r: (Stamp(VERSION).version, r.value + rng.randint(0, 0)),
                       parallelism={parallelism})
    tag.set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(tag)
    return topology


def fail():
    raise RuntimeError("from version " + VERSION)
"""


def write_job(path: Path, version: str, task: str = "tag", parallelism: int = 1) -> str:
    path.write_text(JOB.format(version=version, task=task, parallelism=parallelism))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outputs(topology: sl.Topology) -> list[tuple[str, int]]:
    return sorted((record.key, record.value) for record in sl.run(topology).sink("out"))


def test_an_edited_file_loads_as_its_new_code(tmp_path: Path) -> None:
    """v1 then v2 of one file: each load runs the bytes on disk, as a module of its own."""
    path = tmp_path / "trustjob.py"
    write_job(path, "v1")
    first = load_topology(f"{path}:build_topology")
    write_job(path, "v2", task="stamp", parallelism=2)
    second = load_topology(f"{path}:build_topology")
    assert outputs(first) == [("v1", 1), ("v1", 2), ("v1", 3)]
    assert outputs(second) == [("v2", 1), ("v2", 2), ("v2", 3)]
    assert (list(second.nodes), second.nodes["stamp"].parallelism) == (["in", "stamp", "out"], 2)


def test_a_module_imported_before_is_not_the_code_that_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target by module name loads the file's current bytes, not the copy already in sys.modules."""
    path = tmp_path / "trustjob_by_name.py"
    write_job(path, "v1")
    monkeypatch.syspath_prepend(str(tmp_path))
    stale = importlib.import_module("trustjob_by_name")
    try:
        digest = write_job(path, "v2", task="renamed")
        topology = load_topology("trustjob_by_name:build_topology", digest=digest)
        assert stale.VERSION == "v1"
        assert outputs(topology) == [("v2", 1), ("v2", 2), ("v2", 3)]
        assert list(topology.nodes) == ["in", "renamed", "out"]
    finally:
        sys.modules.pop("trustjob_by_name", None)


def test_a_job_file_named_after_a_standard_module_shadows_nothing(tmp_path: Path) -> None:
    """random.py that imports random gets the standard module, and so does everyone after it."""
    path = tmp_path / "random.py"
    write_job(path, "v1")
    topology = load_topology(str(path))
    assert outputs(topology) == [("v1", 1), ("v1", 2), ("v1", 3)]
    assert sys.modules["random"].__file__ != str(path)
    assert not any(
        name == "random" for name, module in sys.modules.items() if getattr(module, "__file__", None) == str(path)
    )


def test_a_file_that_differs_from_its_signed_digest_is_refused(tmp_path: Path) -> None:
    """Bytes whose SHA-256 is not the signed one are never run."""
    path = tmp_path / "trustjob.py"
    signed = write_job(path, "v1")
    now = write_job(path, "v2")
    with pytest.raises(
        SpecError,
        match=rf"^{path} differs from the module that was submitted \(sha256 {now[:12]}, submitted {signed[:12]}\)",
    ):
        load_topology(str(path), digest=signed)
    assert module_name(path, signed) not in sys.modules
    assert module_name(path, now) not in sys.modules


def test_a_traceback_shows_the_lines_that_ran_and_the_version(tmp_path: Path) -> None:
    """After the file is edited, a traceback from the loaded code still shows its signed source."""
    path = tmp_path / "trustjob.py"
    digest = write_job(path, "v1")
    module = load_module(str(path), digest)
    path.write_text("# edited\n" * 40)
    with pytest.raises(RuntimeError) as caught:
        module.fail()
    frame = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert frame.filename == f"{path} (sha256 {digest[:12]})"
    assert frame.line == 'raise RuntimeError("from version " + VERSION)'
    assert module.__file__ == str(path)


def test_the_same_bytes_give_the_same_module_and_forget_drops_it(tmp_path: Path) -> None:
    """One module per version; forget() removes it from sys.modules (a job ended)."""
    path = tmp_path / "trustjob.py"
    digest = write_job(path, "v1")
    module = load_module(str(path), digest)
    assert load_module(str(path)) is module
    assert sys.modules[module.__name__] is module
    forget(f"{path}:build_topology", digest)
    assert module.__name__ not in sys.modules
    assert load_module(str(path), digest) is not module
