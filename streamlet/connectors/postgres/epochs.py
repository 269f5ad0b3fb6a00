"""Staged batches, and moving them into the target table, fenced by ``streamlet_sink_epochs``.

One transaction per (sink instance, staged run): advance the instance's last
epoch only where the stored one is older (``ON CONFLICT ... WHERE epoch <
excluded.epoch``), and only then insert the rows of the run's batches into
the target; in either case the batches of epochs up to it go (moved, or
refused: a replay or a zombie, counted in ``refused`` unless this run moved
them itself already, as a retried commit whose first answer was lost does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.connectors.postgres.schema import BATCH_IDS, BATCH_SETTING, EPOCHS, STAGING, column_list, rows_table

FENCE = f"""
INSERT INTO {EPOCHS} AS stored (submission, sink, instance, epoch, run) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (submission, sink, instance) DO UPDATE SET epoch = excluded.epoch, run = excluded.run
WHERE stored.epoch < excluded.epoch RETURNING 1
"""
REFUSED = f"""
UPDATE {EPOCHS} SET refused = refused + 1 WHERE submission = $1 AND sink = $2 AND instance = $3 AND run <> $4
RETURNING epoch, run
"""
RUN_BATCHES = (
    f"SELECT batch FROM {STAGING} "
    "WHERE submission = $1 AND sink = $2 AND instance = $3 AND attempt = $4 AND epoch <= $5 ORDER BY batch"
)
MOVED = "submission = $1 AND sink = $2 AND instance = $3 AND epoch <= $4"  # every run's batches up to the epoch
ABORTED = (  # the restored run's ($3) batches after the checkpoint ($4), and those of runs neither it nor $5
    "submission = $1 AND sink = $2 AND ((attempt = $3 AND epoch > $4) OR NOT (attempt = ANY($5::text[]) "
    "OR attempt = $3))"
)
# A staging transaction holds an advisory lock on its batch until it ends (two int4 keys: a key space apart
# from the one-bigint DDL_LOCK), so a lookup after a lost answer waits for a commit still on its way.
BATCH_LOCK_CLASS = 0x53544147  # "STAG"
OPEN_BATCH = f"""
SELECT set_config('{BATCH_SETTING}', n::text, true), pg_advisory_xact_lock({BATCH_LOCK_CLASS}, (n % 2147483647)::int)
FROM (SELECT nextval('{BATCH_IDS}') AS n) AS next
"""
BATCH_LOCK = f"SELECT pg_advisory_xact_lock({BATCH_LOCK_CLASS}, ($1::bigint % 2147483647)::int)"
IS_RECORDED = (  # the whole identity: after a crash a sequence can hand out an id of a batch that never committed
    f"SELECT 1 FROM {STAGING} WHERE batch = $1 AND submission = $2 AND sink = $3 AND instance = $4 "
    "AND attempt = $5 AND epoch = $6"
)
RECORD_BATCH = f"""
INSERT INTO {STAGING} (batch, submission, sink, instance, attempt, epoch, rows_table)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""
# Filtering by an array of batch ids, not a join with the batch table: one cheap test per staged row.
IN_BATCHES = "sl_batch = ANY($1::bigint[])"


@dataclass(frozen=True, slots=True)
class Move:
    """What one move takes: whose rows (submission, sink, instance, the run that staged them), up to which
    epoch, from which table of staged rows into which table, and the run that moves them."""

    submission: str
    sink: str
    instance: int
    staged_by: str
    epoch: int
    staging: str
    target: str
    columns: tuple[str, ...]
    conflict: tuple[str, ...] | None
    mover: str


def insert_statement(move: Move, batches: str = IN_BATCHES) -> str:
    """The ``INSERT ... SELECT`` moving the staged rows of ``batches`` (a condition on ``sl_batch``; by
    default: in the array $1): in order (append), or the last row per conflict key (upsert: PostgreSQL
    refuses to affect one row twice in a statement)."""
    columns = column_list(move.columns)
    source = f"FROM {move.staging} WHERE {batches}"
    if move.conflict is None:
        return f"INSERT INTO {move.target} ({columns}) SELECT {columns} {source} ORDER BY sl_batch, sl_seq"
    keys = column_list(move.conflict)
    others = [name for name in move.columns if name not in move.conflict]
    action = "DO NOTHING"
    if others:
        action = "DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in map(_quoted, others))
    return (
        f"INSERT INTO {move.target} ({columns}) SELECT DISTINCT ON ({keys}) {columns} {source} "
        f"ORDER BY {keys}, sl_batch DESC, sl_seq DESC ON CONFLICT ({keys}) {action}"
    )


