"""The ``streamlet run path/to/file.py[:name]`` command."""

from __future__ import annotations

import json
import re
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import streamlet as sl
from streamlet.cli import main
from tests.support import run_output
from tests.support.logging_state import restored_logging
from tests.support.run_output import COUNTERS_ZERO, TIMING

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = ROOT / "examples" / "wordcount.py"

TWO_TOPOLOGIES = """
import streamlet as sl

first = sl.Topology("first")
first_in = first.add_source("in", [1, 2, 3])
first.add_sink("out", sl.CollectSink()).set_input(first_in)

second = sl.Topology("second")
numbers = second.add_source("in", [sl.Record("a", 1, 0.0), sl.Record("b", 2, 0.5)])
doubled = second.map("double", lambda r: (r.key, r.value * 2)).set_input(numbers)
second.add_sink("out", sl.CollectSink()).set_input(doubled)


def make():
    topology = sl.Topology("made")
    numbers = topology.add_source("in", [sl.Record(None, n, 0.0) for n in range(10)])
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
    """Forget the modules ``streamlet run`` registers for the files it loads, and its logging setup."""
    modules = set(sys.modules)
    with restored_logging():
        yield
    for name in set(sys.modules) - modules:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").parent in {tmp_path, WORDCOUNT.parent}:
            del sys.modules[name]


def write(tmp_path: Path, name: str, source: str) -> Path:
    """Write ``source`` to ``tmp_path / name`` and return the path."""
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    return path


def invoke(*args: str) -> Result:
    """Run the ``streamlet`` command with ``args``."""
    return CliRunner().invoke(main, list(args))


def section(result: Result, title: str) -> list[str]:
    """The lines of table ``title`` in the command's output."""
    return run_output.section(result.stdout, title)


def rows(result: Result, title: str) -> list[list[str]]:
    """The cells of table ``title``'s rows."""
    return run_output.rows(result.stdout, title)


def node_rows(result: Result, job: str) -> list[list[str]]:
    """The statistics table: node, kind, parallelism, in, out, dead-lettered."""
    return run_output.node_rows(result.stdout, job)


def caption(result: Result, sink: str) -> str:
    """The line right after sink table ``sink``."""
    return run_output.caption(result.stdout, sink)


def test_run_wordcount_example_exits_zero() -> None:
    """`run examples/wordcount.py` succeeds and prints nothing on stderr."""
    result = invoke("run", str(WORDCOUNT))
    assert (result.exit_code, result.stderr) == (0, "")


def test_run_wordcount_ends_with_counters_then_wall_time_and_rate() -> None:
    """The last two lines: the job-wide counters, then the wall time and the rate from the sources."""
    lines = invoke("run", str(WORDCOUNT)).stdout.splitlines()
    assert lines[-2] == COUNTERS_ZERO
    match = TIMING.fullmatch(lines[-1])
    assert match is not None, lines[-1]
    assert match[1] == str(len(WORDCOUNT.with_name("data").joinpath("river.txt").read_text().splitlines()))


def test_run_wordcount_prints_statistics_header() -> None:
    """The statistics table is titled with the job's name and has one column per counter."""
    assert section(invoke("run", str(WORDCOUNT)), "job 'wordcount'")[0].split() == [
        "node", "kind", "parallelism", "in", "out", "dead-lettered",
    ]  # fmt: skip


def test_run_wordcount_prints_records_in_and_out_per_node() -> None:
    """Every node's row has the counts of the same topology run in-process; the sink's out is '-', not 0."""
    expected = sl.run(runpy.run_path(str(WORDCOUNT))["build_topology"]()).statistics.nodes
    result = invoke("run", str(WORDCOUNT))
    assert node_rows(result, "wordcount") == [
        [node.name, node.kind, str(node.parallelism), str(node.records_in),
         "-" if node.kind == "sink" else str(node.records_out), "0"]
        for node in expected.values()
    ]  # fmt: skip
    assert [row[0] for row in node_rows(result, "wordcount")] == ["lines", "split", "count", "totals"]


