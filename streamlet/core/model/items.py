"""What a channel carries, in one type: records, columns and markers (apart from both, so that ``record`` and
``columns`` need not know each other both ways)."""

from __future__ import annotations

from typing import TypeAlias

from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.record import Batch, Marker

#: What a channel carries: a batch of elements, a columnar batch (between built-in columnar nodes), a marker.
Item: TypeAlias = Batch | ColumnBatch | Marker
