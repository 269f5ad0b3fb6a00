"""Spark: ``SparkSink`` hands aggregate records to a SparkSession, an epoch at a time, through Arrow.

Each record becomes a row: ``key``, ``value`` (or one column per field when
the values are dicts), ``ts``, ``epoch``, and ``window_start``/``window_end``
when the records come from a window (``window_reduce`` or a windowed task).
An epoch's rows become one ``pyarrow.Table`` and one DataFrame
(``spark.createDataFrame(table)``), never one Python row at a time. Arrow
batches of the columnar operators (``aggregate``, ``where``, a
``ColumnarSource``) arrive as they are and become the same rows column by
column: the key column as ``key``, the value column as ``value`` (without
one, every other column as its own), the ts column as ``ts``.

When rows reach Spark:

- **With checkpoints**, once per checkpoint epoch. ``prepare_commit(epoch)``
  (the barrier reached the sink) seals the rows received since the previous
  barrier as the epoch's staging directory of Arrow IPC files, fsynced;
  ``commit(epoch)`` (the checkpoint is saved) hands them to Spark and then
  deletes them. A restore from checkpoint ``E`` hands over what was sealed
  for epochs up to ``E`` and not yet handed (a crash after the checkpoint
  was saved but before Spark wrote), and discards the rest.
- **Without checkpoints**, once, when the input ends, as epoch 0.

Where rows go (exactly one of):

- ``path``: ``<path>/epoch=<N>/instance=<I>/`` written with mode
  ``overwrite``, so handing over an epoch twice replaces it: a replayed epoch
  never duplicates rows. Reading ``<path>`` back through Spark gives the
  ``epoch`` and ``instance`` columns by partition discovery. Staging lives in
  ``<path>/_staging/<sink name>/<attempt>`` (Spark ignores names starting with
  ``_``; each run of the job stages apart, and a restore hands over only what
  the run that took the checkpoint sealed). A restore
  also deletes this instance's partitions of epochs after the checkpoint
  (all of them when the job starts without one), so the output is that of
  exactly one run.
- ``table``: a table in the session's catalog, partitioned by ``epoch`` and
  ``instance``, created by the first write; each epoch is an
  ``INSERT OVERWRITE ... PARTITION (epoch=N, instance=I)``, idempotent too.
- ``fn``: ``fn(dataframe, epoch)`` is called, like Spark's ``foreachBatch``.
  A restore may call it again for an epoch it already saw: make it
  idempotent by epoch.

Flow control: one Spark write at a time per sink instance, awaited through a
thread (``anyio.to_thread``), never on the event loop. The coordinator awaits
it before the next checkpoint can complete, and while it runs a sink that
holds ``max_rows`` rows in memory waits too, so the wait reaches back to the
sources. Beyond ``max_rows``, rows of the current epoch spill to the staging
directory, so memory stays bounded.

Remaining limits:

- With ``table`` or ``fn``, staging is durable only with ``staging_dir``;
  without it, rows are staged in a temporary directory and an epoch sealed
  but not yet handed over when the process dies is lost.
- A rerun of a job that *finished* continues the epoch numbers, so the new
  run's rows come in addition to the old run's; use a fresh ``path``.
  A restore does not delete later epochs from a ``table``.
- Output is exactly-once when the replay is deterministic per epoch, as for
  ``FileSink``; a column must keep one type across epochs (Parquet files
  whose types disagree cannot be read as one table).
- Window bounds are lost inside a cycle (a record in a loop carries its
  iteration count instead).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeAlias

import anyio

from streamlet.connectors.spark_rows import (
    columns_to_arrow,
    read_chunks,
    remove,
    seal,
    to_arrow,
    with_epoch,
    write_tables,
)
from streamlet.connectors.spark_session import spark_session
from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.record import Batch
from streamlet.core.model.sinks import ElementWriter, RestorePoint, Sink, SinkContext
from streamlet.errors import ConnectorError

STAGING = "_staging"
_table_lock = threading.Lock()  # creating a table and the temporary views: one instance at a time


class SparkSink(Sink):
    """Aggregate records to Spark, one DataFrame per checkpoint epoch (see the module docstring).

    Args:
        path: directory to write ``format`` files to, partitioned by ``epoch`` and ``instance``.
        table: a catalog table to write to instead.
        fn: ``fn(dataframe, epoch)`` to call instead of writing.
        format: the Spark data source for ``path`` and ``table`` (``"parquet"``, ``"orc"``, ``"json"``).
        master: the Spark master of the session streamlet creates (default ``local[*]``).
        session: an existing ``SparkSession`` to use instead.
        staging_dir: where epochs are staged (default ``<path>/_staging``; a temporary one otherwise).
        max_rows: rows an instance keeps in memory before spilling them to the staging directory.

    Example:
        >>> sink = SparkSink("out/sums")  # topology.add_sink("to-spark", sink).set_input(sums)
    """

    takes_columns: ClassVar[bool] = True  # Arrow batches of the columnar operators become rows column by column

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        table: str | None = None,
        fn: Callable[[Any, int], Any] | None = None,
        format: str = "parquet",  # shadows the builtin: the name Spark uses
        master: str | None = None,
        session: Any = None,
        staging_dir: str | os.PathLike[str] | None = None,
        max_rows: int = 100_000,
    ) -> None:
        given = [name for name, value in (("path", path), ("table", table), ("fn", fn)) if value is not None]
        if len(given) != 1:
            raise ValueError(f"SparkSink needs exactly one of path, table or fn; got {given or 'none'}")
        if max_rows < 1:
            raise ValueError(f"SparkSink max_rows must be >= 1, got {max_rows!r}")
        self.path = None if path is None else Path(path)
        self.table = table
        self.fn = fn
        self.format = format
        self.master = master
        self.session = session
        default_staging = None if self.path is None else self.path / STAGING
        self.staging_dir = Path(staging_dir) if staging_dir is not None else default_staging
        self.max_rows = max_rows

    def open(self, context: SinkContext) -> ElementWriter:
        """A writer for instance ``context.index``."""
        return _SparkWriter(self, context)

    def spark(self) -> Any:
        """The SparkSession batches go to (created on first use unless one was given)."""
        return self.session if self.session is not None else spark_session(self.master)

    def hand_over(self, rows: Any, epoch: int, index: int) -> None:
        """Give one epoch's rows (a ``pyarrow.Table`` with ``epoch``) of instance ``index`` to Spark."""
        spark = self.spark()
        if self.fn is not None:
            self.fn(spark.createDataFrame(rows), epoch)
        elif self.table is not None:
            _insert_overwrite(spark, self.table, self.format, rows, epoch, index)
        else:
            frame = spark.createDataFrame(rows.drop_columns(["epoch"]))  # epoch and instance: the directory names
            frame.write.mode("overwrite").format(self.format).save(str(self.partition(epoch, index)))

    def partition(self, epoch: int, index: int) -> Path:
        """The directory of ``epoch`` written by instance ``index`` (``path`` only)."""
        assert self.path is not None
        return self.path / f"epoch={epoch}" / f"instance={index}"

    def forget_after(self, epoch: int | None, index: int) -> None:
        """Delete instance ``index``'s partitions of epochs after ``epoch`` (all when ``None``)."""
        if self.path is None:
            return
        for directory in self.path.glob(f"epoch=*/instance={index}"):
            written = int(directory.parent.name.removeprefix("epoch="))
            if epoch is None or written > epoch:
                shutil.rmtree(directory)
                if not any(directory.parent.iterdir()):
                    directory.parent.rmdir()


