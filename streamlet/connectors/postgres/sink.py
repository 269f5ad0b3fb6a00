"""``PostgresSink``: records into a PostgreSQL table, exactly once with checkpoints.

**With checkpoints** an epoch's rows and the epoch itself are written in one
database transaction, fenced so that a replay or a zombie commits nothing:

1. ``write`` keeps rows in memory; past ``batch_rows`` they are COPYed into
   the target's staging table (see :mod:`.schema`) inside a transaction that
   stays open for the epoch. ``prepare_commit(e)`` (the barrier) COPYs the
   rest, tagged with the job's submission, the sink, the instance, this run
   and epoch ``e``, and commits.
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

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

import streamlet.connectors.postgres.epochs as epochs
import streamlet.connectors.postgres.schema as schema
from streamlet.connectors.postgres.connection import (
    RECONNECT_WITHIN,
    close_quietly,
    connect,
    connection_lost,
    redacted,
    require_asyncpg,
    retrying,
)
from streamlet.connectors.postgres.copying import copy_rows, refused_column
from streamlet.connectors.postgres.schema import Target
from streamlet.core.model.record import Batch, Record, Records, records_of
from streamlet.core.model.sinks import ElementWriter, RestorePoint, Sink, SinkContext
from streamlet.errors import ConnectorError, SinkError

log = structlog.get_logger("streamlet")

Row = Callable[[Record], Mapping[str, Any]]
DEFAULT_COLUMNS = ("key", "value", "ts")


def default_row(record: Record) -> Mapping[str, Any]:
    """``{"key": ..., "value": ..., "ts": ...}``: the record as three columns."""
    return {"key": record.key, "value": record.value, "ts": record.ts}


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

    def open(self, context: SinkContext) -> ElementWriter:
        """A writer for instance ``context.index``; it connects on first use."""
        require_asyncpg()
        return PostgresWriter(self, context)


class PostgresWriter(ElementWriter):
    """One instance's writer (see the module docstring); it takes elements, so that the default row makes no
    record object (a custom ``row`` gets records)."""

    def __init__(self, sink: PostgresSink, context: SinkContext) -> None:
        self.sink, self.context = sink, context
        self.what = f"sink '{context.node}' instance {context.index}"
        # Two connections: staging holds a transaction open across an epoch, while the coordinator's
        # commits (moves) of earlier epochs run concurrently and must commit on their own.
        self.stager: Any = None
        self.mover: Any = None
        self.target: Target | None = None
        self.pick: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
        self.names: tuple[str, ...] = ()  # the columns rows name (those of the first row)
        self.rows: list[tuple[Any, ...]] = []  # this epoch's rows not copied yet
        self.keys: list[Any] = []  # their records' keys, for messages
        self.open_epoch: int | None = None  # the tag of rows copied in the transaction still open
        self.transaction: Any = None
        self.chunked = False  # the open transaction holds rows copied before the barrier (not held any more)
        self.unsure: int | None = None  # the epoch whose staging commit lost its answer
        self.checkpointed = False  # restore() was called: checkpoints drive the output
        self.submission: str | None = None
        self.next_epoch = 1  # the epoch rows copied before their barrier are tagged with (a guess, fixed later)
        self.prepared: list[int] = []  # epochs staged with rows and not moved yet
        self.seq = 0
        self.skipped = 0  # records left out under on_error="skip"
        self.refused = 0  # commits the fence refused (a replay or a zombie)

    # -- the SinkWriter hooks -----------------------------------------------------------------------

    async def write(self, batch: Batch) -> None:
        if not batch:
            return
        if self.sink.row is None:  # the default row: the elements' own (key, value, ts), no record made
            self.names = DEFAULT_COLUMNS
            if all(len(element) == 3 for element in batch):
                self.rows.extend(batch)
            else:  # loop or window elements (six wide): their first three fields
                self.rows.extend(element[:3] for element in batch)
        else:
            self._add_rows(records_of(batch), self.sink.row)
        if len(self.rows) >= self.sink.batch_rows:
            await self._flush()

    def _add_rows(self, batch: Records, row_of: Row) -> None:
        rows, keys = self.rows, self.keys
        if self.pick is None:
            self.names = tuple(row_of(batch[0]))
            self.pick = _picker(self.names)
        pick = self.pick
        for record in batch:
            rows.append(pick(row_of(record)))
            keys.append(record.key)

    async def prepare_commit(self, epoch: int) -> None:
        self.checkpointed = True  # an instance added by a rescale is told of checkpoints only here
        if not self.rows and self.open_epoch is None:
            self.next_epoch = epoch + 1
            return
        await self._guarded(lambda: self._stage(epoch, final=True), f"staging checkpoint {epoch}")
        self.prepared.append(epoch)
        self.next_epoch = epoch + 1

    async def commit(self, epoch: int) -> None:
        if not any(e <= epoch for e in self.prepared):
            return  # nothing staged: no transaction needed
        await self._guarded(lambda: self._commit(epoch), f"committing checkpoint {epoch}", staging=False)
        self.prepared = [e for e in self.prepared if e > epoch]

    async def restore(self, point: RestorePoint | None) -> None:
        self.checkpointed = True
        if point is not None:
            self.next_epoch = point.epoch + 1
        await self._guarded(lambda: self._restore(point), "restoring", staging=False)

    async def close(self) -> None:
        try:
            if self.rows and not self.checkpointed:
                await self._flush()
        finally:
            await self._release()

    async def abort(self) -> None:
        await self._release()

    # -- staging and moving -------------------------------------------------------------------------

    async def _flush(self) -> None:
        """``batch_rows`` rows are held: copy them (into staging, or straight through without checkpoints)."""
        if self.checkpointed:
            epoch = self.open_epoch if self.open_epoch is not None else self.next_epoch
            await self._guarded(lambda: self._stage(epoch, final=False), "staging rows")
        else:
            await self._guarded(self._write_through, "writing rows")

    async def _stage(self, epoch: int, final: bool) -> None:
        """Copy the held rows tagged ``epoch`` into the open transaction (opened here); ``final``: it is
        the barrier's epoch, so retag rows copied under a guess, and commit. The held rows are let go only
        once they are in: a commit whose answer was lost is looked up before anything is copied again."""
        connection, target = await self._ready()
        if final and self.unsure == epoch:
            self.unsure = None
            if await self._staged(connection, target, epoch):
                self.rows, self.keys = [], []  # the lost answer was a commit
                return
            if self.chunked:
                raise self._error(f"staging checkpoint {epoch}: its open transaction was lost with its rows", None)
        fresh = self.open_epoch is None
        if fresh:
            self.transaction = connection.transaction()
            await self.transaction.start()
            self.open_epoch, self.chunked = epoch, False
        try:
            await self._copy(connection, target, epoch)
        except BaseException:
            if fresh:  # nothing else was in it: the held rows can go again in a new one
                self.transaction, self.open_epoch = None, None
            raise
        if not final:
            self.rows, self.keys, self.chunked = [], [], True
            return
        if self.open_epoch != epoch:  # rows copied before the barrier were tagged with a wrong guess
            await connection.execute(
                f"UPDATE {target.staging} SET sl_epoch = $1 WHERE sl_submission = $2 AND sl_sink = $3 "
                "AND sl_instance = $4 AND sl_attempt = $5 AND sl_epoch = $6",
                epoch, self.submission, self.context.node, self.context.index, self.context.attempt,
                self.open_epoch,
            )  # fmt: skip
        transaction, self.transaction, self.open_epoch = self.transaction, None, None
        try:
            await transaction.commit()
        except Exception as exc:
            if connection_lost(exc):
                self.unsure = epoch  # committed or not: the retry looks
            raise
        self.rows, self.keys, self.chunked = [], [], False

    async def _staged(self, connection: Any, target: Target, epoch: int) -> bool:
        """Whether this run's rows of ``epoch`` are in staging (a commit went through)."""
        found = await connection.fetchval(
            f"SELECT 1 FROM {target.staging} WHERE sl_submission = $1 AND sl_sink = $2 AND sl_instance = $3 "
            "AND sl_attempt = $4 AND sl_epoch = $5 LIMIT 1",
            self.submission, self.context.node, self.context.index, self.context.attempt, epoch,
        )  # fmt: skip
        return found is not None

    async def _copy(self, connection: Any, target: Target, epoch: int) -> None:
        """The held rows into staging, tagged; refused rows reported or skipped (see ``on_error``)."""
        rows, keys = self.rows, self.keys
        context, seq = self.context, self.seq
        tag = (self.submission, context.node, context.index, context.attempt, epoch)
        tagged = [(*tag, seq + n, *row) for n, row in enumerate(rows)]
        refused = await copy_rows(connection, target.staging, (*schema.META, *target.names), tagged)
        self.seq = seq + len(rows)
        for bad in refused:
            key = keys[bad.index] if keys else rows[bad.index][0]  # the default row's first column is the key
            await self._refused_row(connection, target, rows[bad.index], key, bad.error)

    async def _refused_row(self, connection: Any, target: Target, row: Any, key: Any, error: BaseException) -> None:
        types = [column.type for column in target.columns]
        column = await refused_column(connection, error, target.names, types, row)
        message = (
            f"{self.what} failed writing the record with key {key!r} to table {target.table}: "
            f"column {column!r} refused its value: {type(error).__name__}: {error}"
        )
        if self.sink.on_error == "fail":
            raise SinkError(message, sink=self.context.node, instance=self.context.index, key=key) from error
        self.skipped += 1
        log.warning("postgres sink skipped a record", sink=self.context.node, instance=self.context.index,
                    key=key, table=target.table, column=column, error=str(error))  # fmt: skip

    async def _write_through(self) -> None:
        """No checkpoints: stage the held rows and move them at once, in one transaction (at-least-once)."""
        connection, target = await self._ready()
        run = self.context.attempt
        async with connection.transaction():
            await self._copy(connection, target, 0)
            plan = self._move(target.staging, target.names, self.context.index, run, 0)
            await connection.execute(epochs.insert_statement(plan), self.submission, plan.sink, plan.instance, run, 0)
            await connection.execute(epochs.CLEAN_MOVED, self.submission, plan.sink, plan.instance, 0)
        self.rows, self.keys = [], []  # in: a lost answer writes them again (at-least-once)

    async def _commit(self, epoch: int) -> None:
        connection, target = await self._ready(await self._mover())
        plan = self._move(target.staging, target.names, self.context.index, self.context.attempt, epoch)
        if not await epochs.move(connection, plan):
            self._count_refusal(plan)

    async def _restore(self, point: RestorePoint | None) -> None:
        connection = await self._mover()
        await schema.ensure_own_tables(connection)
        context = self.context
        restored = None if point is None else point.attempt
        self.submission = await self._submission(connection, restored)
        if point is None or restored is None:
            return
        found = await epochs.staged_instances(connection, self.submission, context.node, restored, point.epoch)
        for staging, instance in found:
            columns = await schema.staging_columns(connection, staging)
            plan = self._move(staging, columns, instance, restored, point.epoch)
            if not await epochs.move(connection, plan):
                self._count_refusal(plan)
        await epochs.drop_aborted(connection, self.submission, context.node, [context.attempt], restored, point.epoch)

    def _move(self, staging: str, columns: Sequence[str], instance: int, staged_by: str, epoch: int) -> epochs.Move:
        assert self.submission is not None
        table = self.target.table if self.target is not None else self.sink.table
        return epochs.Move(
            self.submission, self.context.node, instance, staged_by, epoch, staging, table, tuple(columns),
            self.sink.conflict, self.context.attempt,
        )  # fmt: skip

    def _count_refusal(self, plan: epochs.Move) -> None:
        self.refused += 1
        log.warning("postgres sink commit refused: a newer epoch is in already (a replay or a zombie)",
                    sink=plan.sink, instance=plan.instance, epoch=plan.epoch, run=plan.mover)  # fmt: skip

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
        if self.stager is not None and self.stager.is_closed() and self.open_epoch is not None:
            raise self._error("staging: the connection closed under the open transaction: its rows are gone", None)
        if self.stager is None or self.stager.is_closed():
            self.stager = await connect(self.sink.dsn, f"streamlet {self.what}")
        return self.stager

    async def _mover(self) -> Any:
        if self.mover is None or self.mover.is_closed():
            self.mover = await connect(self.sink.dsn, f"streamlet {self.what}")
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
            if staging and self.open_epoch is not None and self.stager is None:
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
        self.transaction, self.open_epoch = None, None
        await close_quietly(stager)
        await close_quietly(mover)


def _picker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``mapping -> tuple of its values for names`` (C speed: ``operator.itemgetter``)."""
    if not names:
        raise ConnectorError("PostgresSink: row() returned no columns")
    getter = operator.itemgetter(*names)
    if len(names) > 1:
        return getter
    return lambda mapping: (getter(mapping),)
