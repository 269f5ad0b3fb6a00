"""Per-key count windows (``CountWindow(per_key=True)``): each key counts its own records.

Each key runs a :class:`CountLogic` of its own, so tumbling, sliding and partial windows behave exactly
as they do over a whole stream; only the indexes are the key's.
"""

from __future__ import annotations

from typing import Any

from streamlet.core.model.encoding import hashable
from streamlet.core.model.record import Batch
from streamlet.core.windows.fold import ClosedWindow, WindowLogic
from streamlet.core.windows.logic import CountLogic

__all__ = ("KeyedCountLogic",)


class KeyedCountLogic(WindowLogic):
    """Windows of ``size`` records of one key, starting every ``slide`` records of that key.

    Windows are handed over in the order they filled (the order of the records that filled them); at end
    of stream, keys go in the order they first came, each key's windows oldest first.
    """

    def __init__(self, size: int, slide: int) -> None:
        self.size, self.slide = size, slide
        self.keys: dict[Any, CountLogic] = {}  # in the order keys first came

    def _of(self, key: Any) -> CountLogic:
        logic = self.keys.get(key)
        if logic is None:
            logic = self.keys[key] = CountLogic(self.size, self.slide)
            logic.fold = self.fold  # set by window_reduce after this logic was made
        return logic

    def add(self, port: int, batch: Batch, now: float) -> tuple[list[ClosedWindow], Batch]:
        closed: list[ClosedWindow] = []
        # Runs of consecutive records of one key go to that key's logic at once; going run by run in
        # arrival order keeps the windows in the order they filled.
        start = 0
        for index in range(1, len(batch) + 1):
            if index == len(batch) or batch[index][0] != batch[start][0]:
                filled, _ = self._of(batch[start][0]).add(port, batch[start:index], now)
                closed.extend(filled)
                start = index
        return closed, []

    def close_all(self) -> list[ClosedWindow]:
        # each key keeps its count, as CountLogic keeps its own: indexes never restart
        return [window for logic in self.keys.values() for window in logic.close_all()]

    def snapshot(self) -> Any:
        return {"keys": [[key, logic.snapshot()] for key, logic in self.keys.items()]}

    def restore(self, snapshot: Any) -> None:
        self.keys = {}
        for key, data in snapshot["keys"]:
            self._of(hashable(key)).restore(data)  # plain msgpack gives lists for tuple keys