def test_run_prints_the_whole_report_exactly(tmp_path: Path) -> None:
    """The sink's records with the caption, the statistics, the counters and the timing, line for line."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", f"{path}:second")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert TIMING.fullmatch(lines[-1])
    assert lines[:-1] == [
        "sink 'out'",
        " key   value    ts",
        "─" * 19,
        " a     2       0.0",
        " b     4       0.5",
        "showing 2 of 2 records",
        "",
        "job 'second'",
        " node     kind     parallelism   in   out   dead-lettered",
        "─" * 58,
        " in       source             1    2     2               0",
        " double   task               1    2     2               0",
        " out      sink               1    2     -               0",
        "late 0, dropped 0, dead-lettered 0, discarded 0, restarts 0, checkpoints 0",
    ]


def test_run_named_topology_attribute(tmp_path: Path) -> None:
    """`file.py:second` runs the module-level Topology called second."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", f"{path}:second")
    assert result.exit_code == 0
    assert node_rows(result, "second") == [
        ["in", "source", "1", "2", "2", "0"],
        ["double", "task", "1", "2", "2", "0"],
        ["out", "sink", "1", "2", "-", "0"],
    ]


def test_run_named_function(tmp_path: Path) -> None:
    """`file.py:make` calls the function and runs the Topology it returns."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", f"{path}:make")
    assert result.exit_code == 0
    assert node_rows(result, "made") == [
        ["in", "source", "1", "10", "10", "0"],
        ["evens", "task", "1", "10", "5", "0"],
        ["out", "sink", "1", "5", "-", "0"],
    ]
    assert rows(result, "sink 'out'") == [["None", str(n), "0.0"] for n in (0, 2, 4, 6, 8)]
    assert result.stdout.splitlines()[result.stdout.splitlines().index("sink 'out'") + 8] == "showing 5 of 5 records"


def test_run_single_topology_without_name(tmp_path: Path) -> None:
    """Without a name the file's only module-level Topology is run."""
    path = write(tmp_path, "cli_single.py", TWO_TOPOLOGIES.split("second =")[0])
    result = invoke("run", str(path))
    assert result.exit_code == 0
    assert node_rows(result, "first") == [["in", "source", "1", "3", "3", "0"], ["out", "sink", "1", "3", "-", "0"]]


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


PARAMETERS = """
from __future__ import annotations  # the annotations are strings: Path must still make a Path

from pathlib import Path

import streamlet as sl


def build(count: int, label: str = "n", scale: float = 1.0, verbose: bool = False, tags=None, where: Path = Path(".")):
    topology = sl.Topology("params")
    given = {"count": count, "label": label, "scale": scale, "verbose": verbose, "tags": tags, "where": where}
    records = [sl.Record(name, f"{type(value).__name__} {value!r}", 0.0) for name, value in given.items()]
    source = topology.add_source("given", records)
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    return topology


def build_topology(first, *, second=2):
    topology = sl.Topology("keywords")
    source = topology.add_source("in", [sl.Record("first", first, 0.0), sl.Record("second", second, 0.0)])
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    return topology
"""


def test_params_go_to_the_factory_converted_by_the_documented_rule(tmp_path: Path) -> None:
    """int, float, bool and JSON where they parse, else text; a str parameter keeps its text, a Path gets a Path."""
    path = write(tmp_path, "cli_params.py", PARAMETERS)
    result = invoke(
        "run", f"{path}:build", "--param", "count=1_000", "--param", "label=007", "--param", "scale=2.5",
        "--param", "verbose=true", "--param", 'tags=["a", 1, null]', "--param", "where=data/in.txt",
    )  # fmt: skip
    assert (result.exit_code, result.stderr) == (0, "")
    assert rows(result, "sink 'out'") == [
        ["count", "int 1000", "0.0"], ["label", "str '007'", "0.0"], ["scale", "float 2.5", "0.0"],
        ["verbose", "bool True", "0.0"], ["tags", "list ['a', 1, None]", "0.0"],
        ["where", "PosixPath PosixPath('data/in.txt')", "0.0"],
    ]  # fmt: skip


def test_an_unannotated_param_that_is_no_number_bool_or_json_stays_text(tmp_path: Path) -> None:
    """``first=hello world`` is text; ``second=1e3`` a float; keyword-only parameters are passed too."""
    path = write(tmp_path, "cli_params.py", PARAMETERS)
    result = invoke("run", str(path), "--param", "first=hello world", "--param", "second=1e3", "--json")
    records = json.loads(result.stdout)["sinks"]["out"]["records"]
    assert [(r["key"], r["value"]) for r in records] == [("first", "hello world"), ("second", 1000.0)]


