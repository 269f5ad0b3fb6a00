"""A failed call under skip or restart leaves nothing behind: state, in-place changes, TTLs and timers are
taken back before the replay, so every record takes effect exactly once (and a skipped one not at all)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import streamlet as sl
from tests.conftest import pairs

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

POISON = 3  # the value the tasks below fail on (the 4th record of 0..5)


def keyed(values: list[int], key: str = "k") -> list[tuple[str, int]]:
    return [(key, value) for value in values]


def run_one(task: Any, items: list[Any], batch_size: int, **options: Any) -> sl.JobResult:
    topology = sl.Topology("undo")
    source = topology.add_source("in", items)
    node = topology.add_task("count", task, **options).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    return sl.run(topology, batch_size=batch_size)


class Poisoned(sl.Task):
    """Counts records and sums values per key through get/put, then fails on the poison value."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + 1)
            self.state.put("sum", self.state.get("sum", 0) + record.value)
            check(record)

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(sorted(self.state.items()))


class AsyncPoisoned(Poisoned):
    """The same count in an ``async def execute``."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:  # type: ignore[override]
        Poisoned.execute(self, inputs, outputs)


class Transient(Poisoned):
    """Fails once on the poison value (across restarts), then succeeds."""

    failed: ClassVar[list[int]] = []

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + 1)
            self.state.put("sum", self.state.get("sum", 0) + record.value)
            if record.value == POISON and not self.failed:
                self.failed.append(record.value)
                raise ConnectionError("backend away")


class AsyncTransient(Transient):
    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:  # type: ignore[override]
        Transient.execute(self, inputs, outputs)


def check(record: sl.Record) -> None:
    if record.value == POISON:
        raise ValueError(f"poison {record.value}")


@pytest.mark.parametrize("batch_size", [1, 2, 4, 1000])
@pytest.mark.parametrize("task", [Poisoned, AsyncPoisoned])
def test_skip_counts_every_other_record_once_and_the_failed_one_not_at_all(task: Any, batch_size: int) -> None:
    """6 records of one key, the 4th failing: the count is 5 and the sum leaves out the poison value."""
    result = run_one(task, keyed(list(range(6))), batch_size, on_error="skip")
    assert pairs(result.sink("out")) == [("k", 5), ("sum", 0 + 1 + 2 + 4 + 5)]
    assert [(letter.record.key, letter.record.value) for letter in result.dead_letters] == [("k", POISON)]


@pytest.mark.parametrize("batch_size", [1, 2, 4, 1000])
@pytest.mark.parametrize("task", [Transient, AsyncTransient])
def test_restart_retries_from_the_state_before_the_failed_call(task: Any, batch_size: int) -> None:
    """One transient failure under restart: the count is 6 and the sum 15, as with no failure."""
    Transient.failed.clear()
    result = run_one(task, keyed(list(range(6))), batch_size, on_error="restart", max_failures=1)
    assert pairs(result.sink("out")) == [("k", 6), ("sum", 15)]
    assert Transient.failed == [POISON]
    assert result.statistics.restarts == 1


class ThroughTheDict(sl.Task):
    """Writes ``state.values`` directly: adds, deletes, changes a list in place, pops and sets defaults."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        values = self.state.values
        for record in inputs.get():
            values["count"] = values.get("count", 0) + 1
            values.setdefault("seen", []).append(record.value)
            self.state.get("seen").append(-record.value)  # in place, through get
            values[f"tmp{record.value}"] = record.value
            del values[f"tmp{record.value}"]
            values.pop("gone", None)
            values.update(last=record.value)
            check(record)

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(sorted(self.state.items()))


@pytest.mark.parametrize("batch_size", [1, 3, 1000])
def test_skip_takes_back_writes_to_the_values_dict_and_in_place_changes(batch_size: int) -> None:
    """Direct writes to ``state.values`` and a list changed in place are undone with the failed call."""
    result = run_one(ThroughTheDict, keyed(list(range(6))), batch_size, on_error="skip")
    kept = [0, 1, 2, 4, 5]
    seen = [item for value in kept for item in (value, -value)]
    assert pairs(result.sink("out")) == [("count", 5), ("last", 5), ("seen", seen)]


class Timed(sl.Task):
    """Sets a timer per record and cancels the previous one; the poison record fails after its changes."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            if record.value > 0:
                self.timers.cancel("t", 100.0 + record.value - 1)
            self.timers.at("t", 100.0 + record.value)
            self.timers.at("poison-only", 500.0) if record.value == POISON else None
            check(record)

    def on_timer(self, key: Any, when: float, time: Any, outputs: sl.Outputs) -> None:
        outputs.emit(key, when)


def test_skip_takes_back_the_timers_a_failed_call_set_and_cancelled() -> None:
    """The poison record's timer is never set and the timer it cancelled still fires."""
    at_zero = [sl.Record(key, value, 0.0) for key, value in keyed(list(range(6)))]  # the timers fire at the end
    result = run_one(Timed, at_zero, 1, on_error="skip")
    # record 3 failed: 102 stays (its cancel was taken back), 103 and poison-only were never set;
    # record 4 cancels 103 (absent) and sets 104, record 5 cancels 104 and sets 105
    assert pairs(result.sink("out")) == [("t", 102.0), ("t", 105.0)]


