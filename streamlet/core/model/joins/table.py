"""The table join (Kafka Streams' KStream-KTable join), in processing order.

RIGHT is a changelog: a record sets its key's row to its value, and a value
of ``None`` deletes the row (a tombstone); right records emit nothing. A LEFT
record is joined with the row its key holds when the left record is
processed. Rows live in ``self.state`` (so ``state_ttl`` expires them).

With ``bootstrap`` the table is loaded before the stream is joined: until the
runtime says the RIGHT input has caught up with its sources (``holding`` is
cleared, then :meth:`release`), left records wait in the key's state entry,
which is then ``[row or None, [[value, ts], ...]]`` (checkpointed and moved
by key segment like the rows); the runtime holds the LEFT input back once
``bootstrap_buffer`` records wait in one instance.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from streamlet.core.model.joins.base import JoinFunction, StreamJoin
from streamlet.core.model.ports import Inputs, Outputs
from streamlet.core.model.record import Element

_NO_ROW: Any = object()


class TableJoin(StreamJoin):
    """``topology.table_join``: see :meth:`streamlet.Topology.table_join`."""

    kinds = ("inner", "left")

    def __init__(self, how: str, fn: JoinFunction | None, bootstrap: bool, bootstrap_buffer: int) -> None:
        super().__init__(how, fn)
        self.bootstrap = bootstrap
        self.bootstrap_buffer = bootstrap_buffer
        #: Left records wait (the runtime clears it once the table side caught up, for good in this run).
        self.holding = bootstrap
        self.waiting = 0  # left records waiting in this instance's state

    def on_right(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Set (or with ``None``, delete) each key's row."""
        state = self.state
        if self.bootstrap:
            self._set_rows(batch)
            return
        for key, value, *_ in batch:
            if value is None:
                state.delete(key)
            else:
                state.put(key, value)

    def _set_rows(self, batch: list[Element]) -> None:
        """``on_right`` with bootstrap: the row is the entry's first item (``None``: no row); an entry with
        neither a row nor waiting records goes."""
        state = self.state
        for key, value, *_ in batch:
            entry = state.get(key)
            if entry is not None and entry[1]:
                state.put(key, [value, entry[1]])
            elif value is None:
                state.delete(key)
            else:
                state.put(key, [value, []])

    def on_left(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Join each left record with its key's row now ("left": ``(value, None)`` without one); while the
        table side loads, keep it waiting instead."""
        if not self.bootstrap:
            self._join_now(batch, outputs, self.state)
        elif self.holding:
            self._wait(batch)
        else:
            self._join_now(batch, outputs, _Rows(self.state))

    def _wait(self, batch: list[Element]) -> None:
        state = self.state
        for key, value, ts, *_ in batch:
            entry = state.get(key)
            if entry is None:
                state.put(key, [None, [[value, ts]]])
            else:
                entry[1].append([value, ts])
                state.put(key, entry)
        self.waiting += len(batch)
        self.hooks.counters.hold(len(batch))  # the join's held records: statistics show them waiting

    def release(self, outputs: Outputs) -> None:
        """The table side caught up: every waiting left record is joined now, each key's in arrival order."""
        self.holding = False
        state = self.state
        waiting = [(key, entry) for key, entry in state.items() if entry[1]]
        for key, entry in waiting:
            row, records = entry[0], entry[1]
            if row is None:
                state.delete(key)
            else:
                state.put(key, [row, []])
            self.hooks.counters.hold(-len(records))  # (``waiting`` no longer matters: counted again at a restore)
            batch = [(key, value, ts) for value, ts in records]
            self._join_now(batch, outputs, {} if row is None else {key: row})

    def recount(self) -> None:
        """The state was replaced (a restore) or keys moved: count the waiting records again."""
        if self.bootstrap:
            self.waiting = self.hooks.counters.held = sum(len(entry[1]) for _, entry in self.state.items())
            self.hooks.counters.hold(0)  # the peak counts restored records too

    def _join_now(self, batch: list[Element], outputs: Outputs, rows: Any) -> None:
        """Join ``batch`` with the rows ``rows.get(key, _NO_ROW)`` gives."""
        keeps_left = self.keeps_left
        out: list[Element] = []
        for element in batch:
            key, value, ts = element[0], element[1], element[2]
            row = rows.get(key, _NO_ROW)
            if row is _NO_ROW:
                if not keeps_left:
                    continue
                row = None
            results = self.outputs_of(element, partial(self._joined, key, value, row, ts))
            if results is not None:
                out.extend(results)
        if out:
            outputs.emit_elements(out)

    def _joined(self, key: Any, value: Any, row: Any, ts: Any) -> list[Element]:
        return [(key, self.value(key, value, row), ts)]


class _Rows:
    """The rows of a bootstrapping join's entries, looked up as a plain table's are."""

    __slots__ = ("state",)

    def __init__(self, state: Any) -> None:
        self.state = state

    def get(self, key: Any, default: Any) -> Any:
        entry = self.state.get(key)
        return default if entry is None or entry[0] is None else entry[0]
