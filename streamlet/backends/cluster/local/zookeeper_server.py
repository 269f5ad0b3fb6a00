"""A local ZooKeeper server: found on this machine, configured, started and stopped by PID.

``streamlet cluster up`` uses it when no ``--zk`` is given, and the tests use
it for a real ZooKeeper on 127.0.0.1. It looks for, in order: ``ZOOKEEPER_HOME``
(``lib/*.jar`` and the ``zookeeper-*.jar`` beside it), Debian's package
(``/usr/share/java/zookeeper.jar``, whose manifest names its dependencies),
and the ZooKeeper jars shipped in the pyspark wheel (``pyspark/jars``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import structlog

from streamlet.backends.cluster.local.child_process import stop_child
from streamlet.backends.cluster.tree.quorum import four_letter_word
from streamlet.errors import ZooKeeperError

#: ZooKeeper limits the connections of one client *address* (``maxClientCnxns``, 60 by default). Every process of
#: a local cluster, and every other user of this machine, connects from 127.0.0.1: sixty idle sockets opened by
#: anyone would lock the cluster's own masters, workers and commands out. So no per-address limit (0); what
#: bounds the connections is the server's file descriptors (``ulimit -n`` of its JVM), and what keeps a stranger
#: from reading or writing anything is the cluster's ACLs (docs/cluster/security.md).
CONNECTION_LIMIT = "maxClientCnxns=0"

log = structlog.get_logger("streamlet")

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEBIAN_JAR = Path("/usr/share/java/zookeeper.jar")
# Debian's zookeeper.jar (3.8.0) lists netty-handler but not netty-codec and netty-resolver, which Netty's
# SslHandler needs: without them a TLS client port accepts connections and drops every handshake.
DEBIAN_TLS_JARS = (Path("/usr/share/java/netty-codec.jar"), Path("/usr/share/java/netty-resolver.jar"))
INSTALL_HINT = (
    "no ZooKeeper server found: install one (Debian: 'apt-get install -y zookeeper'), "
    "set ZOOKEEPER_HOME to an unpacked ZooKeeper release, or pass --zk HOST:PORT of a running server"
)


def find_classpath() -> str:
    """The Java classpath of an installed ZooKeeper server, or a ``ZooKeeperError`` saying what to install."""
    home = os.environ.get("ZOOKEEPER_HOME")
    if home:
        jars = sorted(Path(home).glob("lib/*.jar")) + sorted(Path(home).glob("zookeeper-*.jar"))
        if jars:
            return os.pathsep.join(map(str, jars))
    if DEBIAN_JAR.exists():  # its manifest's Class-Path names the rest, but not all that TLS needs
        extra = [str(jar) for jar in DEBIAN_TLS_JARS if jar.exists()]
        return os.pathsep.join(["/etc/zookeeper/conf", str(DEBIAN_JAR), *extra])
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin is not None:
        jars_dir = Path(spec.origin).parent / "jars"
        if list(jars_dir.glob("zookeeper-*.jar")):
            return str(jars_dir / "*")
    raise ZooKeeperError(INSTALL_HINT)


def find_java() -> str:
    """The ``java`` to run ZooKeeper with (``JAVA_HOME`` first)."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise ZooKeeperError("ZooKeeper needs Java: install a JRE (Debian: 'apt-get install -y default-jre')")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class ZooKeeperServer:
    """A standalone ZooKeeper on 127.0.0.1, for ``cluster up`` and tests.

    Example:
        >>> with ZooKeeperServer(data_dir=Path("/tmp/zk")) as zk:   # doctest: +SKIP
        ...     print(zk.address)
        127.0.0.1:43121
    """

    data_dir: Path
    port: int = 0
    tick_ms: int = 500  # sessions may then be as short as 2 ticks: fast failure detection in tests
    start_timeout: float = 30.0
    die_with_parent: bool = False  # tests: the server ends when the process that started it dies (Linux)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``host:port`` for clients."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> ZooKeeperServer:
        """Write the configuration, start the server and wait until it answers ``imok``."""
        self.launch()
        self.wait_until_ready()
        return self

    def launch(self) -> int:
        """Write the configuration and start the server process; its PID (it may not answer yet).

        Separate from :meth:`wait_until_ready` so a caller can record the PID first: a caller killed
        while the server starts must still leave something that can stop it.
        """
        classpath, java = find_classpath(), find_java()
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text(self._config(), encoding="utf-8")
        log = open(self.data_dir / "zookeeper.log", "ab")  # noqa: SIM115 - the child process writes to it
        with log:
            command = [
                java,
                "-Xmx256m",
                "-cp",
                classpath,
                f"-Dzookeeper.log.dir={self.data_dir}",
                MAIN_CLASS,
                str(config),
            ]
            if self.die_with_parent:
                command = _dying_with_parent(command)
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self.process.pid

    def _config(self) -> str:
        return "\n".join(
            [
                f"tickTime={self.tick_ms}",
                f"dataDir={self.data_dir / 'data'}",
                f"clientPort={self.port}",
                "clientPortAddress=127.0.0.1",
                "admin.enableServer=false",
                "4lw.commands.whitelist=ruok,srvr,stat,mntr",
                CONNECTION_LIMIT,
                f"minSessionTimeout={2 * self.tick_ms}",
                "maxSessionTimeout=60000",
                "",
            ]
        )

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise ZooKeeperError(
                    f"ZooKeeper exited with {self.process.returncode}; see {self.data_dir}/zookeeper.log"
                )
            try:
                # 'imok' comes a moment before the server serves; 'srvr' names its mode once it does
                if four_letter_word("127.0.0.1", self.port) == "imok" and "Mode:" in four_letter_word(
                    "127.0.0.1", self.port, "srvr"
                ):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ZooKeeperError(f"ZooKeeper did not answer 'ruok' within {self.start_timeout} s")

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL after 10 s)."""
        process, self.process = self.process, None
        if process is not None:
            stop_child(process)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def _dying_with_parent(command: list[str]) -> list[str]:
    """``command`` run so that Linux sends it SIGTERM when its parent dies (util-linux ``setpriv``).

    Not ``preexec_fn``: that is unsafe in a process with threads, as a test session has.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        log.warning("setpriv not found: the ZooKeeper server will not end with the process that started it")
        return command
    return [setpriv, "--pdeathsig", "TERM", *command]