class TimerCounts(sl.Task):
    """Each record arms a timer; the timer callback counts in state and fails on its first firing once."""

    failed: ClassVar[list[float]] = []

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.timers.at(record.key, float(record.value))

    def on_timer(self, key: Any, when: float, time: Any, outputs: sl.Outputs) -> None:
        self.state.put("fired", self.state.get("fired", 0) + 1)
        self.timers.at("extra", 1000.0)
        if not self.failed:
            self.failed.append(when)
            raise TimeoutError("slow")

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(sorted(self.state.items()))


def test_restart_of_a_timer_callback_counts_it_once() -> None:
    """A timer callback retried under restart counts its firing once."""
    TimerCounts.failed.clear()
    result = run_one(
        TimerCounts, [sl.Record("a", 1, 0.0), sl.Record("b", 2, 0.0)], 1, on_error="restart", max_failures=1
    )
    assert pairs(result.sink("out")) == [("fired", 2)]  # a once (its failed try taken back), then b
    assert TimerCounts.failed == [1.0]


@pytest.mark.parametrize("batch_size", [1, 2, 1000])
def test_skip_under_a_state_ttl_counts_exactly(batch_size: int) -> None:
    """With ``state_ttl`` the failed call's writes are undone too (write times: see test_undo)."""
    result = run_one(Poisoned, keyed(list(range(6))), batch_size, on_error="skip", state_ttl=3600.0)
    assert pairs(result.sink("out")) == [("k", 5), ("sum", 12)]


def appending(accumulated: Any, value: Any) -> Any:
    """A reduce function that changes its accumulator in place before it fails."""
    if not isinstance(accumulated, list):
        accumulated = [accumulated]
    accumulated.append(value)
    if value == POISON:
        raise ValueError("poison")
    return accumulated


@pytest.mark.parametrize("emit", ["batch", "record"])
@pytest.mark.parametrize("batch_size", [1, 4, 1000])
def test_reduce_skip_leaves_an_accumulator_changed_in_place_as_it_was(batch_size: int, emit: str) -> None:
    """A reduce function that appends, then fails, leaves the accumulator without the poison value."""
    topology = sl.Topology("undo-reduce")
    source = topology.add_source("in", keyed(list(range(6))))
    node = topology.reduce("acc", appending, on_error="skip", emit=emit).set_input(source)  # type: ignore[arg-type]
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, batch_size=batch_size)
    assert pairs(result.sink("out"))[-1] == ("k", [0, 1, 2, 4, 5])
    assert [letter.record.value for letter in result.dead_letters] == [POISON]


@pytest.mark.in_memory_state_only(
    "processes=2 forks this process, which has run RocksDB: refused (tests/unit/core/test_rocksdb_state.py)"
)
def test_skip_is_exact_with_processes() -> None:
    """With processes=2 each key's count and sum leave out exactly the poison records."""
    items = [(f"k{index % 4}", index % 7) for index in range(200)]
    result = run_one(Poisoned, items, 8, on_error="skip", parallelism=2)
    expected: dict[str, int] = {}
    total = 0
    for key, value in items:
        if value != POISON:
            expected[key] = expected.get(key, 0) + 1
            total += value
    topology = sl.Topology("undo")
    source = topology.add_source("in", items)
    node = topology.add_task("count", Poisoned, on_error="skip", parallelism=2)
    node.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    in_processes = sl.run(topology, batch_size=8, processes=2)
    for outcome in (result, in_processes):
        got = pairs(outcome.sink("out"))
        counts = {key: value for key, value in got if key != "sum"}
        assert counts == expected
        assert sum(value for key, value in got if key == "sum") == total
        assert len(outcome.dead_letters) == sum(1 for _, value in items if value == POISON)


class Probe(sl.Task):
    """Reports the type of its state's dict: what a task under each policy pays for."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit(record.key, type(self.state.values).__name__)


@pytest.mark.parametrize(
    ("policy", "kind"), [("fail", "dict"), ("skip", "JournaledValues"), ("restart", "JournaledValues")]
)
@pytest.mark.in_memory_state_only(
    "the types of the dict's journal; RocksDB journals inside RocksValues (test_rocksdb_state.py)"
)
def test_only_replaying_policies_journal_the_state(policy: str, kind: str) -> None:
    """``fail`` keeps the plain dict (it pays nothing); skip and restart journal the calls."""
    result = run_one(Probe, [("a", 1)], 1, on_error=policy)
    assert pairs(result.sink("out")) == [("a", kind)]
