"""The table join (Kafka Streams' KStream-KTable join), in processing order.

RIGHT is a changelog: a record sets its key's row to its value, and a value
of ``None`` deletes the row (a tombstone); right records emit nothing. A LEFT
record is joined with the row its key holds when the left record is
processed. Rows live in ``self.state`` (so ``state_ttl`` expires them).
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

    def __init__(self, how: str = "inner", fn: JoinFunction | None = None) -> None:
        super().__init__(how, fn)

    def on_right(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Set (or with ``None``, delete) each key's row."""
        state = self.state
        for key, value, *_ in batch:
            if value is None:
                state.delete(key)
            else:
                state.put(key, value)

    def on_left(self, batch: list[Element], inputs: Inputs, outputs: Outputs) -> None:
        """Join each left record with its key's row now ("left": ``(value, None)`` without one)."""
        state, keeps_left = self.state, self.keeps_left
        out: list[Element] = []
        for element in batch:
            key, value, ts = element[0], element[1], element[2]
            row = state.get(key, _NO_ROW)
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
