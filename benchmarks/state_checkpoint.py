"""Checkpoints of RocksDB state: full (every key, as the in-memory state checkpoints) vs incremental (the keys
written since the previous checkpoint, a chunk of a changelog), with 1 % of the keys changed per interval.

One ``RocksDBState(cache_mb=256)`` instance holds ``keys`` keyed counts (``"w<i>" -> int``, as a keyed count
holds them). Each interval adds 1 to 1 % of the keys (a fixed random sample per interval), then takes both
checkpoints the way the coordinator does: the instance's snapshot, the document encoded and saved into a
:class:`~streamlet.DirectoryCheckpointStore` (fsynced), the incremental one handing its new chunk to the
store first. Measured: the incremental checkpoint's rate (changed keys / seconds); baseline: the full one's;
``ratio`` = incremental / full (the speed-up), with the bytes each writes per checkpoint, medians over
``intervals``, and the time to restore a fresh database from the chain (the last checkpoint's chunks) vs from
the full checkpoint. ``small_keys``: the same incremental checkpoint (the same number of changed keys) on a state
``keys / small_divisor`` big, to show the cost does not follow the state's size.
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import streamlet as sl
from benchmarks.common import report
from streamlet.core.state import changelog as cl
from streamlet.core.state.rocks_keyed import RocksKeyedState
from streamlet.core.state.store import DirectoryCheckpointStore, encode

CHANGED = 0.01


def filled(backend: sl.RocksDBState, keys: int) -> RocksKeyedState:
    """An instance's state holding ``keys`` counts."""
    state = backend.open("bench", "count", 0, 4096)
    values = state.values
    for i in range(keys):
        values[f"w{i}"] = 1
    return state


def saved(store: DirectoryCheckpointStore, epoch: int, snapshot: Any) -> int:
    """Bytes written saving ``snapshot`` as checkpoint ``epoch``'s one task (its new chunk first)."""
    document: dict[str, Any] = {"epoch": epoch, "tasks": {"count": [{"state": snapshot}]}}
    written = cl.store_increments(document, store.save_chunk)
    data = encode(document)
    store.save(epoch, data)
    return written + len(data)


def intervals(state: RocksKeyedState, changed: int, count: int, folder: Path) -> dict[str, list[float]]:
    """``count`` intervals of ``changed`` keys: each checkpointed incrementally, then in full."""
    keys = sum(1 for _ in state.values.db.keys())  # noqa: SIM118 - an Rdict
    incremental = DirectoryCheckpointStore(folder / "incremental")
    full = DirectoryCheckpointStore(folder / "full", incremental=False)
    measured: dict[str, list[float]] = {name: [] for name in ("inc_s", "inc_bytes", "full_s", "full_bytes")}
    saved(incremental, 0, state.checkpoint_increment())  # the chain's first, full chunk
    chooser = random.Random(7)
    for epoch in range(1, count + 1):
        values = state.values
        for i in chooser.sample(range(keys), changed):
            values[f"w{i}"] = values[f"w{i}"] + 1
        began = time.perf_counter()
        snapshot = state.checkpoint_increment()
        size = saved(incremental, epoch, snapshot)
        measured["inc_s"].append(time.perf_counter() - began)
        measured["inc_bytes"].append(size)
        began = time.perf_counter()
        snapshot = state.checkpoint()
        size = saved(full, epoch, snapshot)
        measured["full_s"].append(time.perf_counter() - began)
        measured["full_bytes"].append(size)
    return measured


def restore_seconds(store_folder: Path, backend: sl.RocksDBState, index: int) -> tuple[float, int]:
    """Seconds to read the store's newest checkpoint and restore a fresh database from it; chunks read."""
    began = time.perf_counter()
    latest = DirectoryCheckpointStore(store_folder).latest()
    assert latest is not None
    snapshot = latest[1]["tasks"]["count"][0]["state"]
    state = backend.open("bench", "restored", index, 4096)
    state.restore(snapshot)
    seconds = time.perf_counter() - began
    state.close()
    return seconds, len(snapshot[cl.CHANGELOG])


def main(keys: int, repeats: int, small_divisor: int = 10) -> dict[str, Any]:
    """Checkpoints of a ``keys``-key state, ``repeats`` intervals (and of a state ``small_divisor`` times smaller)."""
    folder = Path(tempfile.mkdtemp(prefix="streamlet-bench-state-checkpoint-"))
    began = time.perf_counter()
    try:
        backend = sl.RocksDBState(folder / "rocks", cache_mb=256)
        changed = int(keys * CHANGED)
        measured = intervals(filled(backend, keys), changed, repeats, folder / "big")
        restore_chain, chunks = restore_seconds(folder / "big" / "incremental", backend, 1)
        restore_full, _ = restore_seconds(folder / "big" / "full", backend, 2)
        backend.close()
        small_backend = sl.RocksDBState(folder / "small-rocks", cache_mb=256)
        small = intervals(filled(small_backend, keys // small_divisor), changed, repeats, folder / "small")
        small_backend.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def median(name: str, of: dict[str, list[float]] = measured) -> float:
        return statistics.median(of[name])

    return report(
        "state-checkpoint",
        changed / median("inc_s"),
        changed / median("full_s"),
        keys=keys,
        changed_per_interval=changed,
        intervals=repeats,
        incremental_seconds=round(median("inc_s"), 3),
        full_seconds=round(median("full_s"), 3),
        incremental_bytes=round(median("inc_bytes")),
        full_bytes=round(median("full_bytes")),
        bytes_ratio=round(median("inc_bytes") / median("full_bytes"), 4),
        small_state_keys=keys // small_divisor,
        small_state_incremental_seconds=round(median("inc_s", small), 3),
        cost_big_over_small=round(median("inc_s") / median("inc_s", small), 2),
        restore_chain_seconds=round(restore_chain, 2),
        restore_chain_chunks=chunks,
        restore_full_seconds=round(restore_full, 2),
        wall_seconds=round(time.perf_counter() - began, 1),
    )
