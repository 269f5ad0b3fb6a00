"""The test run's reaper: a process of its own, started with the pytest session, that kills every process the
run recorded once pytest is gone, however it went (a normal end, an error, pytest-timeout's ``os._exit``, a
SIGKILL).

What it learns, through a pipe from pytest (one line per record):

- every child pytest starts through :class:`subprocess.Popen` (``subprocess.run``, asyncio's subprocesses, a
  ZooKeeper or Spark server, a ``streamlet submit``): the session wraps ``Popen.__init__`` (:func:`start`);
- a process a test learns of otherwise, by PID: :func:`record`;
- a ``cluster up`` state directory, recorded *before* the command runs: :func:`record_cluster`. ``cluster up``
  starts its processes in sessions of their own and exits; its ``cluster.json`` is read once pytest is gone, so
  the processes of a ``cluster up`` that an abort cut short are found too.

When pytest is gone (its pidfd is readable, or the pipe closed), the reaper sends SIGKILL to every recorded
process still running: to its process group when it leads one (``start_new_session``; the group is killed
even when its leader died first), by PID otherwise, and to every process descended from it. Never by name.
Identity is checked before any signal: a PID is only ever signalled through a pidfd opened while its start
time (``/proc/<pid>/stat``) matched the recorded one, and nothing that started before the reaper is touched.

It runs as ``python -I tests/support/reaper.py PARENT_PID`` in a session of its own (a Ctrl-C at the terminal
is for pytest, not for it), reads the records on its stdin and reports what it killed on stderr (only when the
run did not say goodbye, see :func:`stop`). Only the standard library is used: it must start anywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

STATE_FILE = "cluster.json"  # what ``cluster up`` writes in its state directory (local_cluster.STATE_FILE)
KILL_WAIT = 10.0  # seconds the reaper waits for what it killed to be gone before it reports
CLOCK_SLACK = 10  # clock ticks (/proc/uptime and a process's start time are read at 10 ms steps)


# -- /proc --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Proc:
    """What ``/proc/<pid>/stat`` says of a process."""

    pid: int
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: with the PID, the process's identity
    zombie: bool = False  # it has exited; its parent has not reaped it yet


def read_proc(pid: int) -> Proc | None:
    """``pid``'s entry, or ``None`` when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return Proc(pid, int(fields[1]), int(fields[2]), int(fields[19]), fields[0] in ("Z", "X"))


