"""Recovery without a shared disk on a real 3-worker cluster: each worker on its own loopback address with its
own folder; a worker is SIGKILLed and its folder deleted (its disk is gone with the machine), and the keyed
job still ends with exact output, restored from the replicas on the other workers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamlet as sl
from tests.support.cluster import (
    cluster_store,
    running_cluster,
    secret_of,
    stop_submitter,
    wait_for_exit,
    wait_for_state,
)
from tests.support.faults import SLOW_COUNT, ZkWatch

pytestmark = pytest.mark.integration
STREAMLET = [sys.executable, "-m", "streamlet.cli"]
WORDS = [f"w{(i * 7919) % 97}" for i in range(40_000)]


# The worker holding the file sink dies inside its first commit: the checkpoint is complete (its staged
# output is in it) but the output is not published yet. The marker file makes it happen once.
DYING_SINK = """
import asyncio
import os
import signal
import streamlet as sl

class Slow(sl.Task):
    async def execute(self, inputs, outputs):
        await asyncio.sleep(0.2)  # pacing: 60 batches over 2 instances, about 6 s
        outputs.emit_batch([sl.Record(None, int(r.value) * 2, r.ts) for r in inputs.get()])

class DyingFileSink(sl.FileSink):
    def open(self, context):
        writer = super().open(context)
        publish = writer.commit

        async def commit(epoch):
            if not os.path.exists(MARK):
                with open(MARK, "w", encoding="utf-8") as mark:
                    mark.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            await publish(epoch)

        writer.commit = commit
        return writer

def build_topology():
    topology = sl.Topology("dying-sink")
    source = topology.add_source("lines", sl.FileSource(INPUT))
    slow = topology.add_task("slow", Slow, parallelism=2).set_input(source)
    topology.add_sink("files", DyingFileSink(OUT)).set_input(slow)
    return topology
