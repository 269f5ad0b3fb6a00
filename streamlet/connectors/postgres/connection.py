"""What the PostgreSQL connectors share: the asyncpg import, connecting within a bound, telling a lost
connection from a refused statement, and naming a server without its password.

asyncpg is imported only when a connector is opened, so ``import streamlet`` works without it. A lookup
(``PostgresLookup``) reuses :func:`connect` and :func:`connection_lost` as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, TypeVar

import anyio
import structlog

from streamlet.errors import ConnectorError

log = structlog.get_logger("streamlet")

INSTALL_HINT = "the PostgreSQL connectors need asyncpg: pip install 'streamlet[postgres]'"
RECONNECT_WITHIN = 30.0  # seconds a connector waits for a lost server to come back before it fails
CONNECT_TIMEOUT = 10.0  # seconds one connection attempt may take
FIRST_RETRY = 0.05  # seconds before the first reconnection attempt; it doubles up to MAX_RETRY
MAX_RETRY = 2.0

T = TypeVar("T")


def require_asyncpg() -> ModuleType:
    """The ``asyncpg`` module, or a ``ConnectorError`` naming the extra to install."""
    try:
        import asyncpg
    except ImportError as exc:
        raise ConnectorError(INSTALL_HINT) from exc
    module: ModuleType = asyncpg
    return module


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the server is unreachable or went away (retry), not that it refused a statement."""
    if isinstance(exc, OSError | asyncio.TimeoutError | TimeoutError):
        return True
    asyncpg = require_asyncpg()
    exceptions = asyncpg.exceptions
    lost = (
        exceptions.PostgresConnectionError,  # class 08
        exceptions.ConnectionDoesNotExistError,
        exceptions.CannotConnectNowError,  # starting up or shutting down
        exceptions.AdminShutdownError,
        exceptions.CrashShutdownError,
        exceptions.TooManyConnectionsError,
        # the client's protocol state broken: a server that ended the session mid-operation (asyncpg has not
        # yet seen the socket close) leaves it so; the connection is as good as lost
        exceptions.InternalClientError,
    )
    if isinstance(exc, lost):
        return True
    return isinstance(exc, exceptions.InterfaceError) and "connection is closed" in str(exc)


async def connect(dsn: str, name: str = "streamlet", **options: Any) -> Any:
    """One asyncpg connection to ``dsn``, named ``name`` in ``pg_stat_activity`` (its ``application_name``;
    ``options`` go to ``asyncpg.connect``)."""
    asyncpg = require_asyncpg()
    settings = {"application_name": name[:63], **options.pop("server_settings", {})}
    return await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT, server_settings=settings, **options)


async def close_quietly(connection: Any) -> None:
    """Close ``connection`` (abort it when the server is gone), never raising."""
    if connection is None or connection.is_closed():
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
        try:
            await connection.close(timeout=2)
        except Exception:  # noqa: BLE001 - the server is gone or the socket broken: drop it
            connection.terminate()


async def retrying(operation: Callable[[], Awaitable[T]], what: str, within: float = RECONNECT_WITHIN) -> T:
    """``await operation()``, again after a lost connection (it must reconnect itself), for up to
    ``within`` seconds; then the last connection error is raised. Any other error is raised at once."""
    delay = FIRST_RETRY
    deadline = anyio.current_time() + within
    while True:
        try:
            return await operation()
        except Exception as exc:
            if not connection_lost(exc) or anyio.current_time() + delay > deadline:
                raise
            log.warning("postgres connection lost, retrying", what=what, error=repr(exc), retry_in=delay)
        await anyio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY)


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (``a"b`` -> ``"a""b"``)."""
    return '"' + name.replace('"', '""') + '"'
