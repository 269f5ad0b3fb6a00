"""The SparkSession a ``SparkSink`` hands its batches to, and the lazy import of pyspark.

pyspark and pyarrow are optional (``pip install 'streamlet[spark]'``): they
are imported when a sink first needs them (pyspark here, pyarrow by core's
``import_pyarrow``, naming this extra), never when ``streamlet`` is
imported. The embedded default is one local session per process (Spark
allows one ``SparkContext`` per process), created on first use by whichever
thread gets there first.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from streamlet.errors import ConnectorError

LOCAL_MASTER = "local[*]"
INSTALL_HINT = "pip install 'streamlet[spark]'"

#: Settings of the session streamlet creates (a session passed in is used as it is).
EMBEDDED_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.shuffle.partitions": "4",  # aggregates are small: 200 shuffle partitions would be 200 tiny tasks
}
#: Added for local masters, and for a standalone master on loopback: a driver on loopback needs no resolvable
#: host name.
LOCAL_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}

_lock = threading.Lock()


def import_pyspark_sql() -> ModuleType:
    """``pyspark.sql``, or an error saying how to install it."""
    try:
        import pyspark.sql
    except ImportError as exc:
        raise ConnectorError(f"SparkSink needs pyspark, which is not installed: {INSTALL_HINT}") from exc
    return pyspark.sql


def check_java() -> None:
    """Raise a clear error when Spark cannot find Java (``JAVA_HOME``, else ``java`` on the PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        if not (Path(java_home) / "bin" / "java").exists():
            raise ConnectorError(f"Spark needs Java 17 or 21, but JAVA_HOME={java_home} has no bin/java")
        return
    if shutil.which("java") is None:
        raise ConnectorError(
            "Spark needs Java 17 or 21: JAVA_HOME is not set and no 'java' is on the PATH "
            "(on Debian: apt-get install -y openjdk-17-jre-headless)"
        )


def spark_session(master: str | None = None) -> Any:
    """The process's SparkSession, created on first use (thread-safe).

    With no ``master`` it is the embedded ``local[*]`` session: UI off, Arrow
    on, few shuffle partitions, the driver on 127.0.0.1. A ``master`` such as
    ``"spark://host:7077"`` connects to that cluster instead (with the driver
    on 127.0.0.1 too when that master is on loopback). Spark keeps one
    context per process, so the first session created wins: later calls get
    it whatever ``master`` they name.

    Example:
        >>> spark = spark_session()  # doctest: +SKIP
    """
    sql = import_pyspark_sql()
    with _lock:
        existing = _existing(sql)
        if existing is not None:
            return existing  # as it is: the builder would change the SQL settings of the user's session
        check_java()
        return _build(sql, master or LOCAL_MASTER)


def _existing(sql: ModuleType) -> Any:
    """The session this process already runs, from any thread, or ``None``."""
    from pyspark.errors import PySparkRuntimeError

    try:
        return sql.SparkSession.active()
    except PySparkRuntimeError:  # NO_ACTIVE_OR_DEFAULT_SESSION
        return None


def session_conf(master: str) -> dict[str, str]:
    """The settings streamlet gives the session it creates on ``master``.

    The driver binds to 127.0.0.1 for ``local`` masters and for standalone
    masters on loopback (``spark://127.0.0.1:7077``, ``spark://localhost:7077``).
    Executors connect back to the driver at the address it advertises, and
    when the host name resolves to loopback Spark advertises the first
    non-loopback interface instead: an address a sandbox or firewall may not
    route, and one the cluster, reached on loopback, does not need. Any other
    master gets Spark's own choice (the driver must be reachable from
    workers on other machines).
    """
    on_loopback = master.startswith("local") or _standalone_on_loopback(master)
    return dict(EMBEDDED_CONF, **(LOCAL_CONF if on_loopback else {}))


def _standalone_on_loopback(master: str) -> bool:
    """Whether ``master`` is ``spark://HOST:PORT[,HOST:PORT...]`` with every HOST on loopback."""
    if not master.startswith("spark://"):
        return False
    addresses = master.removeprefix("spark://").split(",")  # several for masters with standby (ZooKeeper)
    hosts = [(address.rpartition(":")[0] if ":" in address else address).strip("[]") for address in addresses]
    return all(_is_loopback(host) for host in hosts)


def _is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP literal; other names are not resolved (no DNS lookup for a setting)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def _build(sql: ModuleType, master: str) -> Any:
    builder = sql.SparkSession.builder.master(master).appName("streamlet")
    for key, value in session_conf(master).items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:  # py4j and pyspark raise many types; all mean "no session"
        java = os.environ.get("JAVA_HOME") or shutil.which("java")
        raise ConnectorError(f"could not start a SparkSession on {master} (Java: {java}): {exc}") from exc
