"""State TTL against its model (tests/spec/models/ttl.py, written from docs/state.md "State TTL" alone): random
writes, reads, deletes, clock steps, failed calls taken back and checkpoints restored (into either backend),
each read and listing checked against the model, on the in-memory state and on RocksDB's."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import streamlet as sl
from streamlet.core.model.timers import Timers
from streamlet.core.state.keyed import _unpack
from streamlet.core.state.undo import CallUndo, UndoableExpiringState
from tests.spec.budget import examples
from tests.spec.models.ttl import TtlModel

TTL = 10.0
BACKENDS = ("memory", "rocksdb")
KEYS = st.sampled_from([0, 1, 2, "a", "b", "long key " * 8, (1, "x"), (2, (3, "y"))])
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.lists(st.integers(0, 3), max_size=3))
BULK = 1100  # keys a bulk write puts: more than RocksDB's write times batch (1 024)


def _simple_ops() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.one_of(
        st.tuples(st.just("put"), KEYS, VALUES),
        st.tuples(st.just("get"), KEYS),
        st.tuples(st.just("delete"), KEYS),
        st.tuples(st.just("list")),
        st.tuples(st.just("advance"), st.sampled_from([0.0, 0.5, 1.0, 2.5, 5.0, 9.5, 10.0, 30.0])),
    )


OPS = st.lists(
    st.one_of(
        _simple_ops(),
        st.tuples(st.just("failed call"), st.lists(_simple_ops(), max_size=6)),
        st.tuples(st.just("restore"), st.sampled_from(BACKENDS), st.booleans()),
        st.tuples(st.just("bulk"), VALUES),
    ),
    max_size=40,
)


class Harness:
    """The state under test, its clock, and the model beside it."""

    def __init__(self, backend: str, folder: Path) -> None:
        self.time = 0.0
        self.folder = folder
        self.rocks = sl.RocksDBState(folder / "rocks", cache_entries=4)
        self.model = TtlModel(TTL)
        self.state = self.new_state(backend)

    def now(self) -> float:
        return self.time

    def new_state(self, backend: str) -> Any:
        """An empty state with a TTL on ``backend`` whose failed calls can be taken back."""
        if backend == "memory":
            return UndoableExpiringState(TTL, self.now)
        return self.rocks.open("job", "task", 0, 4096, TTL, self.now)

    def run(self, op: tuple[Any, ...], model: TtlModel | None) -> None:
        """``op`` on the state, and on ``model`` too unless it is ``None`` (a call that fails)."""
        kind, now = op[0], self.time
        if kind == "put":
            self.state.put(op[1], op[2])
            if model is not None:
                model.put(op[1], op[2], now)
        elif kind == "get":
            got = self.state.get(op[1], "absent")
            if model is not None:
                assert got == model.get(op[1], "absent", now), op
        elif kind == "delete":
            self.state.delete(op[1])
            if model is not None:
                model.delete(op[1], now)
        elif kind == "list":
            listed = sorted(self.state.items(), key=repr)
            if model is not None:
                assert listed == sorted(model.items(now).items(), key=repr)
        elif kind == "advance":
            self.time += op[1]
        elif kind == "bulk":
            for index in range(BULK):
                self.state.put(f"bulk{index}", op[1])
                assert model is not None
                model.put(f"bulk{index}", op[1], now)

    def failed_call(self, ops: list[tuple[Any, ...]]) -> None:
        """``ops`` in one call that fails: taken back, so the model sees none of them (the clock's steps
        stand)."""
        undo = CallUndo(self.state, Timers(self.now))
        undo.begin()
        for op in ops:
            self.run(op, None)
        undo.take_back()

    def restore(self, backend: str, with_write_times: bool) -> None:
        """A checkpoint now, restored into a new state on ``backend`` (without its write times: a checkpoint
        taken before the task had a TTL)."""
        values, written = self.state.checkpoint(), self.state.checkpoint_written()
        expected_values, expected_written = self.model.checkpoint(self.time)
        assert (_unpack(values), _unpack(written)) == (expected_values, expected_written)
        self.state = self.new_state(backend)
        self.state.restore(values)
        self.state.restore_written(written if with_write_times else None)
        self.model = TtlModel.restored(TTL, expected_values, expected_written if with_write_times else None, self.time)


def check(backend: str, ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        harness = Harness(backend, Path(folder))
        try:
            for op in ops:
                if op[0] == "failed call":
                    harness.failed_call(op[1])
                elif op[0] == "restore":
                    harness.restore(op[1], op[2])
                else:
                    harness.run(op, harness.model)
            harness.run(("list",), harness.model)
            harness.restore(backend, True)  # the final checkpoint is the model's too
        finally:
            harness.rocks.close()


@examples(0.5)
@given(backend=st.sampled_from(BACKENDS), ops=OPS)
def test_reads_listings_and_checkpoints_are_the_models(backend: str, ops: list[tuple[Any, ...]]) -> None:
    """Every read and listing, and every checkpoint's values and write times, are what the model of the docs
    says, through failed calls (taken back) and restores into either backend."""
    check(backend, ops)


def test_a_bulk_of_keys_expires_past_the_batches_of_write_times() -> None:
    """1 100 keys written at 0 (past one batch of write times), half written again at 5, then reads at 9.5,
    10 and 15 on RocksDB: each read is the model's (a fixed case of the property above, always run)."""
    rewrites = [("put", f"bulk{index}", "again") for index in range(0, BULK, 2)]
    reads = [("get", f"bulk{index}") for index in range(0, BULK, 97)] + [("list",)]
    ops: list[tuple[Any, ...]] = [
        ("bulk", 1), ("advance", 5.0), *rewrites, ("advance", 4.5), *reads, ("advance", 0.5), *reads,
        ("restore", "memory", True), ("advance", 5.0), *reads,
    ]  # fmt: skip
    check("rocksdb", ops)
