"""Columnar batches: Arrow record batches travelling between the built-in columnar operators.

A channel carries data batches (lists of elements) or markers; between
columnar nodes (a :class:`~streamlet.core.model.columnar.ColumnarSource`,
``Topology.where``, ``Topology.aggregate``) it also carries a
:class:`ColumnBatch`: a ``pyarrow.RecordBatch`` with the names of the columns
that play the record's ``key``, ``value`` and ``ts`` (and, for the results of a
columnar window, the columns of each row's window bounds). Where the receiver is not
columnar (a user ``Task``, a shortcut, a sink) the sending route turns it into
elements once (:meth:`ColumnBatch.elements`), so user code always sees records.

pyarrow is optional (``pip install 'streamlet[columnar]'``) and imported only
here, when a columnar batch is first made.
"""

from __future__ import annotations

from typing import Any

from streamlet.core.model.record import Batch
from streamlet.errors import StreamletError, TopologyError


def import_pyarrow(
    user: str = "the columnar path", extra: str = "columnar", error: type[StreamletError] = TopologyError
) -> Any:
    """``pyarrow`` with ``pyarrow.compute`` and ``pyarrow.ipc`` loaded; without it, ``error`` saying that
    ``user`` needs it and which extra installs it (``pip install 'streamlet[extra]'``). The one import of
    pyarrow: core's columnar path and the connectors (SparkSink: ``"SparkSink", "spark", ConnectorError``)."""
    try:
        import pyarrow
        import pyarrow.compute  # loads pyarrow.compute for the operators
        import pyarrow.ipc  # and pyarrow.ipc for ARROW frames and staging files
    except ImportError as exc:
        raise error(f"{user} needs pyarrow, which is not installed: pip install 'streamlet[{extra}]'") from exc
    return pyarrow


class ColumnBatch:
    """One Arrow record batch in a stream, with the columns that are its records' ``key``, ``value`` and ``ts``.

    ``value=None`` makes each record's value a ``dict`` of the row's other
    columns (all but the role columns); ``key=None`` or ``ts=None`` give
    records a ``None`` key or time. ``window_start`` and ``window_end`` (both or
    neither) name the columns of each row's window bounds: the results of a
    columnar window (``aggregate(..., window=...)``), whose records are then
    on-time window records (``record.window``), as ``window_reduce`` emits them.
    Read-only once emitted, like a record: several receivers may hold it.

    Example:
        >>> import pyarrow as pa
        >>> batch = ColumnBatch(pa.record_batch({"word": ["a", "b"], "n": [1, 2]}), key="word", value="n")
        >>> batch.elements()
        [('a', 1, None), ('b', 2, None)]
        >>> data = pa.record_batch({"k": ["a"], "n": [3], "start": [0], "end": [10]})
        >>> ColumnBatch(data, "k", "n", window_start="start", window_end="end").elements()
        [('a', 3, None, 0, (0, 10), 'on_time')]
    """

    __slots__ = ("_elements", "data", "key", "ts", "value", "window_end", "window_start")

    def __init__(
        self,
        data: Any,
        key: str | None = None,
        value: str | None = None,
        ts: str | None = None,
        *,
        window_start: str | None = None,
        window_end: str | None = None,
    ) -> None:
        if (window_start is None) != (window_end is None):
            raise ValueError("a columnar batch names both window bound columns or neither")
        self.data = data  # a pyarrow.RecordBatch
        self.key = key
        self.value = value
        self.ts = ts
        self.window_start = window_start
        self.window_end = window_end
        self._elements: Batch | None = None

    def __len__(self) -> int:
        return int(self.data.num_rows)

    def __repr__(self) -> str:
        window = "" if self.window_start is None else f", window=({self.window_start!r}, {self.window_end!r})"
        return f"ColumnBatch({len(self)} rows, key={self.key!r}, value={self.value!r}, ts={self.ts!r}{window})"

    def with_data(self, data: Any) -> ColumnBatch:
        """The same roles over other rows of the same schema (a filtered or split batch)."""
        return ColumnBatch(
            data, self.key, self.value, self.ts, window_start=self.window_start, window_end=self.window_end
        )

    def column(self, name: str | None) -> list[Any]:
        """Column ``name`` as Python values (``None`` per row when there is no such role)."""
        if name is None:
            return [None] * len(self)
        return list(self.data.column(name).to_pylist())

    def elements(self) -> Batch:
        """The rows as elements ``(key, value, ts)`` (six wide with window bounds: ``(key, value, ts, 0,
        (start, end), "on_time")``): made once, then the same list for every receiver."""
        made = self._elements
        if made is None:
            values = self.other_columns().to_pylist() if self.value is None else self.column(self.value)
            rows = zip(self.column(self.key), values, self.column(self.ts), strict=True)
            if self.window_start is None:
                made = list(rows)
            else:
                bounds = zip(self.column(self.window_start), self.column(self.window_end), strict=True)
                made = [(*row, 0, window, "on_time") for row, window in zip(rows, bounds, strict=True)]
            self._elements = made
        return made

    def roles(self) -> tuple[str | None, ...]:
        """The role columns: key, value, ts, window start and end (``None`` where there is none)."""
        return (self.key, self.value, self.ts, self.window_start, self.window_end)

    def other_columns(self) -> Any:
        """The record batch without its key, ts and window columns (what a ``value=None`` record's value holds)."""
        roles = (self.key, self.ts, self.window_start, self.window_end)
        return self.data.select([name for name in self.data.schema.names if name not in roles])

    def last_ts(self) -> Any:
        """The event time of the last row (what emitted results are stamped with), or ``None``."""
        if self.ts is None or not len(self):
            return None
        return self.data.column(self.ts)[-1].as_py()


def columns_of(batch: Batch) -> ColumnBatch:
    """Elements as a columnar batch with the fields ``key``, ``value`` and ``ts`` (a columnar node fed by
    an element stream). Raises ``TypeError`` (from pyarrow) for values of mixed types."""
    pa = import_pyarrow()
    keys, values, stamps = [], [], []
    for element in batch:
        keys.append(element[0])
        values.append(element[1])
        stamps.append(element[2])
    try:
        data = pa.record_batch({"key": pa.array(keys), "value": pa.array(values), "ts": pa.array(stamps)})
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise TypeError(f"these records do not fit Arrow columns ({exc})") from exc
    return ColumnBatch(data, "key", "value", "ts")


def field_names(data: Any) -> str:
    """The column names of a record batch, for messages."""
    return ", ".join(data.schema.names) or "none"
