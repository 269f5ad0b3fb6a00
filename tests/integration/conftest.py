"""Real servers for the whole session, stopped at the end: a Kafka-protocol mock broker (by PID) and a local
SparkSession; the session's ZooKeeper is in tests/conftest.py (tests/faults uses it too)."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamlet.backends.cluster.local.zookeeper_server import ZooKeeperServer
from streamlet.backends.cluster.tree.zk import ZkStore
from tests.support.kafka_mock import MockBroker

_names = itertools.count()
TEST_SECRET = b"integration tests"


@pytest.fixture
def cluster_name() -> str:
    """A cluster name no other test uses, so tests share the server but not their nodes."""
    return f"test{next(_names)}"


@pytest.fixture
async def zk(zookeeper: ZooKeeperServer, cluster_name: str) -> AsyncIterator[ZkStore]:
    """A connected coordinator with a 2-second session."""
    async with ZkStore(zookeeper.address, cluster_name, session_timeout=2.0, secret=TEST_SECRET) as coordinator:
        yield coordinator


JAVA_17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The embedded local SparkSession for every Spark test (about 10 s to start: shared), stopped at the end.

    Java 17 comes from ``JAVA_HOME`` or, when unset, this machine's Java 17;
    Spark binds to 127.0.0.1. A missing pyspark or Java fails the tests, never skips them.
    """
    from streamlet.connectors.spark_session import spark_session

    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get("JAVA_HOME") and JAVA_17.exists():
            patch.setenv("JAVA_HOME", str(JAVA_17))
        patch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        session = spark_session()
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[MockBroker]:
    """librdkafka's mock Kafka cluster in a process of its own (a missing confluent-kafka fails, not skips)."""
    with MockBroker() as broker:
        yield broker


@pytest.fixture
def new_topic(kafka_broker: MockBroker) -> Callable[[int], str]:
    """``new_topic(partitions)`` creates a topic no other test uses and returns its name."""

    def create(partitions: int) -> str:
        name = f"topic{next(_names):05d}"  # fixed width: names sort as they were made
        kafka_broker.create_topic(name, partitions)
        return name

    return create
