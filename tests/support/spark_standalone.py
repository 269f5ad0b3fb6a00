"""A real Spark standalone cluster for tests: one master and one worker from the installed pyspark, on 127.0.0.1.

``StandaloneCluster`` starts ``spark-class org.apache.spark.deploy.master.Master``
and ``spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:PORT``
(``spark-class`` execs ``java``, so each child's PID is its JVM), waits until
the master logs the worker's registration (a thread copies each child's output
to its log file and wakes the waiters on every line: no polling), checks the
master's JSON status (``http://127.0.0.1:UIPORT/json/``) once, and stops both
by PID: SIGTERM, then SIGKILL, then reaped. Everything they write (logs, the
worker's directory with one folder per application and executor, Spark's
scratch space) stays under one directory, and an empty
``SPARK_CONF_DIR`` keeps any ``spark-defaults.conf`` of the machine out.

Run as a script (``python -m tests.support.spark_standalone MASTER OUTPUT EVENTS``)
it is the driver process: Spark allows one ``SparkContext`` per process and a
test session holds a ``local[*]`` one, so the job handing its rows to the
cluster runs apart. It prints one JSON line naming the session's master,
application id and driver host, then stops the session so the master
records the application as finished.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from streamlet.backends.cluster.local.child_process import stop_child

JAVA_17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")  # this machine's Java, when JAVA_HOME is unset
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class StandaloneError(RuntimeError):
    """The standalone cluster could not start, or a condition on it did not come true in time."""


class LogFollower:
    """Copies a child's output, line by line, to its log file, and wakes :meth:`wait_for` on every line."""

    def __init__(self, stream: IO[bytes], path: Path) -> None:
        self._lines: list[str] = []
        self._ended = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._copy, args=(stream, path), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes], path: Path) -> None:
        with stream, open(path, "ab") as log:
            for line in iter(stream.readline, b""):  # blocks until the child writes: the event we wait on
                log.write(line)
                log.flush()
                with self._changed:
                    self._lines.append(line.decode(errors="replace"))
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> str | None:
        """The first line matching ``pattern`` (waiting for it), or ``None`` when the output ends or the
        ``timeout`` (a safety net) passes first."""
        checked = 0

        def seen() -> bool:
            nonlocal checked
            while checked < len(self._lines):
                if pattern.search(self._lines[checked]):
                    return True
                checked += 1
            return self._ended

        with self._changed:
            self._changed.wait_for(seen, timeout)
            return self._lines[checked] if checked < len(self._lines) else None

    def join(self) -> None:
        """Wait until the copy has read the child's last line (call once the child has exited)."""
        self._thread.join(timeout=10)


def spark_home() -> Path:
    """The installed pyspark package directory: a Spark distribution with ``bin/spark-class`` and ``jars/``."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise StandaloneError("pyspark is not installed: pip install 'streamlet[spark]'")  # fail, never skip
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-class").exists():
        raise StandaloneError(f"no bin/spark-class in the pyspark package at {home}")
    return home


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on now (all probed at once: no repeats)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def java_home() -> str | None:
    """``JAVA_HOME``, else this machine's Java 17 when it exists, else ``None`` (``java`` on the PATH)."""
    return os.environ.get("JAVA_HOME") or (str(JAVA_17) if JAVA_17.exists() else None)


