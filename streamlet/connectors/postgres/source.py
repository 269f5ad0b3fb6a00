"""``PostgresSource``: a resumable incremental query, read in keyset pages.

The rows of ``query`` are read in order of the columns ``by`` (a column that
only grows, such as an id or an insert time, and a tiebreaker when it can
repeat), ``batch_rows`` at a time: each page asks for the rows after the
last ``by`` values read (``WHERE (by) > (last) ORDER BY by LIMIT n``), so a
page costs the same wherever the reader is. Those last values are the
reader's checkpointed position: a restored job goes on after the last row it
had read.

``follow=True`` keeps polling every ``poll_interval`` seconds of the job's
clock instead of ending. Serial ids and insert times are taken before their
transaction commits, so a row with a smaller id can become visible after one
with a larger id was read; following therefore reads only rows whose
inserting transaction is older than every transaction still open (the row's
``xmin`` below the current snapshot's ``xmin``), and a row committed late is
read when its transaction ends, never skipped. Limits: a value taken before
its transaction wrote anything (``now()`` at the start of a long
transaction) can still come late, and one long-open transaction anywhere on
the server holds following back until it ends. The query must then expose
the rows' ``xmin``: give a table name (it is added), or select a column named
``xmin`` (``SELECT e.*, e.xmin FROM events e``).

Positions are msgpack-able lists (dates, times, decimals and UUIDs are
tagged as text), never pickled.
"""

from __future__ import annotations

import datetime
import decimal
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamlet.connectors.postgres.connection import (
    RECONNECT_WITHIN,
    close_quietly,
    connect,
    connection_lost,
    quote_identifier,
    require_asyncpg,
    retrying,
)
from streamlet.core.model.columns import ColumnBatch, import_pyarrow
from streamlet.core.model.record import Batch
from streamlet.core.model.sources import Source, SourceContext, SourceReader
from streamlet.errors import ConnectorError, SourceError
from streamlet.redaction import redacted

TABLE_NAME = re.compile(
    r'^(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")(?:\.(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+"))?$'
)
BELOW_SNAPSHOT = "age(q.xmin) > age(xid(pg_snapshot_xmin(pg_current_snapshot())))"


class PostgresSource(Source):
    """The rows of ``query`` in order of ``by``, resumable (see the module docstring).

    Args:
        dsn: a libpq connection string or URI.
        query: a table name, or a ``SELECT`` (no trailing ``ORDER BY``/``LIMIT``: the source adds them).
        by: the columns that order the rows; their last values are the position.
        key, value, ts: the columns that become each record's key, value and event time (as
            ``ColumnarSource``); ``value=None``: the other columns as a dict. A ``datetime`` ts becomes
            epoch seconds.
        record: ``row -> Record | (key, value)`` instead of ``key``/``value``/``ts``.
        follow: poll for new rows for ever instead of ending after the last one.
        poll_interval: seconds of the job clock between polls when following.
        batch_rows: rows per page.
        columnar: emit Arrow record batches (for the columnar operators) instead of records.
        reconnect_within: seconds to wait for a lost server before the source fails.

    Example:
        >>> source = PostgresSource("postgresql://app@db/shop", "orders", by=["id"], key="customer")
    """

    def __init__(
        self,
        dsn: str,
        query: str,
        *,
        by: Sequence[str],
        key: str | None = None,
        value: str | None = None,
        ts: str | None = None,
        record: Callable[[Mapping[str, Any]], Any] | None = None,
        follow: bool = False,
        poll_interval: float = 1.0,
        batch_rows: int = 10_000,
        columnar: bool = False,
        reconnect_within: float = RECONNECT_WITHIN,
    ) -> None:
        if isinstance(by, str) or not by:
            raise ConnectorError(f"PostgresSource over {query!r}: by must be a list of column names")
        if record is not None and (key, value, ts) != (None, None, None):
            raise ConnectorError(f"PostgresSource over {query!r}: give record= or key=/value=/ts=, not both")
        if columnar and record is not None:
            raise ConnectorError(f"PostgresSource over {query!r}: a columnar source names columns (no record=)")
        if type(batch_rows) is not int or batch_rows < 1:
            raise ConnectorError(f"PostgresSource over {query!r}: batch_rows must be a whole number >= 1")
        self.dsn, self.by = dsn, tuple(by)
        self.key, self.value, self.ts, self.record = key, value, ts, record
        self.follow, self.poll_interval, self.batch_rows = follow, poll_interval, batch_rows
        self.columnar, self.reconnect_within = columnar, reconnect_within
        self.query, self.added_xmin = _relation(query.strip().rstrip(";"), follow)

    def open(self, context: SourceContext) -> SourceReader:
        """The reader; one instance reads the whole query in order."""
        require_asyncpg()
        if context.parallelism != 1:
            raise ConnectorError(
                f"source '{context.node}': a PostgresSource reads one query in order; give it parallelism 1"
            )
        return PostgresReader(self, context)

    def page_statement(self, first: bool) -> str:
        """The SQL of one page: after the position (unless ``first``), below open transactions (following)."""
        order = ", ".join(f"q.{quote_identifier(column)}" for column in self.by)
        conditions = []
        if not first:
            after = ", ".join(f"${n}" for n in range(1, len(self.by) + 1))
            conditions.append(f"({order}) > ({after})")
        if self.follow:
            conditions.append(BELOW_SNAPSHOT)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        limit = f"${1 if first else len(self.by) + 1}"
        return f"SELECT * FROM ({self.query}) AS q{where} ORDER BY {order} LIMIT {limit}"


