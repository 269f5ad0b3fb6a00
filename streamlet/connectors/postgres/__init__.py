"""PostgreSQL connectors (asyncpg): ``PostgresSink`` (exactly once with checkpoints), ``PostgresSource``
(a resumable incremental query) and ``PostgresLookup`` (rows by key, for ``lookup_join``)."""

from streamlet.connectors.postgres.lookup import PostgresLookup
from streamlet.connectors.postgres.sink import PostgresSink
from streamlet.connectors.postgres.source import PostgresSource

__all__ = ("PostgresLookup", "PostgresSink", "PostgresSource")
