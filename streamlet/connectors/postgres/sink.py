"""``PostgresSink``: records into a PostgreSQL table, exactly once with checkpoints.

**With checkpoints** an epoch's rows and the epoch itself are written in one
database transaction, fenced so that a replay or a zombie commits nothing:

1. ``write`` keeps rows in memory; past ``batch_rows`` they are COPYed into
   the target's staging table (see :mod:`.schema`) inside a transaction that
   stays open for the epoch, as one batch. ``prepare_commit(e)`` (the barrier)
   COPYs the rest, records the batch as the job's submission's, the sink's,
   the instance's, this run's and epoch ``e``'s, and commits. The sink's
   sessions commit synchronously (see :func:`.links.durable_connection`).
2. ``commit(e)`` (the checkpoint is complete) moves this run's staged epochs
   up to ``e`` into the target table in one transaction that also advances
   ``streamlet_sink_epochs`` (submission, sink, instance -> last epoch, the
   run that wrote it) only where the stored epoch is older; otherwise nothing
   moves and the refusal is counted there (see :mod:`.epochs`).
3. ``restore(point)`` does the same for every instance of the run that took
   checkpoint ``point`` (a crash after the checkpoint completed but before
   its commit), then deletes what aborted runs staged.

The submission is found in ``streamlet_sink_runs``: a run restored from a
checkpoint belongs to the submission of the run that took it, a run started
afresh is a new submission; so a job started again from nothing (or removed
and submitted again under its name) starts clean. Upsert mode (``conflict``)
keeps the last row per conflict key of what one commit moves. Commits of
different instances are not ordered with each other: with several instances,
route the sink's input by ``SAME_KEY`` on the conflict key, so that each
key's rows go through one instance.

**Without checkpoints** output is at-least-once: every ``batch_rows`` rows
(and the rest at the end) go into the table in their own transaction; a
rerun writes again what a crashed run wrote. With ``conflict`` a rerun
overwrites the same rows, so the result is the same.

Errors: a value its column refuses (a wrong type, too long, NULL into NOT
NULL) is found when rows are staged, and only that record fails: a
``SinkError`` naming sink, instance, table, column and key (``on_error="fail"``,
the default), or it is logged, counted in ``skipped`` and left out
(``on_error="skip"``). An unknown table or column, a constraint failing when
rows move (a unique key in append mode, a foreign key), or a server not back
within ``reconnect_within`` seconds fail the attempt with a ``SinkError``
naming the cause: nothing is ever set aside while the database is down.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamlet.connectors.postgres.connection import RECONNECT_WITHIN, require_asyncpg
from streamlet.connectors.postgres.rows import Row, default_row
from streamlet.connectors.postgres.writer import PostgresWriter
from streamlet.core.model.sinks import ElementWriter, Sink, SinkContext
from streamlet.errors import ConnectorError

__all__ = ("PostgresSink", "PostgresWriter", "Row", "default_row")


class PostgresSink(Sink):
    """Records into ``table``: exactly once with checkpoints, at-least-once without (see the module docstring).

    Args:
        dsn: a libpq connection string or URI (``postgresql://user@host:port/database``).
        table: the target table (``name`` or ``schema.name``); it must exist.
        row: ``record -> {column: value}``; default: columns ``key``, ``value`` and ``ts``. Every row
            names the same columns.
        conflict: the columns of a unique key of the table: rows upsert (``INSERT ... ON CONFLICT DO
            UPDATE`` of the other columns), the last one per key winning; default: rows append.
        batch_rows: rows held in memory before they are copied to the server.
        on_error: what a record whose value its column refuses does: ``"fail"`` (a ``SinkError``) or
            ``"skip"`` (logged, counted, left out).
        reconnect_within: seconds to wait for a lost server before the attempt fails.

    Example:
        >>> sink = PostgresSink("postgresql://app@db/shop", "totals", conflict=["key"])
    """

    def __init__(
        self,
        dsn: str,
        table: str,
        *,
        row: Row | None = None,
        conflict: Sequence[str] | None = None,
        batch_rows: int = 10_000,
        on_error: str = "fail",
        reconnect_within: float = RECONNECT_WITHIN,
    ) -> None:
        if on_error not in ("fail", "skip"):
            raise ConnectorError(
                f"PostgresSink for table {table!r}: on_error must be 'fail' or 'skip', not {on_error!r}"
            )
        if type(batch_rows) is not int or batch_rows < 1:
            raise ConnectorError(f"PostgresSink for table {table!r}: batch_rows must be a whole number >= 1")
        if conflict is not None and (isinstance(conflict, str) or not conflict):
            raise ConnectorError(f"PostgresSink for table {table!r}: conflict must be a list of column names")
        self.dsn, self.table = dsn, table
        self.row = row  # None: the default row (see default_row), taken from the elements directly
        self.conflict = None if conflict is None else tuple(conflict)
        self.batch_rows, self.on_error, self.reconnect_within = batch_rows, on_error, reconnect_within

    def exactly_once_with_checkpoints(self) -> bool:
        """Staged per checkpoint, moved into the table when it completes."""
        return True

    def open(self, context: SinkContext) -> ElementWriter:
        """A writer for instance ``context.index``; it connects on first use."""
        require_asyncpg()
        return PostgresWriter(self, context)