def process_table() -> dict[int, Proc]:
    """Every process running now, by PID."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read_proc(int(entry))) is not None:
            table[proc.pid] = proc
    return table


def now_in_ticks() -> int:
    """The current time on the clock of ``Proc.start``."""
    uptime = float(Path("/proc/uptime").read_text(encoding="ascii").split()[0])
    return int(uptime * os.sysconf("SC_CLK_TCK"))


def command_line(pid: int) -> str:
    """``pid``'s command line, its arguments joined by spaces (empty when unreadable)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def working_directory(pid: int) -> str:
    """``pid``'s current directory (empty when unreadable)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def open_checked(pid: int, start: int) -> int | None:
    """A pidfd for ``pid`` if it is still the process that started at ``start`` (checked after opening: the
    pidfd then pins that very process), else ``None``."""
    try:
        descriptor = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None
    proc = read_proc(pid)
    if proc is None or proc.start != start:
        os.close(descriptor)
        return None
    return descriptor


# -- the reaper process -------------------------------------------------------------------------------------


@dataclass
class Tracked:
    """A recorded process: while it runs, a pidfd on it."""

    proc: Proc
    descriptor: int | None  # None once it exited

    @property
    def leader(self) -> bool:
        """It leads a process group of its own (started in a new session or group)."""
        return self.proc.pgid == self.proc.pid


@dataclass
class Reaper:
    """The reaper's knowledge: recorded processes and cluster state directories, and how to kill them."""

    since: int  # the reaper's own start: nothing older is ever signalled
    protected: set[int]  # itself and the pytest process
    tracked: dict[int, Tracked] = field(default_factory=dict)  # by PID
    clusters: dict[str, int] = field(default_factory=dict)  # state directory -> when it was recorded (ticks)
    goodbye: bool = False  # pytest said its run ended normally

    def take(self, line: str) -> Tracked | None:
        """Act on one record line; the process newly tracked, if any."""
        kind, _, rest = line.strip().partition(" ")
        if kind == "pid":
            pid, start = (int(word) for word in rest.split())
            return self.track(pid, start)
        if kind == "cluster":
            at, _, directory = rest.partition(" ")
            self.clusters.setdefault(directory, int(at))
        elif kind == "bye":
            self.goodbye = True
        return None

    def track(self, pid: int, start: int) -> Tracked | None:
        """Follow ``pid`` (started at ``start``) through a pidfd; ``None`` if it is gone already or known."""
        if pid in self.tracked and self.tracked[pid].proc.start == start:
            return None
        descriptor = open_checked(pid, start)
        proc = read_proc(pid) if descriptor is not None else None
        if descriptor is None or proc is None or proc.start < self.since or pid in self.protected:
            if descriptor is not None:
                os.close(descriptor)
            return None
        self.forget(pid)
        tracked = self.tracked[pid] = Tracked(proc, descriptor)
        return tracked

    def exited(self, pid: int) -> None:
        """A tracked process exited: its pidfd is closed; a group leader stays known (its group may live on)."""
        tracked = self.tracked.get(pid)
        if tracked is None or tracked.descriptor is None:
            return
        os.close(tracked.descriptor)
        tracked.descriptor = None
        if not tracked.leader:
            del self.tracked[pid]

    def forget(self, pid: int) -> None:
        if (tracked := self.tracked.pop(pid, None)) is not None and tracked.descriptor is not None:
            os.close(tracked.descriptor)

    # -- the end -------------------------------------------------------------------------------------------

    def cluster_processes(self, table: dict[int, Proc]) -> list[Proc]:
        """The processes the recorded ``cluster up`` state directories list that are still theirs: started after
        the directory was recorded, and naming it on their command line or running in its parent directory."""
        found = []
        for directory, recorded_at in self.clusters.items():
            state = Path(directory) / STATE_FILE
            try:
                processes = json.loads(state.read_text(encoding="utf-8")).get("processes", [])
            except (OSError, ValueError):
                continue  # never written, or removed by 'cluster down'
            for entry in processes:
                proc = table.get(int(entry.get("pid", 0)))
                if proc is None or proc.start < max(recorded_at - CLOCK_SLACK, self.since):
                    continue
                if directory in command_line(proc.pid) or working_directory(proc.pid) == str(Path(directory).parent):
                    found.append(proc)
        return found

    def targets(self) -> tuple[dict[int, Proc], dict[int, Proc]]:
        """``(groups, processes)`` to kill: process groups by their leader's PID (the leader's entry), and every
        process: the recorded ones still running, the members of their groups and their descendants."""
        table = process_table()
        groups: dict[int, Proc] = {}
        processes: dict[int, Proc] = {}
        for root in [tracked.proc for tracked in self.tracked.values()] + self.cluster_processes(table):
            current = table.get(root.pid)
            if current is not None and current.start == root.start:
                processes[root.pid] = current
                if current.pgid == current.pid:
                    groups[root.pid] = current
            elif root.pgid == root.pid and (current is None or current.pgid != root.pid):
                # its leader is gone, but the group lives on while members remain (their group id cannot be
                # handed to a new process meanwhile), unless a new process took the leader's PID and group
                groups[root.pid] = root
        grown = True
        while grown:  # members of those groups and descendants of those processes, and theirs in turn
            grown = False
            for proc in table.values():
                if proc.pid in processes or proc.start < self.since:
                    continue
                leader = groups.get(proc.pgid)
                if (leader is not None and proc.start >= leader.start) or proc.ppid in processes:
                    processes[proc.pid] = proc
                    if proc.pgid == proc.pid:
                        groups[proc.pid] = proc
                    grown = True
        for pid in [*self.protected, *(pid for pid, proc in processes.items() if proc.zombie)]:
            processes.pop(pid, None)
            groups.pop(pid, None)
        return groups, processes

    def kill_all(self) -> list[str]:
        """SIGKILL every target; wait (``KILL_WAIT`` at most) until they are gone. What was killed, described."""
        groups, processes = self.targets()
        described = {pid: f"{pid} ({command_line(pid)[:120]})" for pid in processes}  # before they go
        for pgid, leader in groups.items():  # first: a member forking now cannot escape
            current = read_proc(pgid)
            if current is not None and current.start != leader.start:
                continue  # the leader's PID belongs to another process now: so does the group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        killed: list[str] = []
        descriptors: list[int] = []
        for proc in processes.values():
            descriptor = open_checked(proc.pid, proc.start)  # a zombie still opens: it was killed all the same
            if descriptor is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(descriptor, signal.SIGKILL)  # a group member is signalled again: harmless
            killed.append(described[proc.pid])
            descriptors.append(descriptor)
        deadline = time.monotonic() + KILL_WAIT
        for descriptor in descriptors:
            select.select([descriptor], [], [], max(0.0, deadline - time.monotonic()))
            os.close(descriptor)
        return killed