def test_an_unknown_param_names_the_function_and_its_parameters(tmp_path: Path) -> None:
    """A typo is refused before the function runs, in one line that lists what it does take."""
    path = write(tmp_path, "cli_params.py", PARAMETERS)
    result = invoke("run", f"{path}:build", "--param", "count=1", "--param", "cuont=2")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"error: StreamletError: {path}:build(count: int, label: str = 'n', scale: float = 1.0, "
        "verbose: bool = False, tags = None, where: Path = PosixPath('.')) has no parameter 'cuont'\n"
    )


def test_a_missing_required_param_names_the_function_and_its_parameters(tmp_path: Path) -> None:
    """A parameter without a default and without --param is refused in one line, not a TypeError traceback."""
    path = write(tmp_path, "cli_params.py", PARAMETERS)
    result = invoke("run", str(path))
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"error: StreamletError: {path}:build_topology(first, second = 2) needs a value for 'first'\n"
    )


@pytest.mark.parametrize("bad", ["foo", "=1", "two words=1"])
def test_a_param_without_name_equals_value_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    """``--param foo`` (no '='), an empty name or one that is no identifier: exit 2 before anything is loaded."""
    path = write(tmp_path, "cli_params.py", PARAMETERS)
    result = invoke("run", str(path), "--param", bad)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == f"Error: Invalid value for '--param': expected NAME=VALUE, got {bad!r}"


def test_a_param_given_twice_is_a_usage_error(tmp_path: Path) -> None:
    """Two values for one name is a mistake, not a silent last-one-wins."""
    path = write(tmp_path, "cli_params.py", PARAMETERS)
    result = invoke("run", str(path), "--param", "first=1", "--param", "first=2")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == "Error: Invalid value for '--param': first given twice"


def test_a_param_for_a_topology_object_is_an_error(tmp_path: Path) -> None:
    """A Topology object is already built: parameters cannot reach it."""
    path = write(tmp_path, "cli_two_topologies.py", TWO_TOPOLOGIES)
    result = invoke("run", f"{path}:second", "--param", "count=3")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"error: StreamletError: {path}:second is a Topology object, not a function that builds one: "
        "it takes no parameters (given: count)\n"
    )


def test_help_documents_the_param_rule() -> None:
    """``run --help`` says how a VALUE is read."""
    text = " ".join(invoke("run", "--help").stdout.split())
    assert 'a float (2.5), a bool (true, false) or JSON (null, [1, 2], {"a": 1}, "007") where it parses' in text
    assert "a parameter annotated str always gets the text, one annotated Path a Path." in text


BATCHES = """
import streamlet as sl


class BatchSizes(sl.Task):
    def execute(self, inputs, outputs):
        outputs.emit("batch", len(inputs.get()), ts=0.0)


topology = sl.Topology("batches")
numbers = topology.add_source("in", range(10))
sizes = topology.add_task("sizes", BatchSizes).set_input(numbers)
topology.add_sink("seen", sl.CollectSink()).set_input(sizes)
"""


@pytest.mark.parametrize(("options", "sizes"), [((), ["10"]), (("--batch-size", "3"), ["3", "3", "3", "1"])])
def test_batch_size_reaches_the_job(tmp_path: Path, options: tuple[str, ...], sizes: list[str]) -> None:
    """A task that records the size of every batch it gets sees --batch-size (default 1000: one batch)."""
    path = write(tmp_path, "cli_batches.py", BATCHES)
    result = invoke("run", str(path), *options)
    assert [row[1] for row in rows(result, "sink 'seen'")] == sizes


TWELVE = """
import streamlet as sl

topology = sl.Topology("twelve")
numbers = topology.add_source("in", [sl.Record(f"k{n % 4}", n, float(n)) for n in range(12)])
topology.add_sink("all", sl.CollectSink()).set_input(numbers)
odd = topology.filter("keep-odd", lambda r: r.value % 2).set_input(numbers)
topology.add_sink("odd", sl.CollectSink()).set_input(odd)
"""


