"""The Kafka connectors without a broker: no aiokafka, configuration errors, transactional ids, staging."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import streamlet as sl

WITHOUT_AIOKAFKA = """
import sys
sys.modules["aiokafka"] = None          # as if it were not installed
import streamlet as sl
source = sl.KafkaSource("t", "localhost:9092", None)
topology = sl.Topology("t")
topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", source))
try:
    sl.run(topology)
except sl.KafkaError as exc:
    print(exc)
"""


def test_without_aiokafka_import_works_and_opening_names_the_extra() -> None:
    """`import streamlet` needs no aiokafka; opening a Kafka source without it names the extra to install."""
    output = subprocess.run([sys.executable, "-c", WITHOUT_AIOKAFKA], capture_output=True, check=True, text=True)
    assert output.stdout == "the Kafka connectors need aiokafka: pip install 'streamlet[kafka]'\n"


def test_source_refuses_an_unknown_error_policy() -> None:
    """on_error is 'skip' or 'fail' (retrying a deserializer gives the same answer, so no 'restart')."""
    with pytest.raises(sl.KafkaError, match=r"^KafkaSource on_error must be 'skip' or 'fail', not 'restart'$"):
        sl.KafkaSource("t", "localhost:9092", None, on_error="restart")


def test_transactional_sink_needs_a_staging_dir() -> None:
    """transactional=True without staging_dir is refused, naming the topic."""
    with pytest.raises(sl.KafkaError, match=r"^KafkaSink for topic 'out': transactional=True needs a staging_dir$"):
        sl.KafkaSink("out", "localhost:9092", transactional=True)


def transactional_sink(staging: Path) -> sl.KafkaSink:
    return sl.KafkaSink("out", "localhost:9092", transactional=True, staging_dir=staging)


def test_transactional_id_is_the_same_in_every_attempt() -> None:
    """The default transactional id is streamlet.<job id>.<sink>.<index>, whatever the run (so a new run fences)."""
    sink = sl.KafkaSink("out", "localhost:9092", transactional=True, staging_dir="unused")
    ids = {sink.transactional_id_of(sl.SinkContext("to-kafka", 1, 2, "local.wc", attempt)) for attempt in ("a", "b")}
    assert ids == {"streamlet.local.wc.to-kafka.1"}


def test_a_given_transactional_id_prefix_gets_the_instance_index() -> None:
    """transactional_id="orders" gives instance 1 the id "orders-1" in every run."""
    sink = sl.KafkaSink("out", "localhost:9092", transactional=True, staging_dir="unused", transactional_id="orders")
    assert sink.transactional_id_of(sl.SinkContext("to-kafka", 1, 2, "local.wc", "a")) == "orders-1"


async def stage_epochs(staging: Path, attempt: str, epochs: list[int]) -> None:
    """A run ``attempt`` of instance 0 that staged one record per epoch, then crashed."""
    writer = transactional_sink(staging).open(sl.SinkContext("out", 0, 1, "local.wc", attempt))
    for epoch in epochs:
        writer.write([sl.Record("k", epoch, 0.0)])
        await writer.prepare_commit(epoch)
    await writer.abort()


def staged(staging: Path) -> list[str]:
    """Every staged file, as ``<attempt>/<name>``."""
    root = staging / "streamlet.local.wc.out.0"
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


async def test_restore_keeps_the_restored_attempts_completed_epochs_and_nothing_else(tmp_path: Path) -> None:
    """Restoring from run A's checkpoint 2: A's epochs 1-2 wait for recovery, A's 3 is dropped, run X is untouched."""
    await stage_epochs(tmp_path, "run-a", [1, 2, 3])
    await stage_epochs(tmp_path, "run-x", [1, 2])
    writer = transactional_sink(tmp_path).open(sl.SinkContext("out", 0, 1, "local.wc", "run-b"))
    writer.restore(sl.RestorePoint(2, "run-a"))
    await writer.abort()
    assert staged(tmp_path) == [
        "run-a/00000001.pending", "run-a/00000002.pending", "run-x/00000001.pending", "run-x/00000002.pending",
    ]  # fmt: skip