def serve(parent: int, records: IO[bytes]) -> None:
    """The reaper's life: follow the records and ``parent``, then kill what is left and say so."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is for pytest
    own = read_proc(os.getpid())
    assert own is not None
    reaper = Reaper(since=own.start, protected={os.getpid(), parent})
    selector = selectors.DefaultSelector()
    os.set_blocking(records.fileno(), False)
    selector.register(records.fileno(), selectors.EVENT_READ, "records")
    try:
        watched: int | None = os.pidfd_open(parent)
    except ProcessLookupError:
        watched = None
    if watched is not None and os.getppid() == parent:
        selector.register(watched, selectors.EVENT_READ, "parent")
        pending = b""
        running = True
        while running:
            for key, _ in selector.select():
                if key.data == "parent":
                    running = False
                elif key.data == "records":
                    chunk = _read_available(records.fileno())
                    if chunk is None:  # the pipe closed: pytest is gone, or exiting after a normal end
                        selector.unregister(key.fd)
                        running = reaper.goodbye  # then wait until it has exited: its atexit may use a server
                        continue
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        tracked = reaper.take(line.decode())
                        if tracked is not None and tracked.descriptor is not None:
                            selector.register(tracked.descriptor, selectors.EVENT_READ, tracked.proc.pid)
                else:
                    selector.unregister(key.fd)
                    reaper.exited(key.data)
        while chunk := _read_available(records.fileno()):  # what pytest wrote just before it went
            pending += chunk
        os.close(watched)
        for line in pending.split(b"\n")[:-1]:
            reaper.take(line.decode())
    killed = reaper.kill_all()
    if killed and not reaper.goodbye:
        print(
            f"tests/support/reaper: the test run ended without its teardown; killed {len(killed)} processes it "
            f"had started: {', '.join(killed)}",
            file=sys.stderr,
            flush=True,
        )


def _read_available(descriptor: int) -> bytes | None:
    """What can be read now (``b""``: nothing yet); ``None`` at the end of the stream."""
    try:
        chunk = os.read(descriptor, 65536)
    except BlockingIOError:
        return b""
    return chunk or None


# -- the pytest side ----------------------------------------------------------------------------------------

_lock = threading.Lock()
_reaper: subprocess.Popen[bytes] | None = None
_channel: IO[bytes] | None = None
_popen_init: Callable[..., None] | None = None
_session: Any = None  # the pytest config of the session that started the reaper


def start() -> None:
    """Start the session's reaper, and record every child that :class:`subprocess.Popen` starts from now on."""
    global _reaper, _channel, _popen_init
    if _reaper is not None:
        return
    _reaper = subprocess.Popen(
        [sys.executable, "-I", str(Path(__file__).resolve()), str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    _channel = _reaper.stdin
    original = _popen_init = subprocess.Popen.__init__

    def recording_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        record(self.pid)

    subprocess.Popen.__init__ = recording_init  # type: ignore[method-assign]


def stop() -> None:
    """A normal end of the run: Popen is itself again, and the reaper, told so, kills what is still running
    (quietly: a session-wide server may be on its way out) once this process has exited."""
    global _popen_init
    if _popen_init is not None:
        subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]
        _popen_init = None
    _send("bye")


def record(pid: int) -> None:
    """Have the reaper kill process ``pid`` (its process group, if it leads one, and its descendants) should
    it still run when pytest is gone. A process that has exited already is ignored."""
    proc = read_proc(pid)
    if proc is not None:
        _send(f"pid {pid} {proc.start}")


def record_cluster(state_dir: Path) -> None:
    """Have the reaper kill the processes that ``cluster up`` records in ``state_dir`` (read when pytest is
    gone): call it before ``cluster up`` runs."""
    _send(f"cluster {now_in_ticks()} {state_dir.resolve()}")


def _send(line: str) -> None:
    with _lock:
        if _channel is None or _channel.closed:
            return
        try:
            _channel.write(f"{line}\n".encode())
            _channel.flush()
        except BrokenPipeError:
            pass  # the reaper is gone: nothing more can be done from here


def pytest_configure(config: Any) -> None:
    """Start the reaper with the session (a plugin hook: ``tests/conftest.py``, or ``-p tests.support.reaper``)."""
    global _session
    if _reaper is None:
        start()
        _session = config


def pytest_unconfigure(config: Any) -> None:
    """The session ended normally: say so to the reaper (only the session that started it: not a pytest run
    inside this process)."""
    if config is _session:
        stop()


@contextlib.contextmanager
def pidfds(pids: Iterable[int]) -> Iterator[dict[int, int]]:
    """Pidfds on ``pids`` (those still running), closed afterwards: for a test to wait on processes it does not
    own."""
    opened: dict[int, int] = {}
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                opened[pid] = os.pidfd_open(pid)
        yield opened
    finally:
        for descriptor in opened.values():
            os.close(descriptor)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.stdin.buffer)