def _quoted(name: str) -> str:
    return column_list([name])


async def open_batch(connection: Any) -> int:
    """A new batch id, set as the open transaction's ``streamlet.batch`` (the rows it copies take it)."""
    return int(await connection.fetchval(OPEN_BATCH))


async def recorded(connection: Any, batch: int, whose: Sequence[Any], epoch: int, wait: float) -> bool:
    """Whether batch ``batch`` of ``whose`` (submission, sink, instance, attempt) went in as ``epoch``'s,
    asked once the transaction that staged it has ended: a commit whose answer was lost may still be on its
    way (a synchronous standby not answered yet). That wait lasts up to ``wait`` seconds, then the lock's
    ``LockNotAvailableError``."""
    async with connection.transaction():
        await connection.execute(f"SET LOCAL lock_timeout = {max(1, round(wait * 1000))}")
        await connection.execute(BATCH_LOCK, batch)
        return await connection.fetchval(IS_RECORDED, batch, *whose, epoch) is not None


async def move(connection: Any, plan: Move) -> bool:
    """Move ``plan``'s rows in one transaction; ``True`` if they moved, ``False`` if refused and counted."""
    key = (plan.submission, plan.sink, plan.instance)
    async with connection.transaction():
        advanced = await connection.fetchval(FENCE, *key, plan.epoch, plan.mover)
        if advanced:
            batches = [row[0] for row in await connection.fetch(RUN_BATCHES, *key, plan.staged_by, plan.epoch)]
            await connection.execute(insert_statement(plan), batches)
        refused = not advanced and await connection.fetchrow(REFUSED, *key, plan.mover) is not None
        await delete_batches(connection, MOVED, *key, plan.epoch)
    return bool(advanced) or not refused


async def delete_batches(connection: Any, where: str, *args: Any) -> None:
    """Delete the batches ``where`` holds of, and their rows, table by table (no scan of other tables)."""
    gone = await connection.fetch(f"DELETE FROM {STAGING} WHERE {where} RETURNING batch, rows_table", *args)
    by_table: dict[str, list[int]] = {}
    for batch, table in gone:
        by_table.setdefault(rows_table(table), []).append(batch)
    for table, batches in sorted(by_table.items()):
        await connection.execute(f"DELETE FROM {table} WHERE {IN_BATCHES}", batches)


async def staged_instances(connection: Any, submission: str, sink: str, run: str, epoch: int) -> list[Any]:
    """(table of staged rows, instance) of every instance that ``run`` staged epochs up to ``epoch`` for."""
    found = await connection.fetch(
        f"SELECT DISTINCT rows_table, instance FROM {STAGING} "
        "WHERE submission = $1 AND sink = $2 AND attempt = $3 AND epoch <= $4 ORDER BY 2, 1",
        submission, sink, run, epoch,
    )  # fmt: skip
    return [(rows_table(table), instance) for table, instance in found]


LINEAGE = "sink = $1 AND attempt <> $2 AND starts_with(attempt, $3)"


async def drop_lineage(connection: Any, sink: str, lineage: str, run: str) -> None:
    """Delete what earlier attempts of ``lineage`` (one submission: runs named ``<lineage>.<n>``) staged for
    ``sink``: an attempt ``run`` that starts from nothing follows attempts no checkpoint completed for, so no
    commit can publish their batches any more."""
    await delete_batches(connection, LINEAGE, sink, run, f"{lineage}.")


async def drop_aborted(
    connection: Any, submission: str, sink: str, keep: Sequence[str], restored: str | None, epoch: int
) -> None:
    """Delete what no commit can move any more: the restored run's epochs after the checkpoint, and every
    other run's batches except the runs in ``keep`` (this one)."""
    await delete_batches(connection, ABORTED, submission, sink, restored or "", epoch, list(keep))
