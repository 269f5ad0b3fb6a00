"""``SAME_KEY`` routing of a columnar batch: one part per instance, each key where its elements would go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamlet.core.model.columns import ColumnBatch, field_names, import_pyarrow
from streamlet.errors import FieldError, TopologyError


def split_by_instance(
    batch: ColumnBatch, instances_of: Callable[[list[Any]], list[int]], instances: int, label: str
) -> list[tuple[int, ColumnBatch]]:
    """``(instance, part)`` for every instance that gets rows of ``batch``, rows in their order.

    ``instances_of`` (the keyed route's: the segment table over ``stable_hash``)
    is asked once for the distinct keys of the batch, never per row: the key
    column is dictionary-encoded, the instances of its dictionary taken per row.
    """
    pa = import_pyarrow()
    if batch.key is None:
        raise TopologyError(f"{label}: SAME_KEY routes a columnar batch by its key column, but it has none (key=...)")
    try:
        column = batch.data.column(batch.key)
    except KeyError:
        raise FieldError(
            f"{label}: the key column {batch.key!r} is not in the batch (fields: {field_names(batch.data)})"
        ) from None
    encoded = column.dictionary_encode(null_encoding="encode")
    owners = pa.array(instances_of(encoded.dictionary.to_pylist()), pa.int32())
    per_row = owners.take(encoded.indices)
    compute = pa.compute
    parts: list[tuple[int, ColumnBatch]] = []
    for index in range(instances):
        part = batch.data.filter(compute.equal(per_row, index))
        if part.num_rows:
            parts.append((index, batch.with_data(part)))
    return parts
