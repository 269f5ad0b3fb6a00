"""The tests' PostgreSQL: a fresh database per test on the session's server, and synchronous helpers to
set tables up and read them back (through asyncpg, in a loop of their own)."""

from __future__ import annotations

import itertools
from typing import Any

import anyio

from streamlet.testing.postgres_server import PostgresServer

_databases = itertools.count()


async def _run(dsn: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg  # here: a session without PostgreSQL tests needs no asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        if args or sql.lstrip().upper().startswith(("SELECT", "WITH")):
            return [tuple(row) for row in await connection.fetch(sql, *args)]
        await connection.execute(sql)
        return []
    finally:
        await connection.close()


def sql(dsn: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run ``statement`` on ``dsn``; its rows as tuples (none for a statement without a result)."""
    return anyio.run(_run, dsn, statement, *args)


def fresh_database(server: PostgresServer) -> str:
    """A new, empty database on ``server`` (owned by the superuser); its DSN."""
    name = f"t{next(_databases)}"
    sql(server.dsn(), f"CREATE DATABASE {name}")
    return server.dsn(name)


def refusals(dsn: str) -> int:
    """How many commits the sinks' fences refused, over every sink of every job in the database."""
    [(count,)] = sql(dsn, "SELECT coalesce(sum(refused), 0)::bigint FROM streamlet_sink_epochs")
    return int(count)