def test_rows_shows_the_first_n_records_of_each_sink_with_a_caption(tmp_path: Path) -> None:
    """--rows 3: the first three records each sink received, and 'showing 3 of M records' under each."""
    path = write(tmp_path, "cli_twelve.py", TWELVE)
    result = invoke("run", str(path), "--rows", "3")
    assert rows(result, "sink 'all'") == [["k0", "0", "0.0"], ["k1", "1", "1.0"], ["k2", "2", "2.0"]]
    assert caption(result, "all") == "showing 3 of 12 records"
    assert rows(result, "sink 'odd'") == [["k1", "1", "1.0"], ["k3", "3", "3.0"], ["k1", "5", "5.0"]]
    assert caption(result, "odd") == "showing 3 of 6 records"


@pytest.mark.parametrize(("count", "expected"), [(None, 10), ("0", 0), ("50", 12)])
def test_rows_default_zero_and_more_than_there_are(tmp_path: Path, count: str | None, expected: int) -> None:
    """Ten rows by default; --rows 0 shows only the caption; more rows than records shows them all."""
    path = write(tmp_path, "cli_twelve.py", TWELVE)
    result = invoke("run", str(path), *(["--rows", count] if count else []))
    assert rows(result, "sink 'all'") == [[f"k{n % 4}", str(n), f"{n}.0"] for n in range(expected)]
    assert caption(result, "all") == f"showing {expected} of 12 records"


def test_sort_orders_by_a_field_descending_with_ties_by_key_value_ts(tmp_path: Path) -> None:
    """--sort -key: k3 first; equal keys in ascending value order."""
    path = write(tmp_path, "cli_twelve.py", TWELVE)
    result = invoke("run", str(path), "--sort", "-key", "--rows", "4")
    assert rows(result, "sink 'all'") == [
        ["k3", "3", "3.0"],
        ["k3", "7", "7.0"],
        ["k3", "11", "11.0"],
        ["k2", "2", "2.0"],
    ]
    assert caption(result, "all") == "showing 4 of 12 records"


def test_json_prints_statistics_and_records(tmp_path: Path) -> None:
    """--json: the same facts as one document; every record without --rows, the first N with it."""
    path = write(tmp_path, "cli_twelve.py", TWELVE)
    result = invoke("run", str(path), "--json", "--rows", "2")
    assert (result.exit_code, result.stderr) == (0, "")
    report = json.loads(result.stdout)
    assert isinstance(report.pop("wall_time"), float)
    assert isinstance(report.pop("records_per_second"), float)
    assert report == {
        "job": "twelve",
        "source_records": 12,
        "resumed_from": None,
        "state_dir": None,
        "nodes": [
            {"name": "in", "kind": "source", "parallelism": 1, "in": 12, "out": 12, "dead_lettered": 0},
            {"name": "all", "kind": "sink", "parallelism": 1, "in": 12, "out": None, "dead_lettered": 0},
            {"name": "keep-odd", "kind": "task", "parallelism": 1, "in": 12, "out": 6, "dead_lettered": 0},
            {"name": "odd", "kind": "sink", "parallelism": 1, "in": 6, "out": None, "dead_lettered": 0},
        ],
        "counters": {"late": 0, "dropped": 0, "dead_lettered": 0, "discarded": 0, "restarts": 0, "checkpoints": 0},
        "sinks": {
            "all": {"total": 12, "records": [
                {"key": "k0", "value": 0, "ts": 0.0, "window": None},
                {"key": "k1", "value": 1, "ts": 1.0, "window": None},
            ]},
            "odd": {"total": 6, "records": [
                {"key": "k1", "value": 1, "ts": 1.0, "window": None},
                {"key": "k3", "value": 3, "ts": 3.0, "window": None},
            ]},
        },
        "dead_letters": [],
    }  # fmt: skip
    assert len(json.loads(invoke("run", str(path), "--json").stdout)["sinks"]["all"]["records"]) == 12


