"""The ``streamlet run path/to/file.py[:name]`` command."""

from __future__ import annotations

import re
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner, Result

import streamlet as sl
from streamlet.cli import main

WORDCOUNT = Path(__file__).resolve().parents[2] / "examples" / "wordcount.py"

TWO_TOPOLOGIES = """
import streamlet as sl

first = sl.Topology("first")
first_in = first.add_source("in", [1, 2, 3])
first.add_sink("out", sl.CollectSink()).set_input(first_in)

second = sl.Topology("second")
numbers = second.add_source("in", [1, 2])
doubled = second.map("double", lambda r: (r.key, r.value * 2)).set_input(numbers)
second.add_sink("out", sl.CollectSink()).set_input(doubled)


def make():
    topology = sl.Topology("made")
    numbers = topology.add_source("in", range(10))
    evens = topology.filter("evens", lambda r: r.value % 2 == 0).set_input(numbers)
    topology.add_sink("out", sl.CollectSink()).set_input(evens)
    return topology


answer = 42
"""

FAILING_TASK = """
import streamlet as sl


def explode(record):
    raise ValueError("bad value")


topology = sl.Topology("boom")
numbers = topology.add_source("in", [1, 2])
exploded = topology.map("explode", explode).set_input(numbers)
topology.add_sink("out", sl.CollectSink()).set_input(exploded)
"""


@pytest.fixture(autouse=True)
def restore_modules_and_logging(tmp_path: Path) -> Iterator[None]:
    """Forget the modules ``streamlet run`` registers for the files it loads, and its structlog setup."""
    modules, configured, config = set(sys.modules), structlog.is_configured(), structlog.get_config()
    yield
    for name in set(sys.modules) - modules:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").parent in {tmp_path, WORDCOUNT.parent}:
            del sys.modules[name]
    if configured:
        structlog.configure(**config)
    else:
        structlog.reset_defaults()


def write(tmp_path: Path, name: str, source: str) -> Path:
    """Write ``source`` to ``tmp_path / name`` and return the path."""
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    return path


def invoke(*args: str) -> Result:
    """Run the ``streamlet`` command with ``args``."""
    return CliRunner().invoke(main, list(args))


def table(result: Result) -> list[list[str]]:
    """The rows of the summary table (after the header), split into cells."""
    return [line.split() for line in result.stdout.splitlines()[2:]]


def test_run_wordcount_example_exits_zero() -> None:
    """`run examples/wordcount.py` succeeds and prints nothing on stderr."""
    result = invoke("run", str(WORDCOUNT))
    assert (result.exit_code, result.stderr) == (0, "")


def test_run_wordcount_prints_job_name_and_wall_time() -> None:
    """The summary opens with the job's name and its wall time in seconds."""
    result = invoke("run", str(WORDCOUNT))
    assert re.fullmatch(r"job 'wordcount' finished in \d+\.\d{3} s", result.stdout.splitlines()[0])


def test_run_wordcount_prints_table_header() -> None:
    """The header's node column is as wide as the longest node name ('totals')."""
    result = invoke("run", str(WORDCOUNT))
    assert result.stdout.splitlines()[1] == "  node    kind            in         out"


def test_run_wordcount_prints_records_in_and_out_per_node() -> None:
    """Every node's row has the in/out counts of the same topology run in-process."""
    expected = sl.run(runpy.run_path(str(WORDCOUNT))["build_topology"]()).statistics.nodes
    result = invoke("run", str(WORDCOUNT))
    assert table(result) == [
        [node.name, node.kind, str(node.records_in), str(node.records_out)] for node in expected.values()
    ]
    assert [row[0] for row in table(result)] == ["lines", "split", "count", "totals"]


def test_run_named_topology_attribute(tmp_path: Path) -> None:
    """`file.py:second` runs the module-level Topology called second."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", f"{path}:second")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].startswith("job 'second' finished in ")
    assert table(result) == [["in", "source", "2", "2"], ["double", "task", "2", "2"], ["out", "sink", "2", "0"]]


def test_run_named_function(tmp_path: Path) -> None:
    """`file.py:make` calls the function and runs the Topology it returns."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", f"{path}:make")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].startswith("job 'made' finished in ")
    assert table(result) == [["in", "source", "10", "10"], ["evens", "task", "10", "5"], ["out", "sink", "5", "0"]]