def _relation(query: str, follow: bool) -> tuple[str, bool]:
    """``query`` as a subquery; a table name becomes a ``SELECT`` (with its rows' ``xmin`` when following)."""
    if TABLE_NAME.match(query) is None:
        return query, False
    if follow:
        return f"SELECT t.*, t.xmin AS xmin FROM {query} AS t", True
    return f"SELECT * FROM {query}", False


class PostgresReader(SourceReader):
    """The reader of a :class:`PostgresSource`."""

    def __init__(self, source: PostgresSource, context: SourceContext) -> None:
        self.source, self.context = source, context
        self.connection: Any = None
        self.after: tuple[Any, ...] | None = None  # the last ``by`` values read
        self.ended = False
        self.caught = False  # a page came back short: every row there was at that moment has been read
        self.top = float("-inf")  # the largest event time read

    async def read(self, max_records: int) -> Any:
        """The next page (waiting for one when following); ``None`` at the end."""
        source = self.source
        while not self.ended:
            limit = min(source.batch_rows, max_records)
            rows = await self._page(limit)
            if rows:
                last = rows[-1]
                self.after = tuple(last[column] for column in source.by)
                if len(rows) < limit:  # a short page: nothing after it (the next read would be empty)
                    self.caught = True
                    self.ended = not source.follow
                return self._emit(rows)
            if not source.follow:
                self.ended = True
            elif not self.caught:  # say so now (an empty read), not once the next row comes
                self.caught = True
                return []
            else:
                await self.context.clock.sleep(source.poll_interval)
        return None

    def caught_up(self) -> bool:
        """Following, every row the query had when the reader started (its snapshot) has been read: a page
        came back short. (Not following, the source's end says it.)"""
        return self.caught

    async def _page(self, limit: int) -> list[Any]:
        source = self.source
        statement = source.page_statement(self.after is None)
        arguments = [*(self.after or ()), limit]

        async def fetch() -> list[Any]:
            if self.connection is None or self.connection.is_closed():
                self.connection = await connect(source.dsn, f"streamlet source '{self.context.node}'")
            return list(await self.connection.fetch(statement, *arguments))

        try:
            return await retrying(fetch, f"source '{self.context.node}'", source.reconnect_within)
        except Exception as exc:
            await self.aclose()
            what = f"source '{self.context.node}' instance {self.context.index}"
            cause = f"PostgreSQL at {redacted(source.dsn)} not reachable within {source.reconnect_within:g} s; "
            raise SourceError(
                f"{what} failed reading after {self.after!r}: {cause if connection_lost(exc) else ''}"
                f"{type(exc).__name__}: {exc}",
                source=self.context.node, instance=self.context.index, position=self.position(),
            ) from exc  # fmt: skip

    def _emit(self, rows: list[Any]) -> Any:
        source = self.source
        if source.added_xmin:
            dicts = [{k: v for k, v in row.items() if k != "xmin"} for row in rows]
        else:
            dicts = [dict(row.items()) for row in rows]
        if source.columnar:
            return self._columns(dicts)
        if source.record is not None:
            return [source.record(row) for row in dicts]
        return self._elements(dicts)

    def _elements(self, rows: list[dict[str, Any]]) -> Batch:
        source = self.source
        now = self.context.clock.now()
        elements: Batch = []
        for row in rows:
            ts = now if source.ts is None else _seconds(row.get(source.ts))
            if ts is not None and ts > self.top:
                self.top = ts
            key = None if source.key is None else row[source.key]
            if source.value is not None:
                value: Any = row[source.value]
            else:
                value = {k: v for k, v in row.items() if k not in (source.key, source.ts)}
            elements.append((key, value, ts))
        return elements

    def _columns(self, rows: list[dict[str, Any]]) -> ColumnBatch:
        pa = import_pyarrow()
        source = self.source
        data = pa.RecordBatch.from_pylist(rows)
        if source.ts is not None and rows:
            top = max((_seconds(row[source.ts]) or float("-inf")) for row in rows)
            self.top = max(self.top, top)
        return ColumnBatch(data, source.key, source.value, source.ts)

    def position(self) -> Any:
        """The last ``by`` values read, tagged where msgpack has no type for them."""
        return None if self.after is None else [_encode(value) for value in self.after]

    async def seek(self, position: Any) -> None:
        """Go on after the row whose ``by`` values ``position`` holds."""
        self.after = None if position is None else tuple(_decode(value) for value in position)

    def event_time_progress(self) -> float | None:
        """The largest event time read (with a ``ts`` column)."""
        return self.top if self.source.ts is not None else None

    async def aclose(self) -> None:
        """Close the connection."""
        connection, self.connection = self.connection, None
        await close_quietly(connection)


def _seconds(value: Any) -> float | None:
    """An event time as epoch seconds: numbers as they are, a ``datetime`` (naive: UTC) by its timestamp."""
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)
        return moment.timestamp()
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise ConnectorError(f"PostgresSource: ts must be a number or a timestamp, got {type(value).__name__}")


_TAGGED: dict[str, Callable[[str], Any]] = {
    "datetime": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "time": datetime.time.fromisoformat,
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
}


def _encode(value: Any) -> Any:
    """A position value msgpack can carry: plain, or ``[tag, text]``."""
    for tag, kind in (("datetime", datetime.datetime), ("date", datetime.date), ("time", datetime.time)):
        if isinstance(value, kind):
            return [tag, value.isoformat()]
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return ["decimal" if isinstance(value, decimal.Decimal) else "uuid", str(value)]
    return ["plain", value]


def _decode(value: Any) -> Any:
    tag, data = value
    return data if tag == "plain" else _TAGGED[tag](data)