@dataclass
class StandaloneCluster:
    """One master and one worker (``cores`` cores, ``memory`` of executor memory) on 127.0.0.1, under ``base``.

    Example:
        >>> with StandaloneCluster(Path("/tmp/spark")) as cluster:  # doctest: +SKIP
        ...     print(cluster.master_url)
        spark://127.0.0.1:40313
    """

    base: Path
    cores: int = 1
    memory: str = "1g"
    start_timeout: float = 60.0  # a safety net: the wait ends as soon as the worker is registered
    master_port: int = 0  # 0: a free port, chosen at construction (so are the others)
    master_ui_port: int = 0
    worker_port: int = 0
    worker_ui_port: int = 0
    master: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    followers: dict[str, LogFollower] = field(default_factory=dict)

    def __post_init__(self) -> None:
        free = iter(free_ports(4))
        self.master_port = self.master_port or next(free)
        self.master_ui_port = self.master_ui_port or next(free)
        self.worker_port = self.worker_port or next(free)
        self.worker_ui_port = self.worker_ui_port or next(free)

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``, for ``SparkSink(master=...)``."""
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def work_dir(self) -> Path:
        """The worker's directory: ``<application id>/<executor id>/stderr`` for each executor it ran."""
        return self.base / "work"

    def environment(self) -> dict[str, str]:
        """The environment of the master and the worker (and so of the executors the worker starts)."""
        env = dict(os.environ)
        for name in ("SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS", "SPARK_DAEMON_JAVA_OPTS", "PYSPARK_SUBMIT_ARGS"):
            env.pop(name, None)  # the cluster is this module's alone
        java = java_home()
        if java is not None:
            env["JAVA_HOME"] = java
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(self.base / "conf"),  # empty: no spark-env.sh, spark-defaults.conf nor log4j2 config
            SPARK_LOG_DIR=str(self.base / "logs"),
            SPARK_WORKER_DIR=str(self.work_dir),
            SPARK_LOCAL_DIRS=str(self.base / "local"),  # shuffle and block files, instead of /tmp/spark-*
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY="256m",  # master and worker heaps (1g by default); executors get their own
            # A port taken between free_ports() and the JVM's bind fails the start loudly instead of moving the
            # master to the next port, where the URL this class hands out would not reach it.
            SPARK_DAEMON_JAVA_OPTS="-Dspark.port.maxRetries=0",
            PYSPARK_PYTHON=sys.executable,  # executors that run Python run this interpreter
        )
        return env

    def start(self) -> StandaloneCluster:
        """Start the master and the worker, and wait until the master counts the worker alive."""
        for directory in ("conf", "logs", "work", "local"):
            (self.base / directory).mkdir(parents=True, exist_ok=True)
        env = self.environment()
        # Both start at once: the worker retries its registration until the master listens.
        master = ["--port", str(self.master_port), "--webui-port", str(self.master_ui_port)]
        worker = ["--port", str(self.worker_port), "--webui-port", str(self.worker_ui_port)]
        worker += ["--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.work_dir)]
        self.master = self._launch("master", env, MASTER_CLASS, *master)
        self.worker = self._launch("worker", env, WORKER_CLASS, *worker, self.master_url)
        try:
            # The worker logs this once the master has added it and answered (the master's own "Registering
            # worker" line can come while it is still recovering, before the worker counts as alive).
            registered = re.compile(r"Successfully registered with master spark://")
            self.wait_for_log(registered, "the worker's registration", self.start_timeout, daemon="worker")
            if self.status().get("aliveworkers", 0) < 1:
                raise StandaloneError(f"the worker registered but the master lists no alive worker\n{self.logs()}")
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, name: str, env: dict[str, str], main_class: str, *options: str) -> subprocess.Popen[bytes]:
        """``spark-class main_class --host 127.0.0.1 options...``, its output to ``logs/<name>.log``."""
        spark_class = spark_home() / "bin" / "spark-class"
        command = ["bash", str(spark_class), main_class, "--host", "127.0.0.1", *options]  # bash: no need for +x
        process = subprocess.Popen(
            dying_with_parent(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the tests, not the cluster
        )
        assert process.stdout is not None
        self.followers[name] = LogFollower(process.stdout, self.base / "logs" / f"{name}.log")
        return process

    def status(self) -> dict[str, Any]:
        """The master's JSON status: ``aliveworkers``, ``activeapps``, ``completedapps``, ..."""
        url = f"http://127.0.0.1:{self.master_ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            status: dict[str, Any] = json.load(response)
            return status

    def wait_for_log(self, pattern: re.Pattern[str], what: str, timeout: float, daemon: str = "master") -> str:
        """Wait until ``daemon`` (the master or the worker) logs a line matching ``pattern`` and return it.

        Raises ``StandaloneError`` (with the end of both logs) when the master's output ends first, or when
        ``timeout`` passes: the deadline is a safety net, the wait itself ends on the line.
        """
        line = self.followers[daemon].wait_for(pattern, timeout)
        if line is None:
            exited = [
                name for name, p in (("master", self.master), ("worker", self.worker)) if p and p.poll() is not None
            ]
            reason = f"the Spark {' and '.join(exited)} exited" if exited else f"nothing within {timeout} s"
            raise StandaloneError(f"{reason} waiting for {what}\n{self.logs()}")
        return line

    def application(self, app_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The master's record of application ``app_id`` once it is finished (waits until it is)."""

        self.wait_for_log(re.compile(rf"Removing app {re.escape(app_id)}\b"), f"application {app_id} removed", timeout)
        # the master handles one message at a time: the status request comes after the removal it logged
        apps = [app for app in self.status().get("completedapps", []) if app["id"] == app_id]
        if not apps:
            raise StandaloneError(f"application {app_id} was removed but is not listed as completed\n{self.logs()}")
        app: dict[str, Any] = apps[0]
        return app

    def executor_logs(self, app_id: str) -> list[Path]:
        """The stderr of every executor the worker ran for ``app_id``."""
        return sorted((self.work_dir / app_id).glob("*/stderr"))

    def logs(self, lines: int = 30) -> str:
        """The last ``lines`` of the master's and the worker's logs, for error messages."""
        parts = []
        for name in ("master", "worker"):
            path = self.base / "logs" / f"{name}.log"
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            parts.append(f"--- {name} log:\n" + "\n".join(text))
        return "\n".join(parts)

    def pids(self) -> list[int]:
        """The PIDs of the master's and the worker's JVMs (``spark-class`` execs ``java``)."""
        return [process.pid for process in (self.master, self.worker) if process is not None]

    def stop(self) -> None:
        """Stop the worker (its shutdown hook stops its executors), then the master: each by PID, reaped."""
        for attribute in ("worker", "master"):
            process = getattr(self, attribute)
            setattr(self, attribute, None)
            if process is not None:
                stop_child(process, timeout=15.0)
                follower = self.followers.pop(attribute, None)
                if follower is not None:
                    follower.join()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def dying_with_parent(command: list[str]) -> list[str]:
    """``command`` run so that Linux sends it SIGTERM when the test process dies (util-linux ``setpriv``).

    The signal survives bash's exec of ``java``, so a test run killed without teardown takes the cluster
    with it. Not ``preexec_fn``: that is unsafe in a process with threads, as a test session has.
    """
    setpriv = shutil.which("setpriv")
    return command if setpriv is None else [setpriv, "--pdeathsig", "TERM", *command]


def run_job(master: str, output: Path, count: int) -> dict[str, str]:
    """The driver: ``count`` events summed per key and 5 s window into ``SparkSink(output, master=master)``.

    With checkpoints every 50 ms, so several epochs are handed to the cluster one after the other.
    Returns what the session says of itself: its master, application id and driver host.
    """
    import streamlet as sl
    from tests.support import spark_job

    sink = sl.SparkSink(output, master=master)
    # the windows closed by event time 10 go to Spark in an epoch of their own, the rest in later ones
    topology = spark_job.build(sink, spark_job.HeldEvents(spark_job.events(count), 2 * spark_job.WINDOW))
    sl.run(topology, checkpoint_dir=output.parent / "checkpoints", checkpoint_interval=0.05, batch_size=10)
    spark = sink.spark()
    context = spark.sparkContext
    facts = {
        "master": context.master,
        "app_id": context.applicationId,
        "driver_host": context.getConf().get("spark.driver.host"),
    }
    spark.stop()  # the application ends now, so the master lists it as finished
    return facts


if __name__ == "__main__":
    print(json.dumps(run_job(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))), flush=True)