def test_run_single_topology_without_name(tmp_path: Path) -> None:
    """Without a name the file's only module-level Topology is run."""
    path = write(tmp_path, "cli_single.py", TWO_TOPOLOGIES.split("second =")[0])
    result = invoke("run", str(path))
    assert result.exit_code == 0
    assert table(result) == [["in", "source", "3", "3"], ["out", "sink", "3", "0"]]


def test_missing_file_is_a_one_line_error(tmp_path: Path) -> None:
    """A path that does not exist exits 1 with one `error:` line and no output."""
    missing = tmp_path / "missing.py"
    result = invoke("run", str(missing))
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"error: StreamletError: no such file: {missing}\n"


def test_failing_task_is_a_one_line_error_naming_the_task(tmp_path: Path) -> None:
    """A task raising exits 1 with exactly one stderr line naming task, instance, key and cause."""
    path = write(tmp_path, "cli_failing.py", FAILING_TASK)
    result = invoke("run", str(path))
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        "error: TaskError: task 'explode' instance 0 failed on record with key None: ValueError: bad value\n"
    )


def test_two_topologies_without_name_is_an_error(tmp_path: Path) -> None:
    """With two module-level topologies and no name, the error asks for one."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", str(path))
    assert (result.exit_code, result.stdout) == (1, "")
    assert (
        result.stderr
        == f"error: StreamletError: {path}: name the topology, as {path}:NAME (2 Topology objects found)\n"
    )


def test_unknown_name_is_an_error(tmp_path: Path) -> None:
    """`file.py:nope` names the file and the missing attribute."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", f"{path}:nope")
    assert (result.exit_code, result.stderr) == (1, f"error: StreamletError: {path} has no attribute 'nope'\n")


def test_name_that_is_not_a_topology_is_an_error(tmp_path: Path) -> None:
    """`file.py:answer` (an int) is neither a Topology nor a function returning one."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", f"{path}:answer")
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: StreamletError: {path}:answer is not a Topology or a function returning one (got int)\n"
    )


def test_cluster_up_with_no_workers_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """--workers 0 is a usage error, and nothing is recorded in the state dir."""
    result = invoke("cluster", "up", "--workers", "0", "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 2
    assert "Invalid value for '--workers': 0 is not in the range x>=1." in result.stderr
    assert not (tmp_path / "state").exists()


def test_cluster_up_with_a_label_for_an_unknown_worker_is_refused(tmp_path: Path) -> None:
    """A label naming a worker that will not exist (a typo) is refused before anything starts."""
    result = invoke("cluster", "up", "--workers", "2", "--label", "worker-5=gpu", "--state-dir", str(tmp_path / "s"))
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: BadParameter: --label worker-5=gpu: no worker called 'worker-5' (workers: worker-0, worker-1)"
    )
    assert not (tmp_path / "s").exists()


def test_submit_with_a_bad_job_name_is_refused(tmp_path: Path) -> None:
    """A job name that cannot name a node or a file is refused before anything is contacted."""
    result = invoke("submit", str(WORDCOUNT), "--job", "a/b", "--zk", "127.0.0.1:1", "--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: JobError: job name 'a/b' is not allowed: use 1-64 letters, digits, '_' or '-', "
        "starting with a letter or digit"
    )


def test_kill_without_the_secret_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill needs the secret: from STREAMLET_SECRET or the state dir; without either, a clear error."""
    monkeypatch.delenv("STREAMLET_SECRET", raising=False)
    result = invoke("kill", "wc", "--zk", "127.0.0.1:1", "--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: StreamletError: kill needs the cluster secret: set STREAMLET_SECRET (hex) or run it with the "
        f"--state-dir that 'streamlet cluster up' wrote (looked in {tmp_path})"
    )
