"""The PostgreSQL connectors' pure parts: the SQL they build, positions, messages (no server; the rest is in
tests/integration/test_postgres*.py)."""

from __future__ import annotations

import datetime
import decimal
import uuid

import pytest

import streamlet as sl
from streamlet.connectors.postgres import epochs, source
from streamlet.connectors.postgres.connection import quote_identifier
from streamlet.core.model.encoding import packb, unpackb


def move(conflict: tuple[str, ...] | None) -> epochs.Move:
    columns = ("key", "n", "at")
    return epochs.Move("sub", "out", 0, "run1", 3, "stage", "public.t", columns, conflict, "run2")


def test_append_moves_rows_in_the_order_they_were_staged() -> None:
    """Append: every staged row of the run's batches up to the epoch, batch (epoch) then sequence order."""
    assert epochs.insert_statement(move(None)) == (
        'INSERT INTO public.t ("key", "n", "at") SELECT "key", "n", "at" FROM stage WHERE '
        "sl_batch = ANY($1::bigint[]) ORDER BY sl_batch, sl_seq"
    )


def test_upsert_moves_the_last_row_per_key_and_updates_the_other_columns() -> None:
    """Upsert: DISTINCT ON the key, newest first, ON CONFLICT DO UPDATE of the columns outside the key."""
    statement = epochs.insert_statement(move(("key",)))
    assert statement.endswith(
        'ORDER BY "key", sl_batch DESC, sl_seq DESC ON CONFLICT ("key") DO UPDATE SET "n" = excluded."n", '
        '"at" = excluded."at"'
    )
    assert 'SELECT DISTINCT ON ("key") "key", "n", "at" FROM stage' in statement


def test_upsert_whose_every_column_is_the_key_does_nothing_on_conflict() -> None:
    """Nothing to update: ON CONFLICT DO NOTHING."""
    assert epochs.insert_statement(move(("key", "n", "at"))).endswith('ON CONFLICT ("key", "n", "at") DO NOTHING')


def test_a_page_after_the_position_and_below_open_transactions() -> None:
    """Keyset paging by (at, id); following adds the xmin condition; a table name gets its xmin selected."""
    following = sl.PostgresSource("postgresql://x", "events", by=["at", "id"], follow=True)
    assert following.page_statement(first=False) == (
        'SELECT * FROM (SELECT t.*, t.xmin AS xmin FROM events AS t) AS q WHERE (q."at", q."id") > ($1, $2) '
        'AND age(q.xmin) > age(xid(pg_snapshot_xmin(pg_current_snapshot()))) ORDER BY q."at", q."id" LIMIT $3'
    )
    once = sl.PostgresSource("postgresql://x", "SELECT id FROM events WHERE kind = 'a';", by=["id"])
    assert once.page_statement(first=True) == (
        "SELECT * FROM (SELECT id FROM events WHERE kind = 'a') AS q ORDER BY q.\"id\" LIMIT $1"
    )


@pytest.mark.parametrize(
    "value",
    [
        7,
        "b",
        None,
        datetime.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC),
        datetime.date(2026, 1, 2),
        decimal.Decimal("1.50"),
        uuid.UUID(int=5),
    ],
)
def test_a_position_value_survives_msgpack_with_its_type(value: object) -> None:
    """Dates, times, decimals and UUIDs are tagged as text; the rest is msgpack's own."""
    decoded = source._decode(unpackb(packb(source._encode(value))))
    assert (decoded, type(decoded)) == (value, type(value))


def test_identifiers_are_quoted() -> None:
    """Column names go into SQL quoted, quotes doubled."""
    assert quote_identifier('we"ird') == '"we""ird"'


def test_bad_options_are_refused_when_the_connector_is_made() -> None:
    """on_error, batch_rows, conflict, by and record are checked at once, naming the table or query."""
    with pytest.raises(sl.ConnectorError, match=r"^PostgresSink for table 't': on_error must be 'fail' or 'skip'"):
        sl.PostgresSink("postgresql://x", "t", on_error="dead-letter")
    with pytest.raises(sl.ConnectorError, match=r"^PostgresSink for table 't': conflict must be a list"):
        sl.PostgresSink("postgresql://x", "t", conflict="key")
    with pytest.raises(sl.ConnectorError, match=r"^PostgresSource over 'e': by must be a list of column names$"):
        sl.PostgresSource("postgresql://x", "e", by="id")
    with pytest.raises(sl.ConnectorError, match=r"^PostgresSource over 'e': give record= or key=/value=/ts="):
        sl.PostgresSource("postgresql://x", "e", by=["id"], key="k", record=lambda row: row)
