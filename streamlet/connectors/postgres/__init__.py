"""PostgreSQL connectors (asyncpg): ``PostgresSink`` (exactly once with checkpoints) and ``PostgresSource``
(a resumable incremental query)."""

from streamlet.connectors.postgres.sink import PostgresSink

__all__ = ("PostgresSink",)
