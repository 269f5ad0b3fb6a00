"""Real servers for the whole session, stopped by PID at the end: ZooKeeper, and a Kafka-protocol mock broker."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from streamlet.backends.cluster.coordinator import ZkCoordinator
from streamlet.backends.cluster.zookeeper import ZooKeeperServer
from tests.support.kafka_mock import MockBroker

_names = itertools.count()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper (a missing installation fails the tests, it does not skip them)."""
    server = ZooKeeperServer(data_dir=Path(tmp_path_factory.mktemp("zookeeper")))
    with server:
        yield server


@pytest.fixture
def cluster_name() -> str:
    """A cluster name no other test uses, so tests share the server but not their nodes."""
    return f"test{next(_names)}"


@pytest.fixture
async def zk(zookeeper: ZooKeeperServer, cluster_name: str) -> AsyncIterator[ZkCoordinator]:
    """A connected coordinator with a 2-second session."""
    async with ZkCoordinator(zookeeper.address, cluster_name, session_timeout=2.0) as coordinator:
        yield coordinator


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[MockBroker]:
    """librdkafka's mock Kafka cluster in a process of its own (a missing confluent-kafka fails, not skips)."""
    with MockBroker() as broker:
        yield broker


@pytest.fixture
def new_topic(kafka_broker: MockBroker) -> Callable[[int], str]:
    """``new_topic(partitions)`` creates a topic no other test uses and returns its name."""

    def create(partitions: int) -> str:
        name = f"topic{next(_names)}"
        kafka_broker.create_topic(name, partitions)
        return name

    return create
