"""The suite's own guards, each tried on a pytest run of its own: the reaper (``tests/support/reaper.py``) kills
every process an aborted run started, and the timeouts (``tests/support/timeouts.py``) fail a hung test with its
stacks dumped, the run going on, or end the run when the test ignores its timeout."""

from __future__ import annotations

import contextlib
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.reaper import pidfds

ROOT = Path(__file__).resolve().parents[2]

# Starts what a test run leaves behind when it is cut short, prints the PIDs, waits for the word, then ends
# the run as pytest-timeout's thread method does: os._exit, no teardown, no atexit.
ABORTED = """
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import reaper

# like 'cluster up': a process group of its own (a leader and its child), started by a process that exits
GROUP = '''
import subprocess
leader = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
print(leader.pid, leader.stdout.readline().strip(), flush=True)
'''
SERVER = '''
import subprocess, sys
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--state-dir", sys.argv[1]],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
print(server.pid, flush=True)
'''


def test_aborted(tmp_path):
    leader, member = subprocess.run([sys.executable, "-c", GROUP], capture_output=True, text=True,
                                    check=True).stdout.split()
    reaper.record(int(leader))  # not a child of pytest: recorded by its PID
    state_dir = tmp_path / ".streamlet"
    state_dir.mkdir()
    reaper.record_cluster(state_dir)  # before the processes start, as the cluster fixtures do
    server = subprocess.run([sys.executable, "-c", SERVER, str(state_dir.resolve())], capture_output=True,
                            text=True, check=True).stdout.strip()
    (state_dir / "cluster.json").write_text(json.dumps({"processes": [{"role": "worker", "pid": int(server)}]}))
    child = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # recorded
    print("pids", leader, member, server, child.pid, flush=True)
    sys.stdin.readline()
    os._exit(1)
"""


def read_line(stream: object, prefix: str, seconds: float) -> str:
    """The first line of ``stream`` that starts with ``prefix`` (``seconds``: a safety net)."""
    assert hasattr(stream, "readline")
    while True:
        ready, _, _ = select.select([stream], [], [], seconds)
        assert ready, f"no line starting with {prefix!r} within {seconds} s"
        line = stream.readline()
        assert line, f"the output ended before a line starting with {prefix!r}"
        if line.startswith(prefix):
            return str(line)


def inner_pytest(directory: Path, *options: str) -> list[str]:
    """The command of a pytest run on ``directory`` (its own rootdir, cache and temporary folders), from the
    repository's root so that ``tests.support`` imports."""
    (directory / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    return [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={directory / 'tmp'}",
        f"--rootdir={directory}", *options, str(directory),
    ]  # fmt: skip


def test_every_process_of_a_run_ended_by_os_exit_is_killed_by_the_reaper(tmp_path: Path) -> None:
    """A run records a process group by PID (its leader and the leader's child), a cluster state directory
    whose cluster.json lists a server, and starts a child with Popen, then ends with os._exit(1): the reaper
    kills all four and names them."""
    (tmp_path / "test_aborted.py").write_text(ABORTED)
    inner = subprocess.Popen(
        inner_pytest(tmp_path, "-s", "-q", "-p", "tests.support.reaper"),
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(stop_inner, inner)
        pids = [int(word) for word in read_line(inner.stdout, "pids ", seconds=60).split()[1:]]
        running = cleanup.enter_context(pidfds(pids))
        cleanup.callback(kill_left, running)  # the test's own clean-up, should the reaper have failed
        assert sorted(running) == sorted(pids)  # all four run when the run ends
        assert inner.stdin is not None
        inner.stdin.write("go\n")
        inner.stdin.flush()
        _, err = inner.communicate(timeout=60)  # its stderr closes when its reaper is done
        assert inner.returncode == 1
        gone = [pid for pid, descriptor in running.items() if select.select([descriptor], [], [], 30)[0]]
        assert sorted(gone) == sorted(pids)
        assert "ended without its teardown; killed" in err
        for pid in pids:
            assert f" {pid} (" in err, err


def stop_inner(inner: subprocess.Popen[str]) -> None:
    """The inner pytest, killed by its handle if it still runs, reaped, its pipes closed."""
    if inner.poll() is None:
        inner.kill()
    inner.communicate()


def kill_left(running: dict[int, int]) -> None:
    """SIGKILL, through their pidfds, the processes of ``running`` that are still there."""
    for descriptor in running.values():
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(descriptor, signal.SIGKILL)


HUNG = """
import asyncio
import time

import tests.support.timeouts

tests.support.timeouts.BACKSTOP = 1.0  # this run's backstop: a second after the timeout


def test_hangs_in_the_main_thread():
    time.sleep(30)


def swallowed_while_blocking():
    time.sleep(30)  # a callback blocks the loop: the timeout's exception is swallowed by asyncio


def test_hangs_inside_an_event_loop():
    async def forever():
        asyncio.get_running_loop().call_soon(swallowed_while_blocking)
        await asyncio.Event().wait()

    asyncio.run(forever())


def test_runs_after_them():
    assert True


def test_ignores_its_timeout():
    while True:
        try:
            time.sleep(30)
        except BaseException:
            pass
"""


def test_a_hung_test_fails_with_its_stacks_and_the_run_goes_on_until_one_ignores_its_timeout(
    tmp_path: Path,
) -> None:
    """With a 1 s timeout: a test hung in the main thread and one hung inside an event loop (the exception
    swallowed by asyncio) each fail with the stacks dumped, the next test passes; a test that ignores its
    timeout ends the run through the backstop (every stack dumped, exit 1)."""
    (tmp_path / "test_hung.py").write_text(HUNG)
    options = ("-v", "-p", "tests.support.timeouts", "--timeout=1", "--timeout-method=signal")
    hung = subprocess.run(
        inner_pytest(tmp_path, *options, "-k", "not ignores"), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    output = hung.stdout + hung.stderr
    assert hung.returncode == 1, output
    results = dict(re.findall(r"test_hung\.py::(\w+) (PASSED|FAILED)", hung.stdout))
    assert results == {
        "test_hangs_in_the_main_thread": "FAILED",
        "test_hangs_inside_an_event_loop": "FAILED",
        "test_runs_after_them": "PASSED",
    }, output
    assert "1 passed" in hung.stdout.splitlines()[-1], output  # the run went on to its end
    assert "Failed: Timeout (>1.0s) from pytest-timeout." in output  # the first, hung in time.sleep
    assert "RuntimeError: Event loop stopped before Future completed." in output  # the second
    assert "in swallowed_while_blocking" in output  # where its loop was stuck: the main thread's stack
    ignored = subprocess.run(
        inner_pytest(tmp_path, *options, "-k", "ignores"), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert ignored.returncode == 1, ignored.stdout + ignored.stderr
    assert "passed" not in ignored.stdout  # no summary: the backstop ended the run inside the test
    backstop = ignored.stdout.rsplit("Timeout: the main thread", 1)[1]
    assert "Stack of MainThread" in backstop
    assert "in test_ignores_its_timeout" in backstop.split("Stack of MainThread", 1)[1]
