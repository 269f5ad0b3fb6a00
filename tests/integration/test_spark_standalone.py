"""SparkSink against a real Spark standalone cluster (a master and a worker from the installed pyspark).

The driver runs in a process of its own (``python -m tests.support.spark_standalone``):
Spark allows one ``SparkContext`` per process, and this test session may
hold the shared ``local[*]`` one. What the cluster wrote is read back here
with pyarrow, and the master's status and the worker's directory show that
the cluster, not a local session, ran the work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset
import pytest

from tests.support.spark_job import events, expected_sums
from tests.support.spark_standalone import StandaloneCluster, dying_with_parent

pytestmark = [
    pytest.mark.integration,
    pytest.mark.extended("make extended: SparkSink on Spark's own cluster; make test runs it on local[*] and workers"),
]

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 1500  # 15 s of event time: 4 windows of 5 s per key, handed over in several checkpoint epochs
JOB_TIMEOUT = 90.0  # a safety net: the driver ends on its own once its input is done


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A started master with one registered worker (1 core, 1g), stopped by PID at the end of the module."""
    with StandaloneCluster(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


def run_driver(cluster: StandaloneCluster, output: Path, count: int) -> dict[str, str]:
    """Run the job in a driver process of its own against ``cluster``; what its session says of itself."""
    env = cluster.environment()
    # The driver gets no SPARK_LOCAL_IP (the shared local session's fixture may have set it in this process):
    # binding the driver to loopback for a loopback master is SparkSink's job, and this run checks it does.
    env.pop("SPARK_LOCAL_IP", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "tests.support.spark_standalone", cluster.master_url, str(output), str(count)]
    driver = subprocess.run(
        dying_with_parent(command),  # a run killed without teardown takes the driver with it
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=JOB_TIMEOUT,
    )  # fmt: skip
    assert driver.returncode == 0, f"driver exited {driver.returncode}\n{driver.stderr}\n{cluster.logs()}"
    facts: dict[str, str] = json.loads(driver.stdout.splitlines()[-1])
    return facts


def read_back(output: Path, *columns: str) -> list[tuple[Any, ...]]:
    """``columns`` of every row under ``output`` (``epoch``, ``instance``: from the directory names), sorted.

    Read with pyarrow, which skips ``_staging`` and ``_SUCCESS`` as Spark does.
    """
    table = pyarrow.dataset.dataset(output, format="parquet", partitioning="hive").to_table()
    return sorted(zip(*(table.column(name).to_pylist() for name in columns), strict=True))


@pytest.mark.timeout(180)  # counts the cluster's start (10 to 15 s) and the driver's JVM and executor (about 25 s)
def test_sink_hands_epochs_to_a_standalone_cluster(standalone: StandaloneCluster, tmp_path: Path) -> None:
    """SparkSink(master="spark://127.0.0.1:PORT"): the cluster's executor writes every window sum exactly once."""
    output = tmp_path / "sums"
    facts = run_driver(standalone, output, EVENTS)

    assert read_back(output, "key", "value", "window_start", "window_end") == expected_sums(events(EVENTS))
    epochs = {epoch for epoch, instance in read_back(output, "epoch", "instance") if instance == 0}
    assert len(epochs) >= 2  # handed over epoch by epoch as checkpoints completed, not once at the end

    # The session was the cluster's, its driver bound to loopback (SparkSink's setting for a loopback master)...
    assert facts["master"] == standalone.master_url
    assert facts["app_id"].startswith("app-")  # a local session's id starts with local-
    assert facts["driver_host"] == "127.0.0.1"
    # ...the master ran it to the end as the application "streamlet"...
    app = standalone.application(facts["app_id"])
    assert (app["name"], app["state"], app["cores"]) == ("streamlet", "FINISHED", 1)
    # ...and the worker's executor ran the tasks that wrote the files.
    logs = standalone.executor_logs(facts["app_id"])
    assert logs, f"no executor ran for {facts['app_id']} under {standalone.work_dir}"
    finished = sum(log.read_text(errors="replace").count("Finished task") for log in logs)
    assert finished >= len(epochs)  # at least one write task per epoch
