"""The rows ``PostgresSink`` writes: the default row (``key``, ``value``, ``ts``) and a fast picker of a
custom row's columns; and what a writer reads of its sink's settings (:class:`SinkSettings`)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from streamlet.core.model.record import Record
from streamlet.errors import ConnectorError

Row = Callable[[Record], Mapping[str, Any]]
DEFAULT_COLUMNS = ("key", "value", "ts")


class SinkSettings(Protocol):
    """What a ``PostgresSink``'s writer reads of the sink (typed apart, so the writer does not import it)."""

    dsn: str
    table: str
    row: Row | None
    conflict: tuple[str, ...] | None
    batch_rows: int
    on_error: str
    reconnect_within: float


def default_row(record: Record) -> Mapping[str, Any]:
    """``{"key": ..., "value": ..., "ts": ...}``: the record as three columns."""
    return {"key": record.key, "value": record.value, "ts": record.ts}


def picker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``mapping -> tuple of its values for names`` (C speed: ``operator.itemgetter``)."""
    if not names:
        raise ConnectorError("PostgresSink: row() returned no columns")
    getter = operator.itemgetter(*names)
    if len(names) > 1:
        return getter
    return lambda mapping: (getter(mapping),)
