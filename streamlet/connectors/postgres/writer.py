"""``PostgresWriter``: one ``PostgresSink`` instance's writer: it holds rows, stages them at the barrier
and moves them at the checkpoint's commit (see :mod:`.sink` for the protocol, :mod:`.links` for its
connections)."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import structlog

import streamlet.connectors.postgres.epochs as epochs
import streamlet.connectors.postgres.schema as schema
from streamlet.connectors.postgres.connection import connection_lost
from streamlet.connectors.postgres.copying import copy_rows, refused_column
from streamlet.connectors.postgres.links import WriterLinks
from streamlet.connectors.postgres.rows import DEFAULT_COLUMNS, Row, SinkSettings, picker
from streamlet.connectors.postgres.schema import Target
from streamlet.core.model.record import Batch, Records, records_of
from streamlet.core.model.sinks import ElementWriter, RestorePoint, SinkContext
from streamlet.errors import SinkError

log = structlog.get_logger("streamlet")
FIRST_THREE = operator.itemgetter(0, 1, 2)  # (key, value, ts) of any element (loop and window ones are wider)


class PostgresWriter(WriterLinks, ElementWriter):
    """One instance's writer (the protocol: see :mod:`.sink`); it takes elements, so that the default row makes no
    record object (a custom ``row`` gets records)."""

    def __init__(self, sink: SinkSettings, context: SinkContext) -> None:
        super().__init__(sink, context)
        self.pick: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
        self.rows: list[tuple[Any, ...]] = []  # this epoch's rows not copied yet
        self.keys: list[Any] = []  # their records' keys, for messages
        self.chunked = False  # the open transaction holds rows copied before the barrier (not held any more)
        self.unsure: tuple[int, int] | None = None  # (epoch, batch) whose staging commit lost its answer
        self.checkpointed = False  # restore() was called: checkpoints drive the output
        self.prepared: list[int] = []  # epochs staged with rows and not moved yet
        self.skipped = 0  # records left out under on_error="skip"
        self.refused = 0  # commits the fence refused (a replay or a zombie)

    # -- the SinkWriter hooks -----------------------------------------------------------------------

    async def write(self, batch: Batch) -> None:
        if not batch:
            return
        if self.sink.row is None:  # the default row: the elements' own (key, value, ts), no record made
            self.names = DEFAULT_COLUMNS
            self.rows.extend(map(FIRST_THREE, batch))
        else:
            self._add_rows(records_of(batch), self.sink.row)
        if len(self.rows) >= self.sink.batch_rows:
            await self._flush()

    def _add_rows(self, batch: Records, row_of: Row) -> None:
        rows, keys = self.rows, self.keys
        if self.pick is None:
            self.names = tuple(row_of(batch[0]))
            self.pick = picker(self.names)
        pick = self.pick
        for record in batch:
            rows.append(pick(row_of(record)))
            keys.append(record.key)

    async def prepare_commit(self, epoch: int) -> None:
        self.checkpointed = True  # an instance added by a rescale is told of checkpoints only here
        if not self.rows and self.open_batch is None:
            return
        await self._guarded(lambda: self._stage(epoch), f"staging checkpoint {epoch}")
        self.prepared.append(epoch)

    async def commit(self, epoch: int) -> None:
        if not any(e <= epoch for e in self.prepared):
            return  # nothing staged: no transaction needed
        await self._guarded(lambda: self._commit(epoch), f"committing checkpoint {epoch}", staging=False)
        self.prepared = [e for e in self.prepared if e > epoch]

    async def restore(self, point: RestorePoint | None) -> None:
        self.checkpointed = True
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
            await self._guarded(lambda: self._stage(None), "staging rows")
        else:
            await self._guarded(self._write_through, "writing rows")

    async def _stage(self, epoch: int | None) -> None:
        """Copy the held rows into the open transaction (opened here, with a new batch id); ``epoch``: the
        barrier's, so record the batch with it and commit. The held rows are let go only once they are in: a
        commit whose answer was lost is looked up before anything is copied again."""
        connection, target = await self._ready()
        if epoch is not None and self.unsure is not None and self.unsure[0] == epoch:
            context = self.context
            whose = (self.submission, context.node, context.index, context.attempt)
            went_in = await epochs.recorded(connection, self.unsure[1], whose, epoch, self.sink.reconnect_within)
            self.unsure = None  # answered (a lookup cut off asks again on the next try)
            if went_in:
                self.rows, self.keys = [], []  # the lost answer was a commit
                return
            if self.chunked:
                raise self._error(f"staging checkpoint {epoch}: its open transaction was lost with its rows", None)
        try:
            if self.open_batch is None:
                self.transaction = connection.transaction()
                await self.transaction.start()
                self.open_batch, self.chunked = await epochs.open_batch(connection), False
            await self._copy(connection, target)
            if epoch is None:
                self.rows, self.keys, self.chunked = [], [], True
                return
            await self._record_and_commit(connection, target, epoch)
        except BaseException:
            if not self.chunked:  # the held rows were all it had: they go again in a new transaction
                await self._forget_transaction()
            raise
        self.rows, self.keys, self.chunked = [], [], False

    async def _forget_transaction(self) -> None:
        """Roll back the open staging transaction, where the connection still has it: left open, the next
        ``start()`` on that connection would only open a savepoint inside it, and its commit would commit nothing."""
        transaction, self.transaction, self.open_batch = self.transaction, None, None
        if transaction is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(5), contextlib.suppress(Exception):
            await transaction.rollback()  # a closed connection, or one never started: nothing to undo

    async def _record_and_commit(self, connection: Any, target: Target, epoch: int) -> None:
        """Record the open batch as ``epoch``'s, in its own transaction, and commit it."""
        batch, context = self.open_batch, self.context
        assert batch is not None
        await connection.execute(
            epochs.RECORD_BATCH, batch, self.submission, context.node, context.index, context.attempt, epoch,
            target.staging,
        )  # fmt: skip
        transaction, self.transaction, self.open_batch = self.transaction, None, None
        try:
            await transaction.commit()
        except Exception as exc:
            if connection_lost(exc):
                self.unsure = (epoch, batch)  # committed or not: the retry looks
            raise

    async def _copy(self, connection: Any, target: Target) -> None:
        """The held rows into the open transaction's batch (the server adds batch and sequence); refused rows
        reported or skipped (see ``on_error``)."""
        rows, keys = self.rows, self.keys
        refused = await copy_rows(connection, target.staging, target.names, rows)
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
        async with connection.transaction():
            batch = await epochs.open_batch(connection)
            await self._copy(connection, target)
            plan = self._move(target.staging, target.names, self.context.index, self.context.attempt, 0)
            await connection.execute(epochs.insert_statement(plan), [batch])
            await connection.execute(f"DELETE FROM {target.staging} WHERE {epochs.IN_BATCHES}", [batch])
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
        if point is None and context.lineage is not None:  # from nothing: earlier attempts' staging is garbage
            await epochs.drop_lineage(connection, context.node, context.lineage, context.attempt)
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
