"""``lookup_join``: enrichment from an outside store, the model side.

A :class:`LookupJoinTask` only holds what the user wrote (the lookup, the
join's kind, the cache's limits); the runtime's ``LookupJoinInstance``
(``core.runtime.lookup_join``) runs it: one ``await lookup(keys)`` per batch
for the distinct keys it has not cached, up to ``concurrency`` in flight,
output in input order.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Hashable, Mapping
from datetime import date, time, timedelta
from decimal import Decimal
from typing import Any, Final

from streamlet.core.model.async_calls import check_timeout
from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.task import Task
from streamlet.errors import TopologyError

#: ``async lookup(keys) -> {key: row}``: the rows of the keys asked; a key missing from the answer has none.
Lookup = Callable[[list[Any]], Awaitable[Mapping[Hashable, Any]]]
#: ``fn(key, value, row) -> value``: the output value of a record and its key's row (``None``: no row).
LookupFunction = Callable[[Any, Any, Any], Any]

KINDS: Final = ("inner", "left")


def pair(key: Any, value: Any, row: Any) -> tuple[Any, Any]:
    """The default output value: the record's value and its key's row."""
    return (value, row)


class LookupJoinTask(Task):
    """Each record joined with its key's row from ``lookup`` (run by the runtime, not here)."""

    runs_calls_itself = True  # the runtime runs its calls (concurrently): run_in stays 'loop'

    keyed_inputs: Final = True  # the cache is per instance: a key's records reach one instance
    ordered: Final = True  # the output keeps the input's order

    def __init__(
        self,
        lookup: Lookup,
        how: str,
        fn: LookupFunction | None,
        cache_size: int,
        cache_ttl: float | None,
        concurrency: int,
        timeout: float | None,
    ) -> None:
        self.lookup = lookup
        self.how = how
        self.fn: LookupFunction = pair if fn is None else fn
        self.cache_size = cache_size
        self.cache_ttl = cache_ttl
        self.concurrency = concurrency
        self.timeout = timeout

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Never called: the instance looks keys up itself while it takes more input."""
        raise TypeError("a lookup_join task is run by its instance, batch by batch")


def check_lookup_join(name: str, lookup: Any, how: Any, fn: Any, options: dict[str, Any], **limits: Any) -> None:
    """What ``lookup_join`` refuses, named by the task."""
    where = f"task '{name}'"
    if not callable(lookup):
        raise TopologyError(f"{where}: lookup must be an async function lookup(keys) -> dict, got {lookup!r:.80}")
    if how not in KINDS:
        raise TopologyError(f"{where}: how must be one of {KINDS}, got {how!r}")
    if fn is not None and not callable(fn):
        raise TopologyError(f"{where}: fn must be a function fn(key, value, row), got {fn!r:.80}")
    cache_size, concurrency = limits["cache_size"], limits["concurrency"]
    if type(cache_size) is not int or cache_size < 0:
        raise TopologyError(f"{where}: cache_size must be a whole number >= 0, got {cache_size!r}")
    if type(concurrency) is not int or concurrency < 1:
        raise TopologyError(f"{where}: concurrency must be a whole number >= 1, got {concurrency!r}")
    check_timeout(where, "cache_ttl", limits["cache_ttl"])
    check_timeout(where, "timeout", limits["timeout"])
    for refused in ("window", "state_ttl"):
        if options.get(refused) is not None:
            raise TopologyError(f"{where}: lookup_join keeps no windows or state; {refused} is refused")


_IMMUTABLE: tuple[type, ...] = (str, int, float, complex, bool, bytes, type(None), Decimal, date, time, timedelta)


def row_copier(row: Any) -> Callable[[Any], Any]:
    """How a cached row is handed out, decided once when it is cached: so that neither ``fn`` nor a task
    downstream can change what later records of the key get. An immutable row is handed out as it is; a
    dict or list of immutable values as a shallow copy (the common case: a table's row); anything else as a
    deep copy."""
    if _immutable(row):
        return _as_it_is
    if type(row) is dict and all(_immutable(value) for value in row.values()):
        return dict.copy
    if type(row) is list and all(_immutable(value) for value in row):
        return list.copy
    return copy.deepcopy


def _immutable(value: Any) -> bool:
    if isinstance(value, _IMMUTABLE):
        return True
    if type(value) is tuple or type(value) is frozenset:
        return all(_immutable(item) for item in value)
    return False


def _as_it_is(row: Any) -> Any:
    return row
