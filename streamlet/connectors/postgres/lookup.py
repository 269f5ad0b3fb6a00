"""``PostgresLookup``: the rows of a batch of keys from a PostgreSQL query, for ``Topology.lookup_join``.

One statement per batch of keys: the user's query wrapped as
``SELECT * FROM (query) AS lookup WHERE lookup.key = ANY($1)``, prepared once per
connection (asyncpg caches it), the keys sent as one array parameter. Each
``lookup_join`` instance enters :meth:`PostgresLookup.connect` for its lifetime:
a pool of connections of its own, closed when the instance ends. A lost
connection is retried for ``reconnect_within`` seconds (``connection.retrying``),
then the lookup fails with a :class:`~streamlet.errors.ConnectorError` naming the
database (its DSN, password masked) and the cause; the ``lookup_join`` instance
names itself around it. A refused statement (an unknown column, say) fails the
lookup at once, and ``on_error`` decides. ``query`` may be a table name (as for
``PostgresSource``): its rows are the lookup's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Any

from streamlet.connectors.postgres.connection import (
    CONNECT_TIMEOUT,
    RECONNECT_WITHIN,
    close_quietly,
    connect,
    connection_lost,
    quote_identifier,
    require_asyncpg,
    retrying,
)
from streamlet.connectors.postgres.source import TABLE_NAME
from streamlet.errors import ConnectorError
from streamlet.redaction import redacted

Rows = dict[Hashable, dict[str, Any]]


class PostgresLookup:
    """An async ``lookup(keys) -> {key: row}`` over ``query``'s rows, each row a dict of its columns.

    ``query`` is a ``SELECT`` or a table name (``users``, ``shop.users``: all its rows). ``key`` names the
    query's column the keys are matched against; it must be unique among the query's rows (a key with two
    rows fails the lookup: which one is meant cannot be told). ``pool_size`` connections at most per
    ``lookup_join`` instance: match the join's ``concurrency``. A database out of reach is tried again for
    ``reconnect_within`` seconds, then the lookup fails naming it.

    Example:
        >>> customers = PostgresLookup(dsn, "SELECT id, name, tier FROM customers", key="id")  # doctest: +SKIP
        >>> topology.lookup_join("customer", customers, how="left").set_input(  # doctest: +SKIP
        ...     orders, partitioning=sl.SAME_KEY
        ... )
    """

    def __init__(
        self, dsn: str, query: str, *, key: str, pool_size: int = 4, reconnect_within: float = RECONNECT_WITHIN
    ) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"PostgresLookup: query must be a SELECT statement or a table name, got {query!r:.80}")
        if not isinstance(key, str) or not key:
            raise ValueError(f"PostgresLookup: key must name a column of the query, got {key!r}")
        if type(pool_size) is not int or pool_size < 1:
            raise ValueError(f"PostgresLookup: pool_size must be a whole number >= 1, got {pool_size!r}")
        if isinstance(reconnect_within, bool) or not isinstance(reconnect_within, int | float) or reconnect_within <= 0:
            raise ValueError(f"PostgresLookup: reconnect_within must be seconds above 0, got {reconnect_within!r}")
        self.dsn, self.query, self.key, self.pool_size = dsn, query.strip().rstrip(";"), key, pool_size
        self.reconnect_within = float(reconnect_within)
        relation = f"SELECT * FROM {self.query}" if TABLE_NAME.match(self.query) else self.query
        self.statement = (
            f"SELECT * FROM ({relation}) AS streamlet_lookup WHERE streamlet_lookup.{quote_identifier(key)} = ANY($1)"
        )

    def __repr__(self) -> str:
        return f"PostgresLookup({redacted(self.dsn)!r}, {self.query!r}, key={self.key!r})"

    async def __call__(self, keys: list[Any]) -> Rows:
        """The rows of ``keys`` through a connection of its own (outside a ``lookup_join``, e.g. to try it)."""
        connection = await self._retrying(lambda: connect(self.dsn))
        try:
            return self._answer(await connection.fetch(self.statement, keys))
        finally:
            await close_quietly(connection)

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Callable[[list[Any]], Awaitable[Rows]]]:
        """This instance's lookup: a pool of up to ``pool_size`` connections, closed when it ends."""
        asyncpg = require_asyncpg()

        async def open_pool() -> Any:
            return await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size, timeout=CONNECT_TIMEOUT)

        pool = await self._retrying(open_pool)

        async def lookup(keys: list[Any]) -> Rows:
            async def fetch() -> list[Any]:
                async with pool.acquire() as connection:
                    return list(await connection.fetch(self.statement, keys))

            return self._answer(await self._retrying(fetch))

        try:
            yield lookup
        finally:
            await pool.close()

    async def _retrying(self, operation: Callable[[], Awaitable[Any]]) -> Any:
        """``operation`` tried again for ``reconnect_within`` s while the database is out of reach; then a
        :class:`ConnectorError` that says which database, for how long, and why."""
        try:
            return await retrying(operation, f"lookup {self.query!r}", self.reconnect_within)
        except Exception as exc:
            if not connection_lost(exc):
                raise
            raise ConnectorError(
                f"PostgresLookup {self.query!r}: PostgreSQL at {redacted(self.dsn)} not reachable within "
                f"{self.reconnect_within:g} s: {type(exc).__name__}: {exc}"
            ) from exc

    def _answer(self, rows: list[Any]) -> Rows:
        answer: Rows = {}
        for row in rows:
            found = dict(row)
            key = found[self.key]
            if key in answer:
                raise ConnectorError(
                    f"PostgresLookup {self.query!r}: key {key!r} has more than one row (column {self.key!r} "
                    "must be unique among the query's rows)"
                )
            answer[key] = found
        return answer
