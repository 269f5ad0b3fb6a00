"""``sl.run(topology, processes=N)`` in real worker processes: the same results as one process, the same
errors, and no process left behind. Each run forks, so the tests are few and each checks a whole job."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import streamlet as sl
from streamlet.backends.processes import parent, wire
from streamlet.backends.processes.parent import _Child, _reap
from streamlet.backends.processes.results import PartReport
from streamlet.cli import main
from streamlet.core.state.store import DirectoryCheckpointStore
from tests.support import exactly_once
from tests.support.exactly_once import Bomb, expected_output
from tests.support.logging_state import restored_logging
from tests.support.run_output import TIMING

# Python 3.12+ warns when a process with threads forks (pytest-timeout keeps a timer thread); the children
# take no lock another thread may hold, and end with os._exit.
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")

LINE = "to be or not to be that is the question whether tis nobler in the mind to suffer"
WORDS = LINE.split(" ")


def keyed_count() -> sl.Topology:
    """A running count per word (reduce, SAME_KEY, parallelism 3) into a sink, and the same words keyed by
    word into a sink of parallelism 3 (one sender each, so each instance's order is fixed)."""
    topology = sl.Topology("keyed-count")
    words = topology.add_source("words", [sl.Record(w, 1, float(i)) for i, w in enumerate(WORDS * 40)])
    counts = topology.reduce("count", lambda total, one: total + one, parallelism=3)
    counts.set_input(words, partitioning=sl.SAME_KEY)
    topology.add_sink("counts", sl.CollectSink()).set_input(counts)
    topology.add_sink("by-word", sl.CollectSink(), parallelism=3).set_input(words, partitioning=sl.SAME_KEY)
    return topology


def chain() -> sl.Topology:
    """map -> filter -> flat_map, parallelism 2 each, with a record skipped into the dead letters."""

    def halve(record: sl.Record) -> tuple[Any, Any]:
        if record.value == 13:
            raise ValueError("13 is unlucky")
        return record.value % 5, record.value / 2

    topology = sl.Topology("chain")
    numbers = topology.add_source("numbers", [sl.Record(None, n, n * 0.5) for n in range(3000)])
    halves = topology.map("halve", halve, parallelism=2, on_error="skip").set_input(numbers)
    kept = topology.filter("whole", lambda r: r.value == int(r.value), parallelism=2).set_input(halves)
    spread = topology.flat_map("spread", lambda r: [(r.key, r.value), (r.key, -r.value)], parallelism=2)
    topology.add_sink("out", sl.CollectSink()).set_input(spread.set_input(kept))
    return topology


def windowed_count() -> sl.Topology:
    """Event-time tumbling windows of 10 s, counted per key (parallelism 2), with a late port."""
    topology = sl.Topology("windows")
    stamped = [sl.Record(f"k{n % 4}", 1, float(n % 97 if n % 50 else n // 3)) for n in range(2000)]
    events = topology.add_source("events", stamped, watermarks=sl.Watermarks(out_of_orderness=30))
    counts = topology.window_reduce("count", "count", window=sl.TimeWindow(10, time="event"), parallelism=2)
    counts.set_input(events, partitioning=sl.SAME_KEY)
    topology.add_sink("counts", sl.CollectSink()).set_input(counts)
    topology.add_sink("late", sl.CollectSink()).set_input(counts, out_port=sl.LATE)
    return topology


class Totals(sl.Task):
    """A user task: keyed sums in its state, emitted when the input ends."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)

    def finish(self, outputs: sl.Outputs) -> None:
        for key, total in self.state.items():
            outputs.emit(key, total)


def user_task() -> sl.Topology:
    """A user Task with keyed state (parallelism 3) behind a tuple-keyed map."""
    topology = sl.Topology("user-task")
    numbers = topology.add_source("numbers", [sl.Record(None, n, 1.0) for n in range(5000)])
    keyed = topology.map("key", lambda r: ((r.value % 7, "seven"), r.value), parallelism=2).set_input(numbers)
    totals = topology.add_task("totals", Totals, parallelism=3).set_input(keyed, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(totals)
    return topology


def loop() -> sl.Topology:
    """A loop across processes (its members have parallelism 2): each value goes round three times."""
    topology = sl.Topology("loop")
    numbers = topology.add_source("numbers", [sl.Record(n % 11, n, 0.0) for n in range(1000)])
    step = topology.map("step", lambda r: (r.key, r.value + 1), parallelism=2)
    step.set_input(numbers).set_input(step, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(step)
    topology.set_max_iterations(3)
    return topology


def outcome(result: sl.JobResult) -> dict[str, Any]:
    """Everything a run leaves, in an order that does not depend on timing: records sorted per sink."""

    def row(record: sl.Record) -> tuple[str, ...]:
        parts = (type(record), record.key, record.value, record.ts, record.window, record.firing, record.iteration)
        return tuple(map(repr, parts))

    stats = result.statistics
    return {
        "sinks": {name: sorted(map(row, records)) for name, records in result.collected().items()},
        "nodes": {name: (n.kind, n.parallelism, n.records_in, n.records_out) for name, n in stats.nodes.items()},
        "counters": (stats.late, stats.dropped, stats.dead_lettered, stats.discarded, stats.restarts, stats.shed),
        "dead_letters": sorted((d.task, d.instance, row(d.record), d.error) for d in result.dead_letters),
    }


@pytest.mark.parametrize("build", [keyed_count, chain, windowed_count, user_task, loop])
def test_the_same_job_gives_the_same_result_in_two_and_three_processes(build: Callable[[], sl.Topology]) -> None:
    """Records of every sink, counters per node and for the job, dead letters: as in one process."""
    alone = sl.run(build())
    assert sum(map(len, alone.collected().values())) > 0
    for processes in (2, 3):
        assert outcome(sl.run(build(), processes=processes)) == outcome(alone)


def test_a_sink_with_several_instances_gives_its_records_instance_by_instance() -> None:
    """A collecting sink's records come in instance order, each instance's in the order it got them."""
    alone = sl.run(keyed_count()).sink("by-word")
    spread = sl.run(keyed_count(), processes=3).sink("by-word")
    assert [(r.key, r.ts) for r in spread] == [(r.key, r.ts) for r in alone]


def test_processes_left_without_an_instance_take_part_and_end() -> None:
    """Four processes for two instances: two of them run nothing, and the job ends as in one process."""
    topology = sl.Topology("small")
    numbers = topology.add_source("numbers", [sl.Record(n, n, 0.0) for n in range(100)])
    topology.add_sink("out", sl.CollectSink()).set_input(numbers)
    assert outcome(sl.run(topology, processes=4)) == outcome(sl.run(topology))


class RecordsPid(sl.Task):
    """Notes its process's PID in ``config["pids"]``; kills its own process (SIGKILL) on ``config["kill"]``,
    raises on ``config["fail"]``."""

    def prepare(self, config: dict[str, Any]) -> None:
        self.config = config
        Path(config["pids"], str(os.getpid())).touch()

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            if record.value == self.config.get("kill"):
                os.kill(os.getpid(), signal.SIGKILL)
            if record.value == self.config.get("fail"):
                raise ValueError(f"no {record.value}, please")
            outputs.emit(record.key, record.value)


def pid_noting(pids: Path, **config: Any) -> sl.Topology:
    topology = sl.Topology("noting")
    numbers = topology.add_source("numbers", [sl.Record(n % 3, n, 0.0) for n in range(2000)])
    work = topology.add_task("work", RecordsPid, parallelism=2, config={"pids": str(pids), **config})
    topology.add_sink("out", sl.CollectSink()).set_input(work.set_input(numbers))
    return topology


def gone(pids: Path) -> list[bool]:
    """For every PID noted in ``pids``: the process no longer exists (ended and reaped)."""
    found = []
    for noted in sorted(pids.iterdir()):
        try:
            os.kill(int(noted.name), 0)
        except ProcessLookupError:
            found.append(True)
        else:
            found.append(False)
    return found


def test_a_task_failure_is_the_error_of_one_process_and_every_worker_process_is_gone(tmp_path: Path) -> None:
    """The TaskError of a child: same type, message and cause as in one process; both children reaped."""
    (tmp_path / "alone").mkdir()
    (tmp_path / "spread").mkdir()
    with pytest.raises(sl.TaskError) as alone:
        sl.run(pid_noting(tmp_path / "alone", fail=1001))
    with pytest.raises(sl.TaskError) as spread:
        sl.run(pid_noting(tmp_path / "spread", fail=1001), processes=2)
    assert str(spread.value) == str(alone.value)
    assert (spread.value.task, spread.value.instance, spread.value.key) == ("work", alone.value.instance, 2)
    assert repr(spread.value.__cause__) == repr(alone.value.__cause__) == "ValueError('no 1001, please')"
    assert gone(tmp_path / "spread") == [True, True]
    assert str(os.getpid()) not in os.listdir(tmp_path / "spread")


def test_a_killed_worker_process_fails_the_run_and_the_other_is_stopped(tmp_path: Path) -> None:
    """SIGKILL in a child: a JobError saying which process ended and how; the other child is gone too."""
    with pytest.raises(sl.JobError) as failed:
        sl.run(pid_noting(tmp_path, kill=1001), processes=2)
    message = r"^worker process [12] of 2 \(pid (\d+)\) of job 'noting' ended before its part of the job did: "
    match = re.match(message + r"killed by signal 9 \(SIGKILL\)$", str(failed.value))
    assert match is not None, str(failed.value)
    assert match.group(1) in os.listdir(tmp_path)
    assert gone(tmp_path) == [True, True]


def written(output: Path) -> list[tuple[str, int]]:
    return sorted((record.key, record.value) for record in sl.read_file_sink(output))


def test_a_crash_after_checkpoints_resumes_exactly_once_in_two_processes(tmp_path: Path, armed_bomb: Path) -> None:
    """Checkpoints of two processes, a task raising after two of them, a rerun: each count in the FileSink once."""
    output = tmp_path / "out"
    with pytest.raises(sl.TaskError, match=r"^task 'bomb' instance 0 failed on a batch of 10 records"):
        run_exactly_once(armed_bomb, output, processes=2)
    Bomb.armed = False  # it disarmed itself in the worker process only
    committed_before_restart = len(sl.read_file_sink(output))
    assert 0 < committed_before_restart < len(expected_output())
    result = run_exactly_once(armed_bomb, output, processes=2)
    assert written(output) == expected_output()
    assert result.statistics.nodes["in"].records_out < exactly_once.RECORDS  # it resumed, not restarted
    assert result.statistics.checkpoints >= 1


def test_checkpoints_of_two_processes_are_those_of_one(tmp_path: Path) -> None:
    """The parent writes one document per checkpoint, as a job in one process does: the final ones are equal
    but for the run that took them, so either resumes from the other's."""
    finals = []
    for processes in (1, 2):
        run_exactly_once(tmp_path / f"checkpoints-{processes}", tmp_path / f"out-{processes}", processes=processes)
        assert written(tmp_path / f"out-{processes}") == expected_output()
        finals.append(DirectoryCheckpointStore(tmp_path / f"checkpoints-{processes}").latest())
    (_, alone), (_, spread) = finals
    assert spread["finished"] is True
    assert {**spread, "epoch": 0, "attempt": ""} == {**alone, "epoch": 0, "attempt": ""}


def run_exactly_once(checkpoints: Path, output: Path, processes: int) -> sl.JobResult:
    topology = exactly_once.build(output)
    return sl.run(topology, checkpoint_dir=checkpoints, checkpoint_interval=0.02, batch_size=10, processes=processes)


WORDCOUNT_FILE = """
import streamlet as sl

topology = sl.Topology("cli-words")
lines = topology.add_source("lines", [sl.Record(None, line, 0.0) for line in {lines!r}])
words = topology.flat_map("split", lambda r: [(w, 1) for w in r.value.split()], parallelism=2).set_input(lines)
count = topology.reduce("count", lambda a, b: a + b, parallelism=2, emit="record")
count.set_input(words, partitioning=sl.SAME_KEY)
topology.add_sink("totals", sl.CollectSink()).set_input(count)
"""


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Run ``streamlet run`` on a wordcount file in this process; its output without the timing line."""
    path = tmp_path / "words.py"
    path.write_text(WORDCOUNT_FILE.format(lines=[" ".join(WORDS[i:]) for i in range(len(WORDS))]), encoding="utf-8")
    modules = set(sys.modules)

    def run(*options: str) -> str:
        outcome = CliRunner().invoke(main, ["run", str(path), "--sort", "key", "--rows", "500", *options])
        assert outcome.exit_code == 0, outcome.output
        timing = TIMING.search(outcome.output)
        assert timing is not None, outcome.output
        return outcome.output.replace(timing.group(0), "")

    with restored_logging():
        yield run
    for name in set(sys.modules) - modules:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == tmp_path:
            del sys.modules[name]


def test_streamlet_run_with_two_processes_prints_what_one_process_prints(cli: Callable[..., str]) -> None:
    """`streamlet run --processes 2`: the same records and counters as without (the timing line aside)."""
    alone = cli()
    assert "showing 171 of 171 records" in alone
    assert cli("--processes", "2") == alone


def test_a_record_over_the_control_message_cap_fails_the_run_with_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collected record too big for one control message: the worker reports ``failed`` with the cause (it
    does not exit 1 with the cause lost), and the parent raises it."""
    monkeypatch.setattr(wire, "MAX_MESSAGE", 4096)  # the children, forked, inherit it
    topology = sl.Topology("big")
    words = topology.add_source("words", [("k", "x" * 10_000)])
    topology.add_sink("out", sl.CollectSink()).set_input(words)
    with pytest.raises(sl.JobError, match=r"^a 'records' message of \d+ bytes is over the limit of 4096"):
        sl.run(topology, processes=2)


def spawned(code: str) -> tuple[subprocess.Popen[bytes], _Child]:
    """A child process running ``code`` that has closed its control socket (``ended``), not reaped yet."""
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    ours, theirs = socket.socketpair()
    theirs.close()
    return process, _Child(0, process.pid, ours, PartReport("worker process 1 of 1"), ended=True)


def test_reap_kills_a_process_that_closed_its_socket_but_does_not_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed control socket is not an exit: past STOP_TIMEOUT the process is killed, then reaped."""
    monkeypatch.setattr(parent, "STOP_TIMEOUT", 0.0)
    process, child = spawned("import sys; sys.stdin.read()")  # runs until its stdin closes
    try:
        _reap([child])
        assert child.status is not None
        assert os.WIFSIGNALED(child.status)
        assert os.WTERMSIG(child.status) == signal.SIGKILL
        assert child.sock.fileno() == -1
    finally:
        process.kill()
        process.communicate()


def test_reap_waits_for_a_process_that_exits_and_skips_one_reaped_elsewhere() -> None:
    """One exiting by itself is reaped with its exit code; one reaped already (by _exit_status's thread) is
    left as it is, not a ChildProcessError."""
    exiting, first = spawned("import sys; sys.stdin.read(); sys.exit(3)")
    reaped, second = spawned("pass")
    os.waitpid(reaped.pid, 0)
    exiting.stdin.close()  # type: ignore[union-attr]
    _reap([second, first])
    assert (second.status, first.status is not None) == (None, True)
    assert os.waitstatus_to_exitcode(first.status or 0) == 3
    assert (first.sock.fileno(), second.sock.fileno()) == (-1, -1)
    for process in (exiting, reaped):
        process.communicate()  # closes its stdin; already reaped: Popen takes that as ended
