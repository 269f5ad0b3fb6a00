"""The tables ``PostgresSink`` owns, and what it reads of the catalog.

- ``streamlet_sink_staging``: one row per staged batch: an instance's rows of
  one epoch, staged in one transaction. It says whose they are: the job's
  submission, the sink, the instance, the attempt (run) that staged them, the
  checkpoint epoch, and the table holding the rows. Written in the staging
  transaction itself, with the barrier's epoch, so a batch is there exactly
  when its rows are.
- ``streamlet_sink_staged``: the parent of the tables holding staged rows.
  Each row carries only its batch id and its sequence number (both filled by
  the server: the batch from the transaction's ``streamlet.batch`` setting,
  the sequence from a cached sequence, increasing in the order one
  connection copies), so a staged row is barely wider than the target's.
  Each target table (and set of written columns) has a child
  ``streamlet_sink_staged_<hash>`` (``INHERITS``) with the written columns in
  the target's own types, so a value the column refuses is refused when it
  is staged, and one ``DELETE`` on the parent cleans every child.
- ``streamlet_sink_epochs``: (submission, sink, instance) -> the last epoch
  moved into the target, the run that moved it, and how many commits were
  refused (a replay, or a zombie of an older run).
- ``streamlet_sink_runs``: (job, sink, run) -> submission. A run restored
  from a checkpoint belongs to the submission of the run that took it; a run
  started afresh is a submission of its own. So a job started again from
  nothing (or removed and submitted again under its name) starts clean.

DDL runs under a transaction-scoped advisory lock: concurrent ``CREATE TABLE
IF NOT EXISTS`` of one name can otherwise fail on ``pg_type``'s unique index.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.connectors.postgres.connection import quote_identifier
from streamlet.errors import ConnectorError

STAGING = "streamlet_sink_staging"
STAGED = "streamlet_sink_staged"
BATCH_IDS = "streamlet_sink_batch_ids"
ROW_IDS = "streamlet_sink_row_ids"
BATCH_SETTING = "streamlet.batch"  # the staging transaction's batch id, which its copied rows take
EPOCHS = "streamlet_sink_epochs"
RUNS = "streamlet_sink_runs"
META = ("sl_batch", "sl_seq")
DDL_LOCK = 0x5354524D  # the advisory lock key every streamlet DDL takes ("STRM")

OWN_TABLES = f"""
CREATE SEQUENCE IF NOT EXISTS {BATCH_IDS};
CREATE SEQUENCE IF NOT EXISTS {ROW_IDS} CACHE 10000;
CREATE TABLE IF NOT EXISTS {STAGING} (
    batch bigint PRIMARY KEY, submission text NOT NULL, sink text NOT NULL, instance integer NOT NULL,
    attempt text NOT NULL, epoch bigint NOT NULL, rows_table text NOT NULL);
CREATE TABLE IF NOT EXISTS {STAGED} (
    sl_batch bigint NOT NULL DEFAULT current_setting('{BATCH_SETTING}')::bigint,
    sl_seq bigint NOT NULL DEFAULT nextval('{ROW_IDS}'));
CREATE TABLE IF NOT EXISTS {EPOCHS} (
    submission text NOT NULL, sink text NOT NULL, instance integer NOT NULL, epoch bigint NOT NULL,
    run text NOT NULL, refused bigint NOT NULL DEFAULT 0, PRIMARY KEY (submission, sink, instance));
CREATE TABLE IF NOT EXISTS {RUNS} (
    job text NOT NULL, sink text NOT NULL, run text NOT NULL, submission text NOT NULL,
    PRIMARY KEY (job, sink, run));
"""

COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
"""


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a table: its name, its SQL type and whether it refuses NULL."""

    name: str
    type: str
    not_null: bool


@dataclass(frozen=True, slots=True)
class Target:
    """The table a sink writes, resolved in the catalog, and the columns it writes (in the rows' order)."""

    table: str  # as the catalog prints it (quoted where needed)
    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The written columns' names."""
        return tuple(column.name for column in self.columns)

    @property
    def staging(self) -> str:
        """The name of the table this target's staged rows go to (a child of ``streamlet_sink_staged``)."""
        shape = "\n".join([self.table, *(f"{c.name} {c.type} {c.not_null}" for c in self.columns)])
        return f"{STAGED}_{hashlib.sha256(shape.encode()).hexdigest()[:16]}"


ROWS_TABLE = re.compile(rf"{STAGED}_[0-9a-f]{{16}}")


def rows_table(name: str) -> str:
    """``name``, read back from ``streamlet_sink_staging``, checked to be one of our tables of staged rows
    before it goes into a statement."""
    if ROWS_TABLE.fullmatch(name) is None:
        raise ConnectorError(f"table {STAGING} names {name!r} as a table of staged rows: streamlet makes no such table")
    return name


OWN_INDEXES = f"CREATE INDEX IF NOT EXISTS {STAGING}_by_instance ON {STAGING} (submission, sink, instance, epoch)"
OLDER_STAGING = f"""
SELECT NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{STAGING}'::regclass AND attname = 'batch')
"""


async def ensure_own_tables(connection: Any) -> None:
    """Create the tables streamlet owns, where missing; a ``ConnectorError`` when an older streamlet made them."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", DDL_LOCK)
        await connection.execute(OWN_TABLES)
        if await connection.fetchval(OLDER_STAGING):
            raise ConnectorError(
                f"table {STAGING} was made by an older streamlet (it has no column 'batch'): move what it "
                "staged into its targets or drop it, then start the job again"
            )
        await connection.execute(OWN_INDEXES)


async def table_columns(connection: Any, table: str) -> tuple[str, dict[str, Column]]:
    """The catalog's name of ``table`` and its columns by name (``UndefinedTableError`` when there is none)."""
    name = await connection.fetchval("SELECT $1::regclass::text", table)
    rows = await connection.fetch(COLUMNS, table)
    return name, {row[0]: Column(row[0], row[1], row[2]) for row in rows}


async def ensure_staging(connection: Any, target: Target) -> None:
    """Create ``target``'s staging table, where missing."""
    columns = ", ".join(
        f"{quote_identifier(c.name)} {c.type}{' NOT NULL' if c.not_null else ''}" for c in target.columns
    )
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", DDL_LOCK)
        await connection.execute(f"CREATE TABLE IF NOT EXISTS {target.staging} ({columns}) INHERITS ({STAGED})")


async def staging_columns(connection: Any, staging: str) -> tuple[str, ...]:
    """The target columns a table of staged rows holds (its own, not the inherited ones)."""
    rows = await connection.fetch(COLUMNS, staging)
    return tuple(row[0] for row in rows if row[0] not in META)


def column_list(names: Sequence[str]) -> str:
    """``"a", "b"``."""
    return ", ".join(map(quote_identifier, names))
