"""The connection side of a ``PostgresSink`` writer: its two connections, the resolved target, the run's
submission, and ``_guarded`` (retries within ``reconnect_within``; what fails becomes a ``SinkError``).

Split from :mod:`.writer` (which stages and moves rows) so each stays small; :class:`WriterLinks` is the
base class of ``PostgresWriter`` and holds only the state these methods need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlet.connectors.postgres.schema as schema
from streamlet.connectors.postgres.connection import (
    close_quietly,
    connect,
    connection_lost,
    require_asyncpg,
    retrying,
)
from streamlet.connectors.postgres.rows import SinkSettings
from streamlet.connectors.postgres.schema import Target
from streamlet.core.model.sinks import SinkContext
from streamlet.errors import SinkError
from streamlet.redaction import redacted


async def durable_connection(dsn: str, name: str) -> Any:
    """A connection whose commits are flushed before they are acknowledged: where the server's
    ``synchronous_commit`` is ``off``, a commit it acknowledged can vanish in a server crash, and a staged
    epoch that vanishes after its checkpoint completed would move nothing (rows lost). Stricter settings
    (``local``, ``on``, ``remote_*``) are kept."""
    connection = await connect(dsn, name)
    try:
        if await connection.fetchval("SHOW synchronous_commit") == "off":
            await connection.execute("SET synchronous_commit = on")
    except BaseException:
        await close_quietly(connection)
        raise
    return connection


class WriterLinks:
    """A writer's connections, target and submission (see the module docstring)."""

    def __init__(self, sink: SinkSettings, context: SinkContext) -> None:
        self.sink, self.context = sink, context
        self.what = f"sink '{context.node}' instance {context.index}"
        # Two connections: staging holds a transaction open across an epoch, while the coordinator's
        # commits (moves) of earlier epochs run concurrently and must commit on their own.
        self.stager: Any = None
        self.mover: Any = None
        self.target: Target | None = None
        self.names: tuple[str, ...] = ()  # the columns rows name (those of the first row)
        self.open_batch: int | None = None  # the batch of the staging transaction still open
        self.transaction: Any = None
        self.submission: str | None = None

    async def _submission(self, connection: Any, restored: str | None) -> str:
        """The submission this run belongs to, recorded for the runs that will restore from it."""
        job, sink, run = self.context.job_id, self.context.node, self.context.attempt
        found = None
        if restored is not None:
            found = await connection.fetchval(
                f"SELECT submission FROM {schema.RUNS} WHERE job = $1 AND sink = $2 AND run = $3", job, sink, restored
            )
        await connection.execute(
            f"INSERT INTO {schema.RUNS} (job, sink, run, submission) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            job, sink, run, found or f"{job}/{run}",
        )  # fmt: skip
        submission: str = await connection.fetchval(
            f"SELECT submission FROM {schema.RUNS} WHERE job = $1 AND sink = $2 AND run = $3", job, sink, run
        )
        return submission

    # -- the connection -----------------------------------------------------------------------------

    async def _stager(self) -> Any:
        if self.stager is not None and self.stager.is_closed() and self.open_batch is not None:
            raise self._error("staging: the connection closed under the open transaction: its rows are gone", None)
        if self.stager is None or self.stager.is_closed():
            self.stager = await durable_connection(self.sink.dsn, f"streamlet {self.what}")
        return self.stager

    async def _mover(self) -> Any:
        if self.mover is None or self.mover.is_closed():
            self.mover = await durable_connection(self.sink.dsn, f"streamlet {self.what}")
        return self.mover

    async def _ready(self, connection: Any = None) -> tuple[Any, Target]:
        """The staging connection (or ``connection``), the resolved target and its staging table (made on
        first use)."""
        connection = connection or await self._stager()
        if self.target is None:
            await schema.ensure_own_tables(connection)
            self.target = await self._resolve(connection)
            await schema.ensure_staging(connection, self.target)
        if self.submission is None:  # no restore: no checkpoints (or an instance a rescale added)
            self.submission = await self._submission(connection, None)
        return connection, self.target

    async def _resolve(self, connection: Any) -> Target:
        """The target table and the written columns, checked against the catalog."""
        exceptions = require_asyncpg().exceptions
        try:
            table, columns = await schema.table_columns(connection, self.sink.table)
        except exceptions.UndefinedTableError as exc:
            raise self._error(f"writing to table {self.sink.table!r}: it does not exist", exc) from exc
        except (exceptions.InvalidNameError, exceptions.PostgresSyntaxError) as exc:  # 'my table', 'a.b.c.d'
            # the one statement here is "SELECT $1::regclass": a syntax error in it is the name's
            why = "it is no table name PostgreSQL reads (name or schema.name; quote what needs it, '\"My Table\"')"
            raise self._error(f"writing to table {self.sink.table!r}: {why}", exc) from exc
        names = self.names
        unknown = [name for name in (*names, *(self.sink.conflict or ())) if name not in columns]
        if unknown:
            raise self._error(
                f"writing to table {table}: it has no column {unknown[0]!r} (it has {sorted(columns)})", None
            )
        return Target(table, tuple(columns[name] for name in names))

    async def _guarded(self, operation: Callable[[], Any], doing: str, staging: bool = True) -> None:
        """Run ``operation`` on the staging connection (or the mover's), reconnecting within the bound; what
        fails becomes a ``SinkError`` saying why. Rows copied into a staging transaction the server lost are
        gone with it: that fails at once (the job restores its last checkpoint and replays them)."""

        async def attempt() -> None:
            if staging and self.open_batch is not None and self.stager is None:
                raise self._error(f"lost the connection while {doing}: the open transaction's rows are gone", None)
            try:
                await operation()
            except Exception as exc:
                if connection_lost(exc):  # the next try connects afresh
                    await self._drop(staging)
                raise

        try:
            await retrying(attempt, self.what, self.sink.reconnect_within)
        except SinkError:
            raise
        except Exception as exc:
            await self._release()
            if connection_lost(exc):
                bound = self.sink.reconnect_within
                cause = f"PostgreSQL at {redacted(self.sink.dsn)} not reachable within {bound:g} s"
                raise self._error(f"{cause} while {doing}", exc) from exc
            raise self._error(f"{doing}", exc) from exc

    def _error(self, doing: str, exc: BaseException | None) -> SinkError:
        cause = "" if exc is None else f": {type(exc).__name__}: {exc}"
        return SinkError(f"{self.what} failed {doing}{cause}", sink=self.context.node, instance=self.context.index)

    async def _drop(self, staging: bool) -> None:
        """Forget the staging (or the mover's) connection after its server went away."""
        if staging:
            lost, self.stager = self.stager, None
        else:
            lost, self.mover = self.mover, None
        await close_quietly(lost)

    async def _release(self) -> None:
        stager, mover, self.stager, self.mover = self.stager, self.mover, None, None
        self.transaction, self.open_batch = None, None
        await close_quietly(stager)
        await close_quietly(mover)
