"""``COPY`` of rows that tells which row, and which column of it, a table refused.

A batch is copied at once (binary COPY: asyncpg encodes each value for its
column's type). When the table refuses it, the batch is halved under
savepoints until the refused rows are alone: the good rows are in, and each
refused one comes back with the error, so only the bad records are
reported (or skipped). A refused row costs ~log2(batch) extra copies; a
clean batch costs nothing extra.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.connectors.postgres.connection import connection_lost, require_asyncpg

COLUMN_IN_CONTEXT = re.compile(r"column (\S+)")


@dataclass(frozen=True, slots=True)
class Refused:
    """A row the table refused: its index in the batch and the error."""

    index: int
    error: BaseException


def refused_by_table(exc: BaseException) -> bool:
    """Whether ``exc`` is about a value (wrong type, too long, NULL, a check): the row's fault, not the attempt's."""
    if connection_lost(exc):
        return False
    exceptions = require_asyncpg().exceptions
    if isinstance(exc, exceptions.DataError | exceptions.IntegrityConstraintViolationError):
        return True
    return isinstance(exc, TypeError | ValueError | OverflowError)  # asyncpg's encoders, before sending


async def copy_rows(
    connection: Any, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]], start: int = 0
) -> list[Refused]:
    """Copy ``rows`` into ``table`` inside the open transaction; the rows it refused (the others are in)."""
    if not rows:
        return []
    try:
        async with connection.transaction():  # a savepoint: a refused copy takes back only itself
            await connection.copy_records_to_table(table, records=rows, columns=list(columns))
        return []
    except Exception as exc:
        if not refused_by_table(exc):
            raise
        if len(rows) == 1:
            return [Refused(start, exc)]
    half = len(rows) // 2
    first = await copy_rows(connection, table, columns, rows[:half], start)
    return first + await copy_rows(connection, table, columns, rows[half:], start + half)


async def refused_column(
    connection: Any, error: BaseException, names: Sequence[str], types: Sequence[str], values: Sequence[Any]
) -> str | None:
    """Which column refused a row: the server's answer where it gives one, else the first value that cannot
    be encoded for its column's type on its own (asyncpg checks types before anything is sent)."""
    found = getattr(error, "column_name", None)
    if found:
        return str(found)
    context = COLUMN_IN_CONTEXT.search(str(getattr(error, "context", None) or ""))
    if context is not None:
        return context.group(1).strip('"')
    for name, sql_type, value in zip(names, types, values, strict=True):
        try:
            async with connection.transaction():
                await connection.fetchval(f"SELECT $1::{sql_type}", value)
        except Exception as exc:
            if not refused_by_table(exc):
                raise
            return name
    return None
