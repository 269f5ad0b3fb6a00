"""The tables ``PostgresSink`` owns, and what it reads of the catalog.

- ``streamlet_sink_staging``: the parent of every staging table. Its columns
  say whose a staged row is: the job's submission, the sink, the instance,
  the attempt (run) that staged it, the checkpoint epoch and the row's
  sequence number in that run. Each target table (and set of written columns)
  has a child ``streamlet_sink_staging_<hash>`` (``INHERITS``) with the
  written columns in the target's own types, so a value the column refuses
  is refused when it is staged, and one ``DELETE`` on the parent cleans every
  child.
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.connectors.postgres.connection import quote_identifier

STAGING = "streamlet_sink_staging"
EPOCHS = "streamlet_sink_epochs"
RUNS = "streamlet_sink_runs"
META = ("sl_submission", "sl_sink", "sl_instance", "sl_attempt", "sl_epoch", "sl_seq")
DDL_LOCK = 0x5354524D  # the advisory lock key every streamlet DDL takes ("STRM")

OWN_TABLES = f"""
CREATE TABLE IF NOT EXISTS {STAGING} (
    sl_submission text NOT NULL, sl_sink text NOT NULL, sl_instance integer NOT NULL,
    sl_attempt text NOT NULL, sl_epoch bigint NOT NULL, sl_seq bigint NOT NULL);
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
        """The name of this target's staging table (a child of ``streamlet_sink_staging``)."""
        shape = "\n".join([self.table, *(f"{c.name} {c.type} {c.not_null}" for c in self.columns)])
        return f"{STAGING}_{hashlib.sha256(shape.encode()).hexdigest()[:16]}"


async def ensure_own_tables(connection: Any) -> None:
    """Create the tables streamlet owns, where missing."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", DDL_LOCK)
        await connection.execute(OWN_TABLES)


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
        await connection.execute(f"CREATE TABLE IF NOT EXISTS {target.staging} ({columns}) INHERITS ({STAGING})")


async def staging_columns(connection: Any, staging: str) -> tuple[str, ...]:
    """The target columns a staging table holds (its own, not the inherited ones)."""
    rows = await connection.fetch(COLUMNS, staging)
    return tuple(row[0] for row in rows if row[0] not in META)


def column_list(names: Sequence[str]) -> str:
    """``"a", "b"``."""
    return ", ".join(map(quote_identifier, names))
