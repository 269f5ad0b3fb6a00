"""A Kafka-protocol broker for tests: librdkafka's mock cluster, run as a process of its own.

No Kafka broker can be installed on the test machines, but the librdkafka
bundled in the ``confluent-kafka`` wheel contains a mock cluster that speaks
the Kafka protocol over real TCP sockets. This module reaches it through
ctypes. Run as a script it starts a cluster, creates the topics named on the
command line, prints ``BOOTSTRAP host:port`` on one line of stdout, then
serves until it is terminated::

    python -m tests.support.kafka_mock --topic orders:3 --topic audit:1

While it runs it reads commands on stdin, one per line, and answers each with
one line: ``topic NAME PARTITIONS`` creates a topic (``ok`` or ``error N``).
The mock has no CreateTopics API (see ``rdkafka_mock.h``), so this is how a
test gets a topic with a given number of partitions.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType, TracebackType

from streamlet.backends.cluster.local.child_process import stop_child

RD_KAFKA_PRODUCER = 0


def load_librdkafka() -> ctypes.CDLL:
    """The librdkafka shared library shipped inside the confluent-kafka wheel."""
    import confluent_kafka  # the test extra installs it; missing, the import error says so

    package = Path(confluent_kafka.__file__).parent
    candidates = sorted(glob.glob(str(package.parent / "confluent_kafka.libs" / "librdkafka*.so*")))
    candidates += sorted(glob.glob(str(package / ".dylibs" / "librdkafka*.dylib")))
    if not candidates:
        raise RuntimeError(f"no librdkafka library found beside {package}")
    library = ctypes.CDLL(candidates[0])
    library.rd_kafka_conf_new.restype = ctypes.c_void_p
    library.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    library.rd_kafka_conf_set.restype = ctypes.c_int
    library.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    library.rd_kafka_new.restype = ctypes.c_void_p
    library.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    library.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    library.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    library.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    library.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    library.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    library.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    library.rd_kafka_mock_topic_create.restype = ctypes.c_int
    library.rd_kafka_mock_group_initial_rebalance_delay_ms.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return library


class MockCluster:
    """A mock cluster with ``brokers`` brokers, owned by a librdkafka handle of its own."""

    def __init__(self, brokers: int = 1) -> None:
        self.library = library = load_librdkafka()
        conf = library.rd_kafka_conf_new()
        error = ctypes.create_string_buffer(512)
        # the handle only does the mock's book-keeping: keep its own logging quiet
        library.rd_kafka_conf_set(conf, b"log_level", b"3", error, len(error))
        self.handle = library.rd_kafka_new(RD_KAFKA_PRODUCER, conf, error, len(error))
        if not self.handle:
            raise RuntimeError(f"rd_kafka_new failed: {error.value.decode()}")
        self.cluster = library.rd_kafka_mock_cluster_new(self.handle, brokers)
        if not self.cluster:
            library.rd_kafka_destroy(self.handle)
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        # a group's first join would otherwise wait 3 s for more members
        library.rd_kafka_mock_group_initial_rebalance_delay_ms(self.cluster, 0)

    @property
    def bootstraps(self) -> str:
        """``host:port[,host:port...]`` of the brokers."""
        return str(self.library.rd_kafka_mock_cluster_bootstraps(self.cluster).decode())

    def create_topic(self, name: str, partitions: int) -> int:
        """Create ``name`` with ``partitions`` partitions; returns the librdkafka error code (0: done)."""
        return int(self.library.rd_kafka_mock_topic_create(self.cluster, name.encode(), partitions, 1))

    def close(self) -> None:
        """Destroy the cluster, then its handle."""
        self.library.rd_kafka_mock_cluster_destroy(self.cluster)
        self.library.rd_kafka_destroy(self.handle)


class MockBroker:
    """This module run as a child process: started, asked for topics, stopped by its PID.

    Example:
        >>> with MockBroker() as broker:   # doctest: +SKIP
        ...     broker.create_topic("orders", 3)
        ...     print(broker.bootstrap)
    """

    def __init__(self, start_timeout: float = 20.0) -> None:
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[str] | None = None
        self.bootstrap = ""

    def start(self) -> MockBroker:
        """Start the process and wait for its bootstrap address."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.kafka_mock"],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        words = self._answer(self.start_timeout).split()
        if len(words) != 2 or words[0] != "BOOTSTRAP":
            self.stop()
            raise RuntimeError(f"the mock Kafka broker did not start (it said {words!r})")
        self.bootstrap = words[1]
        return self

    def _answer(self, timeout: float) -> str:
        assert self.process is not None
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"the mock Kafka broker did not answer within {timeout} s")
        return self.process.stdout.readline()

    def create_topic(self, name: str, partitions: int) -> None:
        """Create ``name`` with ``partitions`` partitions through the mock API."""
        assert self.process is not None
        assert self.process.stdin is not None
        self.process.stdin.write(f"topic {name} {partitions}\n")
        self.process.stdin.flush()
        answer = self._answer(10.0).strip()
        if answer != "ok":
            raise RuntimeError(f"creating topic {name!r}: {answer}")

    def stop(self) -> None:
        """Stop the process by its PID (SIGTERM, then SIGKILL after 10 s)."""
        process, self.process = self.process, None
        if process is None:
            return
        stop_child(process)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> MockBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def _topic(text: str) -> tuple[str, int]:
    name, _, partitions = text.rpartition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME:PARTITIONS, got {text!r}")
    return name, int(partitions)


def _serve_commands(cluster: MockCluster, stop: threading.Event) -> None:
    for line in sys.stdin:
        words = line.split()
        if len(words) == 3 and words[0] == "topic":
            code = cluster.create_topic(words[1], int(words[2]))
            print("ok" if code == 0 else f"error {code}", flush=True)
        elif words:
            print(f"error unknown command {words[0]!r}", flush=True)
    stop.set()  # stdin closed: whoever started us is gone


def main(argv: list[str] | None = None) -> None:
    """Start the cluster, create topics, print the bootstrap address, serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.kafka_mock")
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--topic", type=_topic, action="append", default=[], metavar="NAME:PARTITIONS")
    options = parser.parse_args(argv)
    cluster = MockCluster(options.brokers)
    for name, partitions in options.topic:
        code = cluster.create_topic(name, partitions)
        if code != 0:
            raise SystemExit(f"could not create topic {name!r}: librdkafka error {code}")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"BOOTSTRAP {cluster.bootstraps}", flush=True)
    threading.Thread(target=_serve_commands, args=(cluster, stop), daemon=True).start()
    while not stop.wait(0.5):
        pass
    cluster.close()
    os._exit(0)  # the stdin thread may still block in a read: leave without joining it


if __name__ == "__main__":
    main()
