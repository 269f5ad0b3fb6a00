"""A job's topology as the master knows it: built once per spec in a process of its own, killed at a limit."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import anyio
import pytest

import streamlet as sl
from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.tree import jobs
from streamlet.backends.cluster.tree.outline import OutlinedTopology, Outlines, describe, outline, window_reason
from streamlet.backends.cluster.tree.signing import sign

SECRET = b"outline secret"

SHAPED = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("shaped")
    numbers = topology.add_source("numbers", range(10))
    keyed = topology.map("key", lambda r: (r.value % 3, 1), parallelism=2).set_input(numbers)
    total = topology.reduce("total", lambda a, b: a + b, parallelism=3, labels=("big",), on_error="restart")
    total.set_input(keyed, partitioning=sl.SESSION_TABLE)
    windowed = topology.window_reduce("per10", "sum", sl.CountWindow(10)).set_input(keyed)
    topology.add_sink("out", sl.CollectSink()).set_input(total)
    topology.add_sink("windows", sl.CollectSink()).set_input(windowed)
    topology.set_qos(sl.QoS(max_latency=2.0, max_shed_ratio=0.1))
    return topology
"""


def job_file(tmp_path: Path, source: str, name: str = "shaped.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def signed(path: Path) -> dict[str, object]:
    return dict(sign(job_commands.new_spec(f"{path}:build_topology", {}, None), SECRET))


def test_an_outline_has_the_shape_of_the_topology_and_no_code(tmp_path: Path) -> None:
    """Nodes, edges, partitioning, constraints, QoS and window splittability survive the round trip as data."""
    topology = jobs.topology_of(signed(job_file(tmp_path, SHAPED)))
    shaped = outline(describe(topology))
    assert isinstance(shaped, OutlinedTopology)
    assert [(n.name, n.kind, n.parallelism) for n in shaped.nodes.values()] == [
        (n.name, n.kind, n.parallelism) for n in topology.nodes.values()
    ]
    assert [(e.upstream, e.out_port, e.downstream, e.in_port, e.partitioning) for e in shaped.edges] == [
        (e.upstream, e.out_port, e.downstream, e.in_port, e.partitioning) for e in topology.edges
    ]
    assert (shaped.nodes["total"].labels, shaped.nodes["total"].on_error) == (("big",), "restart")
    assert shaped.qos == topology.qos
    assert shaped.successors() == topology.successors()
    assert window_reason(shaped, "per10") == window_reason(topology, "per10")
    assert str(window_reason(shaped, "per10")).startswith("a CountWindow(per_key=False) counts all")
    assert window_reason(shaped, "total") is None
    assert all(node.make_task is None and node.source is None and node.sink is None for node in shaped.nodes.values())


async def test_a_spec_is_built_in_a_process_of_its_own_once(tmp_path: Path) -> None:
    """The first build runs the job file elsewhere (this process never imports it); the second is cached."""
    path = job_file(tmp_path, SHAPED + "\nimport os\nopen(os.environ['MARK'], 'a').write('built\\n')\n")
    mark = tmp_path / "mark"
    outlines = Outlines()
    spec = signed(path)
    with anyio.fail_after(60):
        import os

        os.environ["MARK"] = str(mark)
        try:
            first = await outlines.build(spec)
            second = await outlines.build(spec)
        finally:
            del os.environ["MARK"]
    assert isinstance(first, OutlinedTopology)
    assert isinstance(second, OutlinedTopology)
    assert first is not second  # a new one each time: callers set parallelism in place
    assert mark.read_text() == "built\n"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert not any(digest in name for name in __import__("sys").modules)


async def test_a_job_file_named_like_a_standard_module_in_the_working_directory_shadows_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master's working directory is where users keep job files: 'numbers.py' there (the standard library's
    ``numbers``, which streamlet's imports reach) is the job, not the module the build process imports."""
    path = job_file(tmp_path, SHAPED, name="numbers.py")
    monkeypatch.chdir(tmp_path)
    with anyio.fail_after(60):
        built = await Outlines().build(signed(path))
    assert isinstance(built, OutlinedTopology), built
    assert list(built.nodes) == ["numbers", "key", "total", "per10", "out", "windows"]


async def test_a_build_past_its_time_limit_is_killed_and_fails_the_job(tmp_path: Path) -> None:
    """A build_topology that sleeps beyond the limit: the reason says so, well before the sleep would end."""
    path = job_file(tmp_path, "import time\n\ndef build_topology():\n    time.sleep(60)\n")
    outlines = Outlines(build_seconds=1.0)
    began = time.monotonic()
    with anyio.fail_after(30):
        reason = await outlines.build(signed(path))
    assert reason == "cannot load the job: building its topology took longer than 1 s (killed)"
    assert time.monotonic() - began < 30


async def test_a_failing_build_gives_its_error_as_the_reason(tmp_path: Path) -> None:
    """An exception in build_topology reaches the master as one line."""
    path = job_file(tmp_path, "def build_topology():\n    raise ValueError('no shape today')\n")
    with anyio.fail_after(60):
        reason = await Outlines().build(signed(path))
    assert reason == "cannot load the job: ValueError: no shape today"


async def test_simulated_targets_are_built_in_this_process() -> None:
    """A target registered in this process (the simulated cluster's) cannot be loaded elsewhere: built here."""
    from streamlet.backends.cluster.simulated import targets as simulated_targets

    def small() -> sl.Topology:
        topology = sl.Topology("small")
        topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", [1]))
        return topology

    reference = simulated_targets.register(small)
    try:
        built = await Outlines().build(dict(sign(job_commands.new_spec(reference, {}, None), SECRET)))
    finally:
        simulated_targets.forget(reference)
    assert isinstance(built, OutlinedTopology)
    assert sorted(built.nodes) == ["in", "out"]
