"""Moving staged epochs into the target table, fenced by ``streamlet_sink_epochs``.

One transaction per (sink instance, staged run): advance the instance's last
epoch only where the stored one is older (``ON CONFLICT ... WHERE epoch <
excluded.epoch``), and only then insert the staged rows into the target; in
either case the staged rows of epochs up to it go (moved, or refused: a
replay or a zombie, counted in ``refused`` unless this run moved them itself
already, as a retried commit whose first answer was lost does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.connectors.postgres.schema import EPOCHS, STAGING, column_list

FENCE = f"""
INSERT INTO {EPOCHS} AS stored (submission, sink, instance, epoch, run) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (submission, sink, instance) DO UPDATE SET epoch = excluded.epoch, run = excluded.run
WHERE stored.epoch < excluded.epoch RETURNING 1
"""
REFUSED = f"""
UPDATE {EPOCHS} SET refused = refused + 1 WHERE submission = $1 AND sink = $2 AND instance = $3 AND run <> $4
RETURNING epoch, run
"""
CLEAN_MOVED = f"DELETE FROM {STAGING} WHERE sl_submission = $1 AND sl_sink = $2 AND sl_instance = $3 AND sl_epoch <= $4"
STAGED = "sl_submission = $1 AND sl_sink = $2 AND sl_instance = $3 AND sl_attempt = $4 AND sl_epoch <= $5"


@dataclass(frozen=True, slots=True)
class Move:
    """What one move takes: whose rows (submission, sink, instance, the run that staged them), up to which
    epoch, from which staging table into which table, and the run that moves them."""

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


def insert_statement(move: Move) -> str:
    """The ``INSERT ... SELECT`` moving the staged rows: in order (append), or the last row per conflict key
    (upsert: PostgreSQL refuses to affect one row twice in a statement)."""
    columns = column_list(move.columns)
    source = f"FROM {move.staging} WHERE {STAGED}"
    if move.conflict is None:
        return f"INSERT INTO {move.target} ({columns}) SELECT {columns} {source} ORDER BY sl_epoch, sl_seq"
    keys = column_list(move.conflict)
    others = [name for name in move.columns if name not in move.conflict]
    action = "DO NOTHING"
    if others:
        action = "DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in map(_quoted, others))
    return (
        f"INSERT INTO {move.target} ({columns}) SELECT DISTINCT ON ({keys}) {columns} {source} "
        f"ORDER BY {keys}, sl_epoch DESC, sl_seq DESC ON CONFLICT ({keys}) {action}"
    )


def _quoted(name: str) -> str:
    return column_list([name])


async def move(connection: Any, plan: Move) -> bool:
    """Move ``plan``'s rows in one transaction; ``True`` if they moved, ``False`` if refused and counted."""
    key = (plan.submission, plan.sink, plan.instance)
    async with connection.transaction():
        advanced = await connection.fetchval(FENCE, *key, plan.epoch, plan.mover)
        if advanced:
            await connection.execute(insert_statement(plan), *key, plan.staged_by, plan.epoch)
        refused = not advanced and await connection.fetchrow(REFUSED, *key, plan.mover) is not None
        await connection.execute(CLEAN_MOVED, *key, plan.epoch)
    return bool(advanced) or not refused


async def staged_instances(connection: Any, submission: str, sink: str, run: str, epoch: int) -> list[Any]:
    """(staging table, instance) of every instance that ``run`` staged epochs up to ``epoch`` for."""
    return list(
        await connection.fetch(
            f"SELECT DISTINCT tableoid::regclass::text, sl_instance FROM {STAGING} "
            "WHERE sl_submission = $1 AND sl_sink = $2 AND sl_attempt = $3 AND sl_epoch <= $4",
            submission,
            sink,
            run,
            epoch,
        )
    )


async def drop_aborted(
    connection: Any, submission: str, sink: str, keep: Sequence[str], restored: str | None, epoch: int
) -> None:
    """Delete what no commit can move any more: the restored run's epochs after the checkpoint, and every
    other run's staging except the runs in ``keep`` (this one)."""
    await connection.execute(
        f"DELETE FROM {STAGING} WHERE sl_submission = $1 AND sl_sink = $2 "
        "AND ((sl_attempt = $3 AND sl_epoch > $4) OR NOT (sl_attempt = ANY($5::text[]) OR sl_attempt = $3))",
        submission,
        sink,
        restored or "",
        epoch,
        list(keep),
    )