def _insert_overwrite(spark: Any, table: str, format_: str, rows: Any, epoch: int, index: int) -> None:
    """Replace partition ``(epoch, index)`` of ``table`` with ``rows``, creating the table if needed."""
    frame = spark.createDataFrame(rows.drop_columns(["epoch"]))
    view = f"streamlet_epoch_{epoch}_{index}_{threading.get_ident()}"
    with _table_lock:
        if not spark.catalog.tableExists(table):
            empty = frame.selectExpr("*", "CAST(0 AS BIGINT) AS epoch", "CAST(0 AS INT) AS instance").limit(0)
            empty.write.format(format_).partitionBy("epoch", "instance").saveAsTable(table)
        columns = [c for c in spark.table(table).columns if c not in ("epoch", "instance")]
        frame.createOrReplaceTempView(view)
    try:
        select = ", ".join(f"`{c}`" for c in columns)
        spark.sql(
            f"INSERT OVERWRITE TABLE {table} PARTITION (epoch={epoch}, instance={index}) SELECT {select} FROM {view}"
        )
    finally:
        spark.catalog.dropTempView(view)


#: What a writer holds in memory: rows as elements, and columnar batches' rows as Arrow tables.
Held: TypeAlias = tuple[Batch, list[Any]]


class _SparkWriter(ElementWriter):
    def __init__(self, sink: SparkSink, context: SinkContext) -> None:
        self.sink = sink
        self.index = context.index
        self.node = context.node
        self.where = f"sink '{context.node}' instance {context.index}"
        self._temporary = sink.staging_dir is None
        self._base = sink.staging_dir or Path(tempfile.mkdtemp(prefix="streamlet-spark-"))
        self.attempt = context.attempt
        self.staging = self._attempt_staging(context.attempt)
        self.staging.mkdir(parents=True, exist_ok=True)
        self._open = self.staging / f"{self.index:04d}-open"
        self._rows: Batch = []
        self._tables: list[Any] = []  # columnar batches' rows, as Arrow tables
        self._table_rows = 0
        self._handing_over: anyio.Event | None = None

    def _attempt_staging(self, attempt: str) -> Path:
        return self._base / self.node / attempt  # sinks sharing a staging directory keep apart, and so do runs

    def _sealed(self, epoch: int, staging: Path | None = None) -> Path:
        return (staging or self.staging) / f"{self.index:04d}-{epoch:08d}"

    def _take(self) -> Held:
        held = (self._rows, self._tables)
        self._rows, self._tables, self._table_rows = [], [], 0
        return held

    def _spill(self, held: Held) -> None:
        rows, tables = held
        write_tables(self._open, [*tables, to_arrow(rows, self.where)] if rows else tables)

    async def write(self, batch: Batch) -> None:
        self._rows.extend(batch)
        await self._spill_if_full()

    async def write_columns(self, batch: ColumnBatch) -> None:
        """A columnar batch's rows go into Arrow column by column, never a step per row."""
        self._tables.append(columns_to_arrow(batch, self.where))
        self._table_rows += len(batch)
        await self._spill_if_full()

    async def _spill_if_full(self) -> None:
        if len(self._rows) + self._table_rows >= self.sink.max_rows:
            if self._handing_over is not None:
                await self._handing_over.wait()  # Spark is busy: hold the stream back rather than pile up
            await anyio.to_thread.run_sync(self._spill, self._take())

    async def prepare_commit(self, epoch: int) -> None:
        await anyio.to_thread.run_sync(self._stage, self._take(), epoch)

    def _stage(self, held: Held, epoch: int) -> None:
        self._spill(held)
        seal(self._open, self._sealed(epoch))

    async def commit(self, epoch: int) -> None:
        self._handing_over = anyio.Event()
        try:
            await anyio.to_thread.run_sync(self._publish, epoch)
        finally:
            self._handing_over.set()
            self._handing_over = None

    def _publish(self, epoch: int, staging: Path | None = None) -> None:
        sealed = self._sealed(epoch, staging)
        rows = read_chunks(sealed)  # None when handed over already: overwriting the partition again is harmless
        if rows is not None:
            try:
                self.sink.hand_over(with_epoch(rows, epoch), epoch, self.index)
            except ConnectorError:
                raise
            except Exception as exc:  # Spark (or fn) failed: the sealed epoch stays for a restore
                raise ConnectorError(f"{self.where}: handing epoch {epoch} to Spark failed: {exc}") from exc
        remove(sealed)

    async def restore(self, point: RestorePoint | None) -> None:
        await anyio.to_thread.run_sync(self._restore, point)

    def _restore(self, point: RestorePoint | None) -> None:
        if point is not None and point.attempt is not None:
            self._finish_attempt(point.epoch, point.attempt)
        self.sink.forget_after(None if point is None else point.epoch, self.index)

    def _finish_attempt(self, epoch: int, attempt: str) -> None:
        """Hand over what ``attempt`` sealed up to ``epoch``; drop the rest of its staging."""
        staging = self._attempt_staging(attempt)
        for sealed in sorted(staging.glob(f"{self.index:04d}-[0-9]*")):
            sealed_epoch = int(sealed.name.split("-")[1])
            if sealed_epoch <= epoch:
                self._publish(sealed_epoch, staging)  # the checkpoint completed but the hand-over was cut short
            else:
                remove(sealed)
        if attempt != self.attempt:  # rows of an epoch whose barrier never came: the replay brings them again
            remove(staging / f"{self.index:04d}-open")
            _remove_if_empty(staging)

    def abort(self) -> None:
        self._take()  # uncommitted: nothing will hand them over
        if self._temporary:
            shutil.rmtree(self._base, ignore_errors=True)
        else:
            shutil.rmtree(self._open, ignore_errors=True)  # in no checkpoint; sealed epochs stay for a restore
            _remove_if_empty(self.staging)

    async def close(self) -> None:
        await anyio.to_thread.run_sync(self._finish, self._take())

    def _finish(self, held: Held) -> None:
        """Without checkpoints everything is handed over now, as epoch 0 (with them, nothing is left)."""
        self._spill(held)
        if self._open.exists():
            seal(self._open, self._sealed(0))
            self._publish(0)
        if self._temporary:
            shutil.rmtree(self._base, ignore_errors=True)
        else:
            _remove_if_empty(self.staging)


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (or gone): someone still stages there
        directory.rmdir()
