"""The settings of the session streamlet creates: where the driver binds, per master (no Spark started)."""

from __future__ import annotations

import pytest

from streamlet.connectors.spark_session import EMBEDDED_CONF, LOCAL_CONF, session_conf


@pytest.mark.parametrize(
    "master",
    [
        "local[*]",
        "local[2]",
        "spark://127.0.0.1:7077",
        "spark://127.0.0.2:7077",
        "spark://localhost:7077",
        "spark://[::1]:7077",
        "spark://127.0.0.1",
        "spark://127.0.0.1:7077,localhost:7078",
    ],
)
def test_local_and_loopback_masters_bind_the_driver_to_loopback(master: str) -> None:
    """Executors on this machine reach the driver at 127.0.0.1, whatever the host name resolves to."""
    assert session_conf(master) == {**EMBEDDED_CONF, **LOCAL_CONF}


@pytest.mark.parametrize(
    "master",
    ["spark://10.0.0.5:7077", "spark://spark-master:7077", "spark://127.0.0.1:7077,spark-standby:7077", "yarn"],
)
def test_other_masters_leave_the_driver_address_to_spark(master: str) -> None:
    """A worker on another machine could not reach a driver on loopback: Spark chooses (or SPARK_LOCAL_IP)."""
    assert session_conf(master) == EMBEDDED_CONF
