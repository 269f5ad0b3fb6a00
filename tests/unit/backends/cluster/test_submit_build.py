"""``submit`` builds the topology (to name the job) before writing anything: within a bound, so a build that
never returns is said, not waited on for ever; a build that fails raises its own error."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from streamlet.backends.cluster.client.api import build_within
from streamlet.backends.cluster.client.job_commands import new_spec
from streamlet.errors import BuildFailed, TopologyError

HANGS = """
import threading

def build_topology():
    threading.Event().wait()  # never set: the build never returns
"""

BAD = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("bad")
    topology.add_sink("out", sl.CollectSink())
    return topology
"""

GOOD = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("good")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", [1]))
    return topology
"""


def spec_of(tmp_path: Path, source: str) -> dict[str, object]:
    path = tmp_path / "job.py"
    path.write_text(source, encoding="utf-8")
    return dict(new_spec(str(path), {}, None))


def test_a_build_that_never_returns_is_a_clear_error_within_the_bound(tmp_path: Path) -> None:
    with pytest.raises(BuildFailed, match=r"took longer than 0\.3 s in this client .*; nothing was submitted$"):
        anyio.run(build_within, spec_of(tmp_path, HANGS), 0.3)  # type: ignore[arg-type]


def test_a_build_that_fails_raises_its_own_error_and_one_that_works_gives_the_topology(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"^topology 'bad' has no source$"):
        anyio.run(build_within, spec_of(tmp_path, BAD), 10.0)  # type: ignore[arg-type]
    built = anyio.run(build_within, spec_of(tmp_path, GOOD), 10.0)  # type: ignore[arg-type]
    assert (built.name, sorted(built.nodes)) == ("good", ["in", "out"])