WINDOWED = """
import streamlet as sl

topology = sl.Topology("windowed")
readings = topology.add_source("readings", [sl.Record(f"s{n % 5}", 1, float(n)) for n in range(1000)])
sums = topology.window_reduce("sums", "sum", window=sl.TimeWindow(100, time="event"), parallelism=2)
sums.set_input(readings, partitioning=sl.SAME_KEY)
topology.add_sink("wide", sl.CollectSink(), parallelism=3).set_input(sums)
topology.add_sink("narrow", sl.CollectSink()).set_input(sums, partitioning=sl.SAME_KEY)


def skipping():
    topology = sl.Topology("skipping")
    numbers = topology.add_source("in", [sl.Record(n, n, 0.0) for n in range(6)])
    inverted = topology.map("invert", lambda r: (r.key, 1 / (r.value % 3)), on_error="skip").set_input(numbers)
    topology.add_sink("out", sl.CollectSink(), parallelism=2).set_input(inverted)
    return topology
"""


def test_a_sinks_in_count_is_what_it_received_with_parallel_sinks_after_a_window(tmp_path: Path) -> None:
    """5 sensors x 10 windows = 50 rows reach each sink: 'in' says 50 for the 3-instance sink and the 1-instance one."""
    path = write(tmp_path, "cli_windowed.py", WINDOWED)
    result = invoke("run", f"{path}:topology", "--json", "--sort", "ts")
    report = json.loads(result.stdout)
    assert [(n["name"], n["parallelism"], n["in"], n["out"]) for n in report["nodes"]] == [
        ("readings", 1, 1000, 1000), ("sums", 2, 1000, 50), ("wide", 3, 50, None), ("narrow", 1, 50, None)
    ]  # fmt: skip
    assert {name: sink["total"] for name, sink in report["sinks"].items()} == {"wide": 50, "narrow": 50}
    assert report["sinks"]["wide"]["records"][:2] == [
        {"key": "s0", "value": 20, "ts": 99.999, "window": [0.0, 100.0]},
        {"key": "s1", "value": 20, "ts": 99.999, "window": [0.0, 100.0]},
    ]


def test_a_window_column_shows_where_a_windowed_record_came_from(tmp_path: Path) -> None:
    """Records from a window get a 'window' column: [start, end)."""
    path = write(tmp_path, "cli_windowed.py", WINDOWED)
    result = invoke("run", f"{path}:topology", "--sort", "-ts", "--rows", "2")
    assert section(result, "sink 'narrow'")[0].split() == ["key", "value", "ts", "window"]
    assert rows(result, "sink 'narrow'") == [
        ["s0", "20", "999.999", "[900.0, 1000.0)"],
        ["s1", "20", "999.999", "[900.0, 1000.0)"],
    ]


def test_dead_letters_are_listed_and_counted_per_task(tmp_path: Path) -> None:
    """A skip task's failures: a dead-letters table (task, instance, key, error) and the task's dead-lettered count."""
    path = write(tmp_path, "cli_windowed.py", WINDOWED)
    result = invoke("run", f"{path}:skipping")
    assert result.exit_code == 0
    assert rows(result, "dead letters") == [
        ["invert", "0", "0", "ZeroDivisionError: division by zero"],
        ["invert", "0", "3", "ZeroDivisionError: division by zero"],
    ]
    assert node_rows(result, "skipping") == [
        ["in", "source", "1", "6", "6", "0"],
        ["invert", "task", "1", "6", "4", "2"],
        ["out", "sink", "2", "4", "-", "0"],
    ]
    assert result.stdout.splitlines()[-2] == (
        "late 0, dropped 0, dead-lettered 2, discarded 0, restarts 0, checkpoints 0"
    )


def test_plain_output_has_no_escape_codes_even_when_colour_is_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a terminal: no colour codes although FORCE_COLOR asks for them, and lines are not padded."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "30")
    path = write(tmp_path, "cli_twelve.py", TWELVE)
    stdout = invoke("run", str(path)).stdout
    assert "\x1b" not in stdout
    assert all(line == line.rstrip() for line in stdout.splitlines())
    assert COUNTERS_ZERO in stdout.splitlines()


