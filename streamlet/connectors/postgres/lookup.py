"""``PostgresLookup``: the rows of a batch of keys from a PostgreSQL query, for ``Topology.lookup_join``.

One statement per batch of keys: the user's query wrapped as
``SELECT * FROM (query) AS lookup WHERE lookup.key = ANY($1)``, prepared once per
connection (asyncpg caches it), the keys sent as one array parameter. Each
``lookup_join`` instance enters :meth:`PostgresLookup.connect` for its lifetime:
a pool of connections of its own, closed when the instance ends. A lost
connection is retried within a bound (``connection.retrying``); a refused
statement (an unknown column, say) fails the lookup, and ``on_error`` decides.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Any

from streamlet.connectors.postgres.connection import (
    CONNECT_TIMEOUT,
    close_quietly,
    connect,
    quote_identifier,
    require_asyncpg,
    retrying,
)
from streamlet.errors import ConnectorError
from streamlet.redaction import redacted

Rows = dict[Hashable, dict[str, Any]]


class PostgresLookup:
    """An async ``lookup(keys) -> {key: row}`` over ``query``'s rows, each row a dict of its columns.

    ``key`` names the query's column the keys are matched against; it must be unique among the query's
    rows (a key with two rows fails the lookup: which one is meant cannot be told). ``pool_size``
    connections at most per ``lookup_join`` instance: match the join's ``concurrency``.

    Example:
        >>> customers = PostgresLookup(dsn, "SELECT id, name, tier FROM customers", key="id")  # doctest: +SKIP
        >>> topology.lookup_join("customer", customers, how="left").set_input(  # doctest: +SKIP
        ...     orders, partitioning=sl.SAME_KEY
        ... )
    """

    def __init__(self, dsn: str, query: str, *, key: str, pool_size: int = 4) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"PostgresLookup: query must be a SELECT statement, got {query!r:.80}")
        if not isinstance(key, str) or not key:
            raise ValueError(f"PostgresLookup: key must name a column of the query, got {key!r}")
        if type(pool_size) is not int or pool_size < 1:
            raise ValueError(f"PostgresLookup: pool_size must be a whole number >= 1, got {pool_size!r}")
        self.dsn, self.query, self.key, self.pool_size = dsn, query.strip().rstrip(";"), key, pool_size
        self.statement = (
            f"SELECT * FROM ({self.query}) AS streamlet_lookup WHERE streamlet_lookup.{quote_identifier(key)} = ANY($1)"
        )

    def __repr__(self) -> str:
        return f"PostgresLookup({redacted(self.dsn)!r}, {self.query!r}, key={self.key!r})"

    async def __call__(self, keys: list[Any]) -> Rows:
        """The rows of ``keys`` through a connection of its own (outside a ``lookup_join``, e.g. to try it)."""
        connection = await retrying(lambda: connect(self.dsn), f"lookup {self.query!r}")
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

        pool = await retrying(open_pool, f"lookup {self.query!r}")

        async def lookup(keys: list[Any]) -> Rows:
            async def fetch() -> list[Any]:
                async with pool.acquire() as connection:
                    return list(await connection.fetch(self.statement, keys))

            return self._answer(await retrying(fetch, f"lookup {self.query!r}"))

        try:
            yield lookup
        finally:
            await pool.close()

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
