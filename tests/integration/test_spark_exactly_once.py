"""SparkSink with checkpoints across crashes: every window result lands in Parquet exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import streamlet as sl
from tests.support import spark_job
from tests.support.spark_job import Bomb, expected_sums

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ROWS = ("key", "value", "window_start", "window_end")


def read_rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    """Every row under ``path`` (key, sum, window bounds), read back through Spark, sorted."""
    return sorted(tuple(row) for row in spark.read.parquet(str(path)).select(*ROWS).collect())


def epochs_written(path: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("epoch=")) for p in path.glob("epoch=*"))


def checkpoints_saved(directory: Path) -> int:
    return len(list(directory.glob("checkpoint-*.msgpack")))


@pytest.fixture
def armed_bomb(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Arm the crash for one run; the checkpoint directory and the output it watches."""
    checkpoints, output = tmp_path / "ckpt", tmp_path / "out"
    Bomb.armed, Bomb.output, Bomb.crashed = True, output, False
    yield checkpoints, output
    Bomb.armed, Bomb.output = False, None


def test_exception_mid_stream_then_restart_writes_each_result_once(spark: Any, armed_bomb: tuple[Path, Path]) -> None:
    """A task raises after an epoch reached Spark; the rerun resumes and the Parquet rows have no duplicate, no gap."""
    checkpoints, output = armed_bomb
    with pytest.raises(sl.TaskError, match=r"^task 'bomb' instance 0 failed on a batch of 10 records"):
        spark_job.run(checkpoints, output)
    assert Bomb.crashed
    before = read_rows(spark, output)
    assert 0 < len(before) < len(expected_sums(spark_job.events()))

    result = spark_job.run(checkpoints, output)
    assert read_rows(spark, output) == expected_sums(spark_job.events())
    assert result.statistics.nodes["events"].records_out < spark_job.EVENTS  # it resumed, not restarted


class FailingOnce(sl.SparkSink):
    """Fails handing over the first epoch that has rows, once: the checkpoint is saved, Spark never wrote."""

    failed: ClassVar[list[int]] = []

    def hand_over(self, rows: Any, epoch: int, index: int) -> None:
        if not FailingOnce.failed:
            FailingOnce.failed.append(epoch)
            raise OSError("disk full")
        super().hand_over(rows, epoch, index)


def test_restore_hands_over_an_epoch_whose_write_failed(spark: Any, tmp_path: Path) -> None:
    """Checkpoint N saved, Spark write of N failed: the job fails; the rerun's restore writes N, then resumes."""
    checkpoints, output = tmp_path / "ckpt", tmp_path / "out"
    FailingOnce.failed.clear()
    topology = spark_job.build(FailingOnce(output))
    failure = r"^sink 'to-spark' instance 0: handing epoch \d+ to Spark failed: disk full$"
    with pytest.raises(sl.ConnectorError, match=failure):
        sl.run(topology, checkpoint_dir=checkpoints, checkpoint_interval=0.05, batch_size=spark_job.BATCH)
    [failed] = FailingOnce.failed
    sealed = list((output / "_staging" / "to-spark").glob(f"*/0000-{failed:08d}"))  # in the failed run's staging
    assert [path.is_dir() for path in sealed] == [True]  # sealed, durable, not yet in Spark
    assert failed not in epochs_written(output)

    spark_job.run(checkpoints, output)
    assert failed in epochs_written(output)
    assert read_rows(spark, output) == expected_sums(spark_job.events())
    assert not list((output / "_staging" / "to-spark").iterdir())


def test_sigkill_mid_stream_then_restart_writes_each_result_once(spark: Any, tmp_path: Path) -> None:
    """A child process running the job is SIGKILLed after epochs reached Spark; the rerun is exactly-once."""
    checkpoints, output = tmp_path / "ckpt", tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-m", "tests.support.spark_job", str(checkpoints), str(output)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 45  # the child starts its own Spark first
        while not (checkpoints_saved(checkpoints) >= 2 and any(output.glob("epoch=*/instance=0/_SUCCESS"))):
            assert child.poll() is None, "the job ended before it could be killed"
            assert time.monotonic() < deadline, "no epoch reached Spark in time"
            time.sleep(0.02)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert len(read_rows(spark, output)) < len(expected_sums(spark_job.events()))

    result = spark_job.run(checkpoints, output)
    assert read_rows(spark, output) == expected_sums(spark_job.events())
    assert result.statistics.nodes["events"].records_out < spark_job.EVENTS


def test_restore_deletes_partitions_of_later_epochs(spark: Any, tmp_path: Path) -> None:
    """Partitions of epochs after the checkpoint resumed from (or all, on a fresh start) are this run's to write."""
    checkpoints, output = tmp_path / "ckpt", tmp_path / "out"
    stale = output / "epoch=999" / "instance=0"
    stale.mkdir(parents=True)
    (stale / "part-0.parquet").write_bytes(b"not parquet")
    spark_job.run(checkpoints, output)  # a fresh start: restore(None)
    assert not stale.parent.exists()
    assert read_rows(spark, output) == expected_sums(spark_job.events())
