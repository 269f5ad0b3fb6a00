"""A throwaway PostgreSQL server for tests, the docs and the benchmarks: ``initdb`` into a fresh folder, one
server on a free port of 127.0.0.1 (and a Unix socket in that folder), stopped by its PID.

PostgreSQL refuses to run as root, and the test machines run as root: there the server runs as the
``postgres`` system user Debian's package creates (``setpriv``, which also makes it end with the process
that started it), in a folder under ``/tmp`` that user owns (pytest's temporary folders sit under a 0700
folder it cannot traverse). The folder's name is short: a Unix socket path is limited to 107 bytes.

Example:
    >>> with PostgresServer() as server:  # doctest: +SKIP
    ...     print(server.dsn("postgres"))
    postgresql://postgres@127.0.0.1:41234/postgres
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

INSTALL_HINT = "PostgreSQL is not installed: 'apt-get install -y postgresql' (or set POSTGRES_BIN to its bin folder)"
SYSTEM_USER = "postgres"


def find_bin() -> Path:
    """The folder of ``initdb`` and ``postgres``: ``POSTGRES_BIN``, else the newest of Debian's versions."""
    configured = os.environ.get("POSTGRES_BIN")
    if configured:
        return Path(configured)
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda path: int(path.parts[-3]))
    if not versions:
        raise RuntimeError(INSTALL_HINT)
    return versions[-1].parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PostgresServer:
    """One PostgreSQL server in a folder of its own; superuser ``postgres``, trusted local connections."""

    def __init__(self, start_timeout: float = 60.0) -> None:
        self.start_timeout = start_timeout
        self.port = 0
        self.folder: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def dsn(self, database: str = "postgres") -> str:
        """A DSN for ``database`` as the superuser, over TCP."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def socket_dir(self) -> Path:
        """Where the server's Unix socket is."""
        assert self.folder is not None
        return self.folder

    def start(self) -> PostgresServer:
        """``initdb``, start the server and wait until it accepts connections."""
        binaries = find_bin()
        self.folder = Path(tempfile.mkdtemp(prefix="slpg-", dir="/tmp"))
        data = self.folder / "data"
        as_user = self._as_system_user()
        if as_user:
            account = pwd.getpwnam(SYSTEM_USER)
            os.chown(self.folder, account.pw_uid, account.pw_gid)
        init = [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        subprocess.run([*as_user, *init, "--no-sync", "--no-instructions"], check=True, capture_output=True)
        self.port = _free_port()
        self._launch()
        return self

    def _launch(self) -> None:
        """Start the server on the initialised folder and port; wait until it accepts connections."""
        assert self.folder is not None
        data = self.folder / "data"
        server = [str(find_bin() / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.folder)]
        settings = ["listen_addresses=127.0.0.1", "fsync=off", "synchronous_commit=off", "max_connections=200"]
        options = [part for setting in settings for part in ("-c", setting)]
        with open(self.folder / "server.log", "ab") as log:
            command = [*self._as_system_user(), *server, *options]
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_until_ready(data)

    def crash(self) -> None:
        """Stop the server as a crash would (SIGQUIT to the postmaster's PID, from ``postmaster.pid``: an
        immediate shutdown, every client cut off, WAL replayed at the next start), keeping its data; wait
        until it is gone."""
        process = self.process
        assert process is not None
        assert self.folder is not None
        pid_file = self.folder / "data" / "postmaster.pid"
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGQUIT)
        process.wait(timeout=30)  # the postmaster itself, or the runuser around it, which ends with it
        # a stale file saying "ready" would let the next start return before that server is ready
        pid_file.unlink(missing_ok=True)

    def start_again(self) -> None:
        """Start the server again after :meth:`crash`, on the same folder and port (it recovers first). As
        root the server ends with the thread that starts it (``--pdeathsig``): call this from a thread that
        outlives it."""
        self._launch()

    def _as_system_user(self) -> list[str]:
        """The prefix that runs a command as ``postgres`` and ends it with this process (root only)."""
        if os.geteuid() != 0:
            return []
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            return ["runuser", "-u", SYSTEM_USER, "--"]
        return [setpriv, "--reuid", SYSTEM_USER, "--regid", SYSTEM_USER, "--clear-groups", "--pdeathsig", "INT"]

    def _wait_until_ready(self, data: Path) -> None:
        """Until ``postmaster.pid`` says ``ready`` (its 8th line) and the socket answers."""
        deadline = time.monotonic() + self.start_timeout
        pid_file = data / "postmaster.pid"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"PostgreSQL exited with {self.process.returncode}; see {self.folder}/server.log")
            lines = pid_file.read_text().splitlines() if pid_file.exists() else []
            if len(lines) >= 8 and lines[7].strip() == "ready":
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"PostgreSQL did not start within {self.start_timeout:g} s; see {self.folder}/server.log")

    def stop(self) -> None:
        """Fast shutdown by PID (SIGINT: clients are disconnected), SIGKILL after 10 s; the folder goes too."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
