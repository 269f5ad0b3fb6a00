"""PostgreSQL connectors (asyncpg): ``PostgresSink`` (exactly once with checkpoints) and ``PostgresSource``
(a resumable incremental query)."""

from streamlet.connectors.postgres.sink import PostgresSink
from streamlet.connectors.postgres.source import PostgresSource

__all__ = ("PostgresSink", "PostgresSource")