RESUMABLE = '''
from pathlib import Path

import anyio

import streamlet as sl

NUMBERS, HALF = 20, 10
MARKER = Path(__file__).with_name("crash-once")


class Halves(sl.Source):
    """(n % 3, n) for n in 0..19; on a fresh start the second half waits until a checkpoint holds the first."""

    def open(self, context):
        return HalvesReader()


class HalvesReader(sl.SourceReader):
    def __init__(self):
        self.done = 0
        self.first_half_saved = anyio.Event()

    async def read(self, max_records):
        if self.done == HALF:
            with anyio.fail_after(30):  # without checkpoints nothing would release it: fail, do not hang
                await self.first_half_saved.wait()  # a checkpoint's barrier interrupts the wait and goes out
        if self.done == NUMBERS:
            return None
        end = min(HALF if self.done < HALF else NUMBERS, self.done + max_records)
        batch = [sl.Record(n % 3, n, 0.0) for n in range(self.done, end)]
        self.done = end
        return batch

    def position(self):
        return self.done

    async def seek(self, position):
        self.done = position
        if position >= HALF:
            self.first_half_saved.set()

    def checkpoint_complete(self, epoch, position):
        if position >= HALF:
            self.first_half_saved.set()


def crash_once(record):
    if record.value >= HALF and MARKER.exists():
        MARKER.unlink()
        raise RuntimeError("crash once")
    return record.key, record.value


class Sum(sl.Task):
    def execute(self, inputs, outputs):
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)

    def finish(self, outputs):
        for key, total in self.state.items():
            outputs.emit(key, total, ts=0.0)


topology = sl.Topology("resumable")
numbers = topology.add_source("numbers", Halves())
checked = topology.map("crash-once", crash_once).set_input(numbers)
sums = topology.add_task("sum", Sum).set_input(checked)
topology.add_sink("sums", sl.CollectSink()).set_input(sums)
'''

SUMS = [
    ["0", str(sum(range(0, 20, 3))), "0.0"],
    ["1", str(sum(range(1, 20, 3))), "0.0"],
    ["2", str(sum(range(2, 20, 3))), "0.0"],
]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_state_dir_resumes_a_job_that_failed_midway_with_nothing_lost_or_counted_twice(
    tmp_path: Path, backend: str
) -> None:
    """The first run crashes on the second half, after a checkpoint holds the first; the rerun with the same
    --state-dir says it resumes, reads only the second half and prints the exact sums of all twenty numbers. The
    same with the sums' state in RocksDB (under the state dir: gone once each run ended)."""
    path = write(tmp_path, "cli_resumable.py", RESUMABLE)
    (tmp_path / "crash-once").touch()
    state = tmp_path / "state"
    options = ("--state-dir", str(state), "--checkpoint-interval", "0.01", "--sort", "key", "--state-backend", backend)

    crashed = invoke("run", str(path), *options)
    assert (crashed.exit_code, crashed.stdout) == (1, "")
    assert crashed.stderr == (
        "error: TaskError: task 'crash-once' instance 0 failed on record with key 1: RuntimeError: crash once\n"
    )

    resumed = invoke("run", str(path), *options)
    assert (resumed.exit_code, resumed.stderr) == (0, "")
    assert re.fullmatch(
        rf"resumed job 'resumable' from checkpoint \d+ in {re.escape(str(state))}", resumed.stdout.splitlines()[0]
    )
    assert rows(resumed, "sink 'sums'") == SUMS
    assert node_rows(resumed, "resumable") == [
        ["numbers", "source", "1", "10", "10", "0"], ["crash-once", "task", "1", "10", "10", "0"],
        ["sum", "task", "1", "10", "3", "0"], ["sums", "sink", "1", "3", "-", "0"],
    ]  # fmt: skip
    assert not any((state / "rocksdb").rglob("CURRENT"))  # the working copies closed and removed


def test_state_dir_of_a_finished_job_starts_afresh(tmp_path: Path) -> None:
    """A job that finished leaves a final checkpoint; the next run with that --state-dir reads everything again."""
    path = write(tmp_path, "cli_resumable.py", RESUMABLE)
    state = tmp_path / "state"
    for _ in range(2):
        result = invoke("run", str(path), "--state-dir", str(state), "--checkpoint-interval", "0.01", "--json")
        report = json.loads(result.stdout)
        assert (report["resumed_from"], report["state_dir"], report["source_records"]) == (None, str(state), 20)
        assert report["counters"]["checkpoints"] >= 2  # the one that released the second half, and the final one
        assert sorted((r["key"], r["value"]) for r in report["sinks"]["sums"]["records"]) == [
            (int(key), int(total)) for key, total, _ in SUMS
        ]