"""
NUMBERS = 60_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """ZooKeeper, a master and three workers of capacity 3, each on its own loopback address and with its own
    folder under .streamlet/; every PID is stopped afterwards."""
    with running_cluster(tmp_path, "--workers", "3", "--capacity", "3", "--name", "recovery", "--loopback-hosts") as up:
        yield up


def zk_read(cluster: dict[str, Any], *paths: str) -> list[Any]:
    """The data at ``paths`` (``None`` where there is no node)."""

    async def read() -> list[Any]:
        async with cluster_store(cluster["dir"]) as zk:
            return [None if (found := await zk.get(path)) is None else found[0] for path in paths]

    return anyio.run(read)


def kill_and_wipe(cluster: dict[str, Any], worker: str, databases: bool = False) -> None:
    """SIGKILL the worker and delete its folder, as a machine lost with its disk (``databases``: it held
    RocksDB databases there)."""
    pid = cluster["pids"][worker]
    os.kill(pid, signal.SIGKILL)
    assert wait_for_exit(pid), f"{worker} did not die"
    folder = cluster["dir"] / ".streamlet" / worker
    assert (folder / "checkpoints").is_dir()  # it did keep its parts there
    assert any(folder.rglob("rocksdb/**/CURRENT")) == databases
    assert any(folder.rglob("checkpoints/**/chunks/*.chunk")) == databases  # its parts were incremental
    shutil.rmtree(folder)


def test_a_killed_worker_whose_disk_is_gone_is_restored_from_its_replicas_with_exact_counts(
    cluster: dict[str, Any],
) -> None:
    """Kill the worker running count.1 after checkpoints completed, delete its folder (with the RocksDB database
    the count keeps its state in): attempt 2 restores the last checkpoint attempt 1 completed, puts each of the
    lost instances on a worker holding a replica (nothing is fetched) and the totals equal a plain count."""
    directory = cluster["dir"]
    job_file = directory / "slow_count.py"
    job_file.write_text(SLOW_COUNT, encoding="utf-8")
    results = directory / "totals.json"
    command = [*STREAMLET, "submit", str(job_file), "--job", "slow", "--results", str(results)]
    command += ["--state-backend", "rocksdb"]
    submit = subprocess.Popen(
        [*command, "--checkpoint-interval", "0.3"], cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        with ZkWatch(cluster["zk"], "recovery", secret_of(cluster["dir"])) as zk:
            # every completed checkpoint, seen by a watch: attempt 1 may still complete one just after the kill
            # (the victim had acknowledged it), which attempt 2 then restores; seconds pass before attempt 2's own
            completions = zk.follow("/jobs/slow/checkpoints/completed")
            wait_for_state(directory, "slow", {"RUNNING"})
            completions.wait_for(lambda data: data["epoch"] >= 2)
            [assignment] = zk_read(cluster, "/jobs/slow/assignment")
            victim = assignment["instances"]["count.1"]
            lost = sorted(instance for instance, worker in assignment["instances"].items() if worker == victim)
            kill_and_wipe(cluster, victim, databases=True)
            out, err = submit.communicate(timeout=90)
            seen = [data for data in completions.data() if data is not None]
    finally:
        stop_submitter(submit)
    assert submit.returncode == 0, err
    completed = max((data for data in seen if data["attempt"] == 1), key=lambda data: int(data["epoch"]))
    assert out.splitlines()[0].startswith("job 'slow' FINISHED"), out
    totals = {key: value for key, value, _ts in json.loads(results.read_text())["totals"]}
    assert totals == dict(Counter(WORDS))
    [second] = zk_read(cluster, "/jobs/slow/assignment")
    assert second["attempt"] == 2
    stateful = [instance for instance in lost if instance in completed["holders"]]  # sinks keep no state
    assert "count.1" in stateful
    for instance in stateful:
        assert second["instances"][instance] in completed["holders"][instance], (instance, completed["holders"])
    reports = zk_read(cluster, *(f"/jobs/slow/done/2/{worker}" for worker in sorted(set(second["instances"].values()))))
    assert {report["restored_from"] for report in reports} == {completed["epoch"]}
    assert sum(report["fetched_bytes"] for report in reports) == 0  # redeployed where the state was
    assert not (directory / ".streamlet" / victim).exists()


def test_a_worker_killed_after_a_checkpoint_completed_and_before_publishing_loses_and_doubles_nothing(
    cluster: dict[str, Any],
) -> None:
    """The file sink's worker dies in its first commit (checkpoint complete, output not yet published) and its
    folder is deleted: the next attempt publishes that epoch's staged output once, and the output is exact."""
    directory = cluster["dir"]
    lines, out, mark = directory / "numbers.txt", directory / "out", directory / "died"
    lines.write_text("".join(f"{n}\n" for n in range(NUMBERS)), encoding="utf-8")
    job_file = directory / "dying_job.py"
    job_file.write_text(f"INPUT = {str(lines)!r}\nOUT = {str(out)!r}\nMARK = {str(mark)!r}\n" + DYING_SINK)
    command = [*STREAMLET, "submit", str(job_file), "--job", "dying", "--checkpoint-interval", "0.5"]
    submit = subprocess.Popen(command, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_state(directory, "dying", {"RUNNING"})
        [assignment] = zk_read(cluster, "/jobs/dying/assignment")
        holder = assignment["instances"]["files.0"]
        assert wait_for_exit(cluster["pids"][holder], seconds=60), "the sink's worker did not die in its commit"
        assert int(mark.read_text()) == cluster["pids"][holder]
        shutil.rmtree(directory / ".streamlet" / holder)
        out_text, err = submit.communicate(timeout=120)
    finally:
        stop_submitter(submit)
    assert submit.returncode == 0, err
    assert out_text.splitlines()[0].startswith("job 'dying' FINISHED"), out_text
    values = [record.value for record in sl.read_file_sink(out)]
    assert len(values) == NUMBERS  # nothing doubled ...
    assert sorted(values) == [2 * n for n in range(NUMBERS)]  # ... and nothing lost
