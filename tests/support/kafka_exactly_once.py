"""The exactly-once job of ``exactly_once`` with Kafka in and a transactional Kafka sink out.

Run as a script it is the child process a test kills::

    python -m tests.support.kafka_exactly_once BOOTSTRAP IN OUT CHECKPOINTS STAGING [--die-after-save N]

With ``--die-after-save N`` the process SIGKILLs itself right after
checkpoint ``N`` is saved, before any sink commits it: the window in which a
checkpoint is complete but its Kafka transaction is not. With
``--die-after-commit N`` it dies right after the sink committed the
transaction of epoch ``N``, before it deleted the epoch's staged file.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import streamlet as sl
from streamlet.connectors import kafka_staging
from tests.support import exactly_once
from tests.support.exactly_once import DieAfterSave

CHECK_CRCS_OFF = {"check_crcs": False}  # the mock broker writes transaction markers with CRC 0


def source(bootstrap: str, topic: str) -> sl.KafkaSource:
    """The input topic, read to its end once; values are decimal integers."""
    return sl.KafkaSource(
        topic, bootstrap, "exactly-once", stop_at_end=True, value_deserializer=int, consumer_options=CHECK_CRCS_OFF
    )


def sink(bootstrap: str, topic: str, staging: Path) -> sl.KafkaSink:
    """A transactional sink staging under ``staging``."""
    return sl.KafkaSink(topic, bootstrap, transactional=True, staging_dir=staging, consumer_options=CHECK_CRCS_OFF)


def build(bootstrap: str, in_topic: str, out_topic: str, staging: Path) -> sl.Topology:
    """Kafka -> throttle -> bomb -> running count (x2, SAME_KEY) -> transactional Kafka (x2)."""
    topology = sl.Topology("kafka-exactly-once")
    lines = topology.add_source("in", source(bootstrap, in_topic))
    throttle = topology.add_task("throttle", exactly_once.Throttle).set_input(lines)
    bomb = topology.add_task("bomb", exactly_once.Bomb).set_input(throttle)
    count = topology.add_task("count", exactly_once.RunningCount, parallelism=2)
    count.set_input(bomb, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sink(bootstrap, out_topic, staging), parallelism=2).set_input(count)
    return topology


def run(
    bootstrap: str, topics: tuple[str, str], checkpoints: Path, staging: Path, die_after_save: int | None = None
) -> sl.JobResult:
    """Run the job with a checkpoint every 20 ms."""
    topology = build(bootstrap, topics[0], topics[1], staging)
    options: dict[str, Any] = {"checkpoint_interval": 0.02, "batch_size": exactly_once.BATCH}
    if die_after_save is None:
        options["checkpoint_dir"] = checkpoints
    else:
        options["checkpoint_store"] = DieAfterSave(checkpoints, die_after_save)
    return sl.run(topology, **options)


def die_after_commit(epoch: int) -> None:
    """Make this process SIGKILL itself when a sink removes epoch ``epoch``'s staged file (after its commit)."""
    remove = kafka_staging.Staging.remove

    def remove_or_die(self: kafka_staging.Staging, epochs: list[int]) -> None:
        if epoch in epochs:
            os.kill(os.getpid(), signal.SIGKILL)
        remove(self, epochs)

    kafka_staging.Staging.remove = remove_or_die  # type: ignore[method-assign]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "in_topic", "out_topic", "checkpoints", "staging"):
        parser.add_argument(name)
    parser.add_argument("--die-after-save", type=int)
    parser.add_argument("--die-after-commit", type=int)
    args = parser.parse_args()
    if args.die_after_commit is not None:
        die_after_commit(args.die_after_commit)
    run(
        args.bootstrap, (args.in_topic, args.out_topic), Path(args.checkpoints), Path(args.staging), args.die_after_save
    )