def test_state_dir_of_another_job_is_refused(tmp_path: Path) -> None:
    """Checkpoints of one job never seed another: one job per --state-dir."""
    resumable = write(tmp_path, "cli_resumable.py", RESUMABLE)
    twelve = write(tmp_path, "cli_twelve.py", TWELVE)
    state = tmp_path / "state"
    assert invoke("run", str(resumable), "--state-dir", str(state), "--checkpoint-interval", "0.01").exit_code == 0
    result = invoke("run", str(twelve), "--state-dir", str(state))
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"error: StreamletError: {state} holds checkpoints of job 'resumable', not 'twelve': "
        "give each job its own --state-dir\n"
    )


def test_checkpoint_interval_without_state_dir_is_a_usage_error(tmp_path: Path) -> None:
    """Checkpoints need somewhere to go."""
    path = write(tmp_path, "cli_twelve.py", TWELVE)
    result = invoke("run", str(path), "--checkpoint-interval", "1")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == "Error: --checkpoint-interval needs --state-dir (where the checkpoints go)"


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


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (
            ["--adapt", "autoscale,shrink"],
            "JobError: no adaptation policy called 'shrink' "
            "(there are ['autoscale', 'balance', 'migrate', 'rebalance', 'shed', 'spread'])",
        ),
        (
            ["--adapt", "autoscale", "--bounds", "count=4"],
            "JobError: autoscale bounds are TASK=LOW:HIGH (e.g. count=1:8), not 'count=4'",
        ),
        (
            ["--adapt", "autoscale", "--bounds", "count=4:2"],
            "JobError: autoscale bounds of task 'count' must be 1 <= low <= high, not 4:2",
        ),
        (["--bounds", "count=1:4"], "StreamletError: --bounds applies to --adapt autoscale"),
    ],
)
def test_submit_with_bad_adaptation_options_is_refused(tmp_path: Path, options: list[str], error: str) -> None:
    """Unknown policies and malformed bounds are refused, naming what is allowed, before anything is contacted."""
    result = invoke("submit", str(WORDCOUNT), *options, "--zk", "127.0.0.1:1", "--state-dir", str(tmp_path))
    assert (result.exit_code, result.stderr.strip()) == (1, f"error: {error}")


def test_kill_without_the_secret_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill needs the secret: from STREAMLET_SECRET or the state dir; without either, a clear error."""
    monkeypatch.delenv("STREAMLET_SECRET", raising=False)
    result = invoke("kill", "wc", "--zk", "127.0.0.1:1", "--state-dir", str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: StreamletError: kill needs the cluster secret: set STREAMLET_SECRET (hex) or run it with the "
        f"--state-dir that 'streamlet cluster up' wrote (looked in {tmp_path})"
    )


def test_the_docs_show_what_streamlet_run_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/getting-started.md's ```console block of `streamlet run` is the command's real output, but for the
    timing numbers."""
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    block = re.search(r"```console\n\$ streamlet run (?P<args>[^\n]*)\n(?P<output>.*?)```", page, re.S)
    assert block is not None
    monkeypatch.chdir(ROOT)
    shown, printed = block["output"].splitlines(), invoke("run", *block["args"].split()).stdout.splitlines()
    assert printed[:-1] == shown[:-1]
    shown_timing, printed_timing = TIMING.fullmatch(shown[-1]), TIMING.fullmatch(printed[-1])
    assert shown_timing is not None
    assert printed_timing is not None
    assert shown_timing[1] == printed_timing[1]


def test_a_secret_that_is_no_hex_is_a_clear_error_that_does_not_show_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """STREAMLET_SECRET=zzzz: a ClusterError saying what the variable must hold (not a bare ValueError from
    fromhex, and not the value, which was meant to be secret)."""
    monkeypatch.setenv("STREAMLET_SECRET", "zzzz")
    result = invoke("kill", "wc", "--zk", "127.0.0.1:1")
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(
        "error: ClusterError: STREAMLET_SECRET must be the cluster secret as hex digits (as 'cluster up' writes it"
    ), result.stderr
    assert result.stderr.strip().endswith("not 4 characters of something else")
    assert "zzzz" not in result.stderr
