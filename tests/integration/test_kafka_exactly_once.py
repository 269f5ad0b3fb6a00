"""Kafka in, transactional Kafka out: every output record exactly once across crashes.

The job (``tests/support/kafka_exactly_once.py``) reads 4000 records from a
topic, keeps a running count per key and writes ``(key, count)`` through a
transactional ``KafkaSink``; a failure-free run writes each pair once.

What the broker (librdkafka's mock cluster, see ``test_kafka.py``) can and
cannot show here: it runs aiokafka's transactional producer for real
(InitProducerId, AddPartitionsToTxn, EndTxn, fencing of an older producer
with the same transactional id), but it does not isolate transactions: a
``read_committed`` consumer also gets records of open and aborted
transactions, and a new producer does not abort its predecessor's open
transaction. So these tests prove that the sink *produces* each record in a
committed transaction exactly once: it never leaves a transaction open or
aborted except when a crash hits inside ``commit`` itself, which no test
here does. That a real broker hides an aborted transaction from
``read_committed`` consumers is Kafka's part and cannot be checked on the
mock. Its transaction markers have CRC 0, so consumers turn CRC checks off.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

import streamlet as sl
from tests.support import kafka_exactly_once
from tests.support.exactly_once import RECORDS, expected_output, items
from tests.support.kafka_io import CHECK_CRCS_OFF, Message, consume, produce
from tests.support.kafka_mock import MockBroker

# A hung test fails and its teardown stops the broker (tests/support/timeouts.py); should the run end without
# teardown, the broker exits by itself when its stdin closes, and the reaper kills it anyway.
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def topics(kafka_broker: MockBroker, new_topic: Callable[[int], str]) -> tuple[str, str]:
    """An input topic (2 partitions) holding the job's 4000 records, and an empty output topic (2 partitions)."""
    topic_in, topic_out = new_topic(2), new_topic(2)
    sent = [Message(key.encode(), str(value).encode(), value % 2) for key, value in items()]
    anyio.run(produce, kafka_broker.bootstrap, topic_in, sent)
    return topic_in, topic_out


def output(bootstrap: str, topic: str) -> list[tuple[str, int]]:
    """``(key, count)`` of every record in the output topic, sorted."""
    return sorted((m.key.decode(), int(m.value)) for m in anyio.run(consume, bootstrap, topic) if m.key and m.value)


def test_failure_free_run_writes_every_count_once(
    kafka_broker: MockBroker, topics: tuple[str, str], tmp_path: Path
) -> None:
    """The reference: without a crash the output topic holds each (key, n) exactly once."""
    result = kafka_exactly_once.run(kafka_broker.bootstrap, topics, tmp_path / "checkpoints", tmp_path / "staging")
    assert output(kafka_broker.bootstrap, topics[1]) == expected_output()
    assert result.statistics.checkpoints >= 2
    assert list((tmp_path / "staging").rglob("*.pending")) == []


def test_exception_mid_stream_then_restart_is_exactly_once(
    kafka_broker: MockBroker, topics: tuple[str, str], tmp_path: Path, armed_bomb: Path
) -> None:
    """A task raises after two checkpoints; the rerun replays from the checkpointed offsets, no duplicate, no gap."""
    bootstrap, staging = kafka_broker.bootstrap, tmp_path / "staging"
    with pytest.raises(sl.TaskError, match=r"^task 'bomb' instance 0 failed on a batch of 10 records"):
        kafka_exactly_once.run(bootstrap, topics, armed_bomb, staging)
    before = output(bootstrap, topics[1])
    assert 0 < len(before) < len(expected_output())
    assert len(set(before)) == len(before)

    result = kafka_exactly_once.run(bootstrap, topics, armed_bomb, staging)
    assert output(bootstrap, topics[1]) == expected_output()
    assert result.statistics.nodes["in"].records_out < RECORDS  # it resumed from the offsets, not from the start


def staged(tmp_path: Path) -> list[tuple[str, str]]:
    """(sink instance, file name) of every staged epoch file (in ``<transactional id>/<attempt>/``)."""
    return sorted((path.parent.parent.name[-1], path.name) for path in (tmp_path / "staging").rglob("*.pending"))


def run_child_until_killed(bootstrap: str, topics: tuple[str, str], tmp_path: Path, *flags: str) -> None:
    """Run the job in a child process that SIGKILLs itself at the point ``flags`` name."""
    command = [sys.executable, "-m", "tests.support.kafka_exactly_once", bootstrap, *topics]
    child = subprocess.Popen([*command, str(tmp_path / "checkpoints"), str(tmp_path / "staging"), *flags], cwd=ROOT)
    try:
        child.wait(timeout=40)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL


def test_crash_after_checkpoint_saved_before_commit_redoes_the_epoch(
    kafka_broker: MockBroker, topics: tuple[str, str], tmp_path: Path
) -> None:
    """Killed after checkpoint 3 is saved but before its transaction: the restore produces epoch 3 once."""
    bootstrap = kafka_broker.bootstrap
    run_child_until_killed(bootstrap, topics, tmp_path, "--die-after-save", "3")
    assert staged(tmp_path) == [("0", "00000003.pending"), ("1", "00000003.pending")]
    before = output(bootstrap, topics[1])

    kafka_exactly_once.run(bootstrap, topics, tmp_path / "checkpoints", tmp_path / "staging")
    assert output(bootstrap, topics[1]) == expected_output()
    assert len(before) < len(expected_output())


def test_crash_after_commit_before_cleanup_does_not_produce_again(
    kafka_broker: MockBroker, topics: tuple[str, str], tmp_path: Path
) -> None:
    """Killed after one sink instance committed epoch 3 but before it removed its staged file, and before the
    other instance committed: the restore skips the first (its marker is there) and redoes the second."""
    bootstrap = kafka_broker.bootstrap
    run_child_until_killed(bootstrap, topics, tmp_path, "--die-after-commit", "3")
    assert staged(tmp_path) == [("0", "00000003.pending"), ("1", "00000003.pending")]

    kafka_exactly_once.run(bootstrap, topics, tmp_path / "checkpoints", tmp_path / "staging")
    assert output(bootstrap, topics[1]) == expected_output()


def test_markers_name_each_sink_instance_and_its_last_epoch(
    kafka_broker: MockBroker, topics: tuple[str, str], tmp_path: Path
) -> None:
    """Each instance's transactions also wrote (its transactional id, epoch) to marker partition 0, epochs rising."""
    started = time.monotonic()
    result = kafka_exactly_once.run(kafka_broker.bootstrap, topics, tmp_path / "checkpoints", tmp_path / "staging")
    assert time.monotonic() - started < 30
    markers = anyio.run(consume, kafka_broker.bootstrap, f"{topics[1]}.streamlet-commits")
    assert {m.partition for m in markers} == {0}
    last = result.statistics.last_checkpoint.epoch
    for index in (0, 1):
        key = f"streamlet.local.kafka-exactly-once.out.{index}".encode()  # the same in every run
        epochs = [int(m.value) for m in markers if m.key == key and m.value is not None]
        assert epochs == sorted(set(epochs))  # one marker per transaction, epochs rising
        assert len(epochs) >= 2
        assert epochs[-1] <= last  # an epoch with no records needs no transaction


def test_transactional_sink_without_checkpoints_publishes_at_the_end(
    kafka_broker: MockBroker, new_topic: Callable[[int], str], tmp_path: Path
) -> None:
    """No checkpoint store: everything written becomes visible in one transaction when the job ends."""
    topic = new_topic(1)
    sink = sl.KafkaSink(topic, kafka_broker.bootstrap, transactional=True, staging_dir=tmp_path)
    topology = sl.Topology("no-checkpoints")
    topology.add_sink("out", sink).set_input(topology.add_source("in", [("k", i) for i in range(50)]))
    sl.run(topology)
    written = anyio.run(consume, kafka_broker.bootstrap, topic)
    assert [(m.key, m.value) for m in written] == [(b"k", str(i).encode()) for i in range(50)]
    assert sorted(path.name for path in tmp_path.rglob("*") if path.is_file()) == []


def test_source_reads_a_transactional_topic_to_its_end(
    kafka_broker: MockBroker, new_topic: Callable[[int], str], tmp_path: Path
) -> None:
    """stop_at_end ends although the topic's last offsets are transaction markers, which are never records."""
    topic = new_topic(1)
    sink = sl.KafkaSink(topic, kafka_broker.bootstrap, transactional=True, staging_dir=tmp_path)
    writer = sl.Topology("write")
    writer.add_sink("out", sink).set_input(writer.add_source("in", [("k", i) for i in range(5)]))
    sl.run(writer)
    source = sl.KafkaSource(
        topic, kafka_broker.bootstrap, None, stop_at_end=True, value_deserializer=int, consumer_options=CHECK_CRCS_OFF
    )
    reader = sl.Topology("read")
    reader.add_sink("out", sl.CollectSink()).set_input(reader.add_source("in", source))
    assert [(r.key, r.value) for r in sl.run(reader).sink("out")] == [("k", i) for i in range(5)]
