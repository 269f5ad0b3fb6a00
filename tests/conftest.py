"""Shared fixtures: a topology builder, a one-line runner for in-process jobs, the armed crash, and the
session's ZooKeeper (for tests/integration and tests/faults).

Two plugins hold the run together: the reaper (``tests/support/reaper.py``), a process of its own that kills
every process the run started once pytest is gone, however it ends; and the timeouts
(``tests/support/timeouts.py``): a hung test fails with every stack dumped, and the run goes on."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer
from streamlet.core.runtime.job import Job
from streamlet.core.runtime.loop_watch import LOOP_WARNING_ENV
from streamlet.testing.postgres_server import PostgresServer
from tests.support.exactly_once import Bomb
from tests.support.postgres import fresh_database

pytest_plugins = ["tests.support.reaper", "tests.support.timeouts"]

# A call of user code that holds the event loop past loop_warning (0.1 s) is warned of on the log, and the log
# goes to stdout, which many tests compare line for line. Here dozens of programs run at once on two cores (the
# docs' blocks all start together), where any call's wall time stretches past 0.1 s: the suite's default is 5 s
# (inherited by every process it starts), and the tests of the warning pass their own loop_warning.
os.environ.setdefault(LOOP_WARNING_ENV, "5")


def values(records: Iterable[sl.Record | tuple[Any, ...]]) -> list[Any]:
    """The values of ``records`` (records, or elements as the runtime carries them), in order."""
    return [record[1] if isinstance(record, tuple) else record.value for record in records]


def pairs(records: Iterable[sl.Record | tuple[Any, ...]]) -> list[tuple[Any, Any]]:
    """``(key, value)`` of ``records`` (records, or elements as the runtime carries them), in order."""
    return [record[:2] if isinstance(record, tuple) else (record.key, record.value) for record in records]


def as_listed(rows: list[Any], backend: str) -> list[Any]:
    """``rows`` emitted in the order the state lists its keys, as a test compares them: as they are with the
    in-memory state (first written first); sorted (by ``repr``) with RocksDB, which lists keys by layout."""
    return sorted(rows, key=repr) if backend == "rocksdb" else rows


def self_loop() -> sl.Topology:
    """'in' -> 'step', which feeds itself (at most 2 rounds) -> 'out'."""
    topology = sl.Topology("loop")
    source = topology.add_source("in", [1])
    step = topology.map("step", lambda r: (r.key, r.value))
    step.set_input(source).set_input(step)
    topology.add_sink("out", sl.CollectSink()).set_input(step)
    topology.set_max_iterations(2)
    return topology


@pytest.fixture
def linear() -> Callable[..., sl.JobResult]:
    """Run ``items`` through one task (given as a Task class/factory) into a collecting sink."""

    def run(items: Iterable[Any], task: Any, **options: Any) -> sl.JobResult:
        topology = sl.Topology("linear")
        source = topology.add_source("in", list(items))
        node = topology.add_task("task", task, **options).set_input(source)
        topology.add_sink("out", sl.CollectSink()).set_input(node)
        return sl.run(topology)

    return run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``extended`` run only under ``STREAMLET_EXTENDED=1`` (``make extended``, ``make busy``): the
    longest variants of what ``make test`` already checks, left out of its 25 minutes. Deselected, not skipped."""
    if os.environ.get("STREAMLET_EXTENDED") == "1":
        return
    extended = [item for item in items if item.get_closest_marker("extended") is not None]
    if extended:
        config.hook.pytest_deselected(items=extended)
        items[:] = [item for item in items if item.get_closest_marker("extended") is None]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``each_state_backend``: memory and RocksDB, or memory alone for a test marked ``in_memory_state_only``."""
    if "each_state_backend" in metafunc.fixturenames:
        only_memory = metafunc.definition.get_closest_marker("in_memory_state_only") is not None
        metafunc.parametrize("each_state_backend", ["memory"] if only_memory else ["memory", "rocksdb"], indirect=True)


@pytest.fixture
def each_state_backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Run the test twice: as written (keyed state in memory), then with every job that chooses no backend on
    RocksDB (a database folder of its own per job, a cache of 8 values so most reads and writes reach the
    database). A module opts in with ``pytestmark = pytest.mark.usefixtures("each_state_backend")``; a test
    of what only the dict does is marked ``in_memory_state_only`` with the reason."""
    if request.param == "rocksdb":
        root, numbers = tmp_path_factory.mktemp("rocksdb"), itertools.count()
        made_by = Job.__init__

        def on_rocksdb(job: Job, *args: Any, state_backend: Any = None, **options: Any) -> None:
            chosen = state_backend or sl.RocksDBState(root / str(next(numbers)), cache_entries=8)
            made_by(job, *args, state_backend=chosen, **options)

        monkeypatch.setattr(Job, "__init__", on_rocksdb)
    return str(request.param)


@pytest.fixture
def armed_bomb(tmp_path: Path) -> Iterator[Path]:
    """Arm the crash for one run; the checkpoint directory it watches."""
    checkpoints = tmp_path / "checkpoints"
    Bomb.armed, Bomb.checkpoints, Bomb.seen_at_crash = True, checkpoints, 0
    yield checkpoints
    Bomb.armed, Bomb.checkpoints = False, None


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper (a missing installation fails the tests, it does not skip them).

    Started only when a test asks for it; shared by every test of the session that does.
    """
    # die_with_parent, and the reaper: should a timeout end the run without teardown, the server goes with it
    server = ZooKeeperServer(data_dir=Path(tmp_path_factory.mktemp("zookeeper")), die_with_parent=True)
    with server:
        yield server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the session's own (``initdb`` into a folder under /tmp, a free port, stopped by
    PID); a missing installation fails the tests, it does not skip them. Started only when a test asks."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres: PostgresServer) -> str:
    """The DSN of a new, empty database on the session's PostgreSQL server: one per test."""
    return fresh_database(postgres)
