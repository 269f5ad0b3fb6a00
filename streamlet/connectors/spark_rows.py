"""Records (and columnar batches) as Arrow tables, and the Arrow IPC files a ``SparkSink`` stages them in.

Rows have the columns ``key``, ``value`` (or one column per field when every
value is a dict), ``ts``, ``epoch``, and ``window_start``/``window_end``
when the records come from a window. A staged epoch is a directory of Arrow
IPC files (chunks), so an epoch larger than the sink's memory budget spills
to disk chunk by chunk; IPC is a plain columnar format, never pickle.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from streamlet.core.model.columns import ColumnBatch, import_pyarrow
from streamlet.core.model.record import Batch
from streamlet.core.state.durable import fsync_directory
from streamlet.errors import ConnectorError

RESERVED = ("key", "ts", "epoch", "window_start", "window_end")


def _pyarrow() -> Any:
    """pyarrow, or a ``ConnectorError`` naming the spark extra (see ``import_pyarrow``)."""
    return import_pyarrow("SparkSink", "spark", ConnectorError)


def to_arrow(records: Batch, where: str) -> Any:
    """``records`` (the runtime's elements) as a ``pyarrow.Table`` without the ``epoch`` column (``where``
    names the sink in errors).

    The epoch is added when the rows are handed to Spark (:func:`with_epoch`):
    rows are staged before the barrier that closes their epoch arrives.
    """
    pa = _pyarrow()
    try:
        columns: dict[str, Any] = {"key": pa.array([e[0] for e in records])}
        columns.update(_value_columns(pa, [e[1] for e in records], where))
        columns["ts"] = pa.array([e[2] for e in records], pa.float64())
        windows = [e[4] if len(e) > 3 else None for e in records]
        if any(window is not None for window in windows):
            columns["window_start"] = pa.array([w and w[0] for w in windows], pa.float64())
            columns["window_end"] = pa.array([w and w[1] for w in windows], pa.float64())
        return pa.table(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ConnectorError(f"{where}: records do not fit an Arrow table: {exc}") from exc


def columns_to_arrow(batch: ColumnBatch, where: str) -> Any:
    """A columnar batch as the same rows :func:`to_arrow` makes of its elements, column by column (no step
    per row): its key column as ``key``, its value column as ``value`` (or, without one, each other column
    as its own, like dict values), its ts column as ``ts`` (float64), and its window bounds, when it has
    them, as ``window_start``/``window_end`` (float64)."""
    pa = _pyarrow()
    data, rows = batch.data, len(batch)
    columns: dict[str, Any] = {"key": pa.nulls(rows) if batch.key is None else data.column(batch.key)}
    if batch.value is not None:
        columns["value"] = data.column(batch.value)
    else:
        others = batch.other_columns()
        clash = sorted(set(others.schema.names) & set(RESERVED))
        if clash:
            raise ConnectorError(f"{where}: columns named like row columns: {clash}")
        columns.update(zip(others.schema.names, others.columns, strict=True))
    try:
        columns["ts"] = pa.nulls(rows, pa.float64()) if batch.ts is None else data.column(batch.ts).cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConnectorError(f"{where}: the ts column {batch.ts!r} is not a number of seconds: {exc}") from exc
    if batch.window_start is not None:  # a columnar window's results: their bounds, as window records give them
        columns["window_start"] = data.column(batch.window_start).cast(pa.float64())
        columns["window_end"] = data.column(batch.window_end).cast(pa.float64())
    return pa.table(columns)


def with_epoch(table: Any, epoch: int) -> Any:
    """``table`` with an ``epoch`` column (int64) after ``ts``."""
    pa = _pyarrow()
    return table.add_column(table.schema.get_field_index("ts") + 1, "epoch", pa.array([epoch] * len(table), pa.int64()))


def _value_columns(pa: Any, values: list[Any], where: str) -> dict[str, Any]:
    """``{"value": array}``, or one array per field when every value is a dict."""
    if not values or not all(type(value) is dict for value in values):
        return {"value": pa.array(values)}
    struct = pa.array(values)  # a StructArray over the union of the fields; a missing field is null
    names = [field.name for field in struct.type]
    clash = sorted(set(names) & set(RESERVED))
    if clash:
        raise ConnectorError(f"{where}: dict values have fields named like row columns: {clash}")
    return dict(zip(names, struct.flatten(), strict=True))


def write_tables(directory: Path, tables: list[Any]) -> None:
    """Append ``tables`` (rows of one epoch, made from elements or columns) to ``directory`` as one chunk."""
    if tables:
        pa = _pyarrow()
        write_chunk(
            directory, tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
        )


def write_chunk(directory: Path, table: Any) -> None:
    """Append ``table`` to ``directory`` as the next IPC chunk, fsynced."""
    pa = _pyarrow()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"chunk-{len(list(directory.glob('chunk-*.arrow'))):06d}.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def read_chunks(directory: Path) -> Any:
    """The chunks of ``directory`` as one table (``None`` when there are none).

    Chunks of one epoch may disagree on a type (ints in one, floats in the
    next); Arrow's permissive promotion unifies them.
    """
    pa = _pyarrow()
    tables = []
    for path in sorted(directory.glob("chunk-*.arrow")):
        with pa.memory_map(str(path), "r") as source:
            tables.append(pa.ipc.open_file(source).read_all())
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="permissive")


def seal(directory: Path, sealed: Path) -> None:
    """Atomically turn an open staging directory into a sealed one (the epoch's rows are final)."""
    remove(sealed)  # a leftover of a run that crashed between sealing and committing the same epoch
    if directory.exists():
        os.replace(directory, sealed)
    else:
        sealed.mkdir(parents=True)
    fsync_directory(sealed.parent)


def remove(directory: Path) -> None:
    """Delete a staging directory (and make that durable)."""
    if directory.exists():
        shutil.rmtree(directory)
        fsync_directory(directory.parent)
