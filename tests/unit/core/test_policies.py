"""Error policies: fail names task, instance and key; skip dead-letters; restart retries with state."""

from __future__ import annotations

import re
from typing import Any

import pyarrow.compute as pc
import pytest

import streamlet as sl
from tests.conftest import pairs, values

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


def parse(record: sl.Record) -> tuple[Any, Any]:
    if record.value == "bad":
        raise ValueError(f"cannot parse {record.value!r}")
    return record.key, int(record.value)


def job(items: list[Any], task: Any = None, **options: Any) -> sl.Topology:
    topology = sl.Topology("policies")
    source = topology.add_source("in", items)
    if task is None:
        node = topology.map("parse", parse, **options).set_input(source)
    else:
        node = topology.add_task("parse", task, **options).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    return topology


ITEMS = [("a", "1"), ("b", "bad"), ("c", "3")]


def test_fail_stops_the_job_naming_task_instance_and_key() -> None:
    """on_error='fail' raises TaskError naming the task, the instance and the record's key."""
    message = "task 'parse' instance 0 failed on record with key 'b': ValueError: cannot parse 'bad'"
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$") as caught:
        sl.run(job(ITEMS))
    assert (caught.value.task, caught.value.instance, caught.value.key) == ("parse", 0, "b")
    assert isinstance(caught.value.__cause__, ValueError)


def test_skip_sends_the_record_to_dead_letters_and_continues() -> None:
    """on_error='skip' keeps going; the failing record and its error are in dead_letters."""
    result = sl.run(job(ITEMS, on_error="skip"))
    assert pairs(result.sink("out")) == [("a", 1), ("c", 3)]
    [letter] = result.dead_letters
    assert (letter.task, letter.instance, letter.record.key, letter.record.value) == ("parse", 0, "b", "bad")
    assert letter.error == "ValueError: cannot parse 'bad'"
    assert result.statistics.dead_lettered == 1


def test_skip_handles_several_poison_records_in_one_batch() -> None:
    """Every failing record of a batch is dead-lettered; the others all pass."""
    items = [(str(i), "bad" if i % 3 == 0 else str(i)) for i in range(30)]
    result = sl.run(job(items, on_error="skip"))
    assert values(result.sink("out")) == [i for i in range(30) if i % 3]
    assert [d.record.key for d in result.dead_letters] == [str(i) for i in range(0, 30, 3)]


class BatchParser(sl.Task):
    """A user task that fails on a whole batch: the runtime must find the record."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        parsed = [(r.key, int(r.value)) for r in inputs.get()]
        for key, value in parsed:
            outputs.emit(key, value)


def test_fail_in_a_batch_task_is_traced_to_the_record() -> None:
    """A batch-level failure is replayed record by record to name the key."""
    message = (
        "task 'parse' instance 0 failed on record with key 'b': "
        "ValueError: invalid literal for int() with base 10: 'bad'"
    )
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$"):
        sl.run(job(ITEMS, BatchParser))


def test_skip_in_a_batch_task_keeps_the_good_records_once() -> None:
    """After a batch failure the output of the failed call is discarded and the replay emits each good record once."""
    result = sl.run(job(ITEMS, BatchParser, on_error="skip"))
    assert pairs(result.sink("out")) == [("a", 1), ("c", 3)]
    assert [d.record.key for d in result.dead_letters] == ["b"]


class Flaky(sl.Task):
    """Fails the first ``fail_times`` executions across restarts; counts in keyed state."""

    attempts = 0
    fail_times = 2

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put("seen", self.state.get("seen", 0) + 1)
            outputs.emit(record.key, record.value)
        type(self).attempts += 1
        if type(self).attempts <= self.fail_times:
            raise ConnectionError("backend away")

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit("seen", self.state.get("seen"))


def test_restart_retries_with_a_new_task_object_and_keeps_state() -> None:
    """on_error='restart' recreates the task, keeps runtime-owned state and retries the batch."""
    Flaky.attempts = 0
    result = sl.run(job([("a", 1), ("b", 2)], Flaky, on_error="restart", max_failures=3))
    # the two failed attempts were rolled back from the output and from the state: each record counted once
    assert pairs(result.sink("out")) == [("a", 1), ("b", 2), ("seen", 2)]
    assert result.statistics.restarts == 2


def test_restart_gives_up_after_max_failures() -> None:
    """Past max_failures the job fails with a TaskError that says so."""
    Flaky.attempts = -100
    message = "task 'parse' instance 0 failed on record with key 'a' after 2 restarts: ConnectionError: backend away"
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$"):
        sl.run(job([("a", 1)], Flaky, on_error="restart", max_failures=2))


def test_restart_in_a_shortcut_retries_from_the_failing_record() -> None:
    """A shortcut that fails once on a record is restarted and continues from that record."""
    failed: list[str] = []

    def once(record: sl.Record) -> tuple[Any, Any]:
        if record.key == "b" and not failed:
            failed.append(record.key)
            raise TimeoutError("slow")
        return record.key, record.value

    topology = sl.Topology("restart-shortcut")
    source = topology.add_source("in", [("a", 1), ("b", 2), ("c", 3)])
    node = topology.map("m", once, on_error="restart").set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology)
    assert pairs(result.sink("out")) == [("a", 1), ("b", 2), ("c", 3)]
    assert failed == ["b"]


class BadFinish(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        pass

    def finish(self, outputs: sl.Outputs) -> None:
        raise RuntimeError("no totals")


def test_failure_in_finish_names_the_task() -> None:
    """An exception in finish() fails the job with the task and instance named."""
    message = "task 'parse' instance 0 failed in finish(): RuntimeError: no totals"
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$"):
        sl.run(job([("a", 1)], BadFinish))


def test_failure_in_a_parallel_instance_names_that_instance() -> None:
    """The instance index in the message is the one that failed."""
    topology = sl.Topology("which")
    source = topology.add_source("in", [("k", "bad")])
    node = topology.map("parse", parse, parallelism=3).set_input(source, partitioning=lambda record, n: 2)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    with pytest.raises(sl.TaskError, match=r"^task 'parse' instance 2 failed on record with key 'k'"):
        sl.run(topology)


class SeesThenFails(sl.Task):
    """Emits ``seen <v>`` for each record, then raises on 2; counts in keyed state when ``counts``."""

    counts = False

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit(record.key, f"seen {record.value}")
            if self.counts:
                self.state.put("seen", self.state.get("seen", 0) + 1)
            if record.value == 2:
                raise ValueError("two")

    def finish(self, outputs: sl.Outputs) -> None:
        if self.counts:
            outputs.emit("count", self.state.get("seen"))


class SeesThenFailsAsync(SeesThenFails):
    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:  # type: ignore[override]
        SeesThenFails.execute(self, inputs, outputs)


class CountsThenFails(SeesThenFails):
    counts = True


class CountsThenFailsAsync(SeesThenFailsAsync):
    counts = True


@pytest.mark.parametrize("batch_size", [1, 3, 100])
@pytest.mark.parametrize("task", [SeesThenFails, SeesThenFailsAsync, CountsThenFails, CountsThenFailsAsync])
def test_skip_takes_back_what_the_failed_call_emitted(task: type[SeesThenFails], batch_size: int) -> None:
    """docs/model.md: a failed call is taken back whole, its emissions with its state: 'seen 2' never comes out."""
    items = [("k", 1), ("k", 2), ("k", 3)]
    result = sl.run(job(items, task, on_error="skip"), batch_size=batch_size)
    seen = [r.value for r in result.sink("out") if r.key == "k"]
    assert seen == ["seen 1", "seen 3"]
    assert [(d.record.key, d.record.value) for d in result.dead_letters] == [("k", 2)]
    if task.counts:
        assert [r.value for r in result.sink("out") if r.key == "count"] == [2]


class FailsOn100:
    """Raises on the value 100: always (skip), or only the first time (restart: a transient failure)."""

    def __init__(self, policy: str) -> None:
        self.left = None if policy == "skip" else 1

    def __call__(self, value: Any) -> None:
        if value == 100 and (self.left is None or self.left > 0):
            if self.left is not None:
                self.left -= 1
            raise ValueError("no 100, please")


def builtin(kind: str, check: FailsOn100, topology: sl.Topology, policy: str) -> sl.NodeHandle:
    """The built-in ``kind`` whose user function calls ``check`` on each value."""

    async def doubled(record: sl.Record) -> tuple[Any, Any]:
        check(record.value)
        return record.key, record.value

    async def rows(keys: list[Any]) -> dict[Any, Any]:
        return dict.fromkeys(keys, "row")

    made: dict[str, Any] = {
        "map": lambda: topology.map("n", lambda r: (check(r.value), (r.key, r.value))[1], on_error=policy),
        "flat_map": lambda: topology.flat_map("n", lambda r: (check(r.value), [(r.key, r.value)])[1], on_error=policy),
        "filter": lambda: topology.filter("n", lambda r: (check(r.value), True)[1], on_error=policy),
        "reduce": lambda: topology.reduce("n", lambda a, b: (check(b), a + b)[1], emit="record", on_error=policy),
        "window_reduce": lambda: topology.window_reduce(
            "n", lambda a, b: (check(b), a + b)[1], window=sl.CountWindow(4), on_error=policy
        ),
        "map_async": lambda: topology.map_async("n", doubled, on_error=policy),
        "lookup_join": lambda: topology.lookup_join("n", rows, fn=lambda k, v, row: (check(v), v)[1], on_error=policy),
    }
    handle: sl.NodeHandle = made[kind]()
    return handle


EXPECTED = {
    ("map", "skip"): [1, 2, 4], ("map", "restart"): [1, 2, 100, 4],
    ("flat_map", "skip"): [1, 2, 4], ("flat_map", "restart"): [1, 2, 100, 4],
    ("filter", "skip"): [1, 2, 4], ("filter", "restart"): [1, 2, 100, 4],
    ("reduce", "skip"): [1, 3, 7], ("reduce", "restart"): [1, 3, 103, 107],
    ("window_reduce", "skip"): [7], ("window_reduce", "restart"): [107],
    ("map_async", "skip"): [1, 2, 4], ("map_async", "restart"): [1, 2, 100, 4],
    ("lookup_join", "skip"): [1, 2, 4], ("lookup_join", "restart"): [1, 2, 100, 4],
}  # fmt: skip


@pytest.mark.parametrize(("kind", "policy"), sorted(EXPECTED))
def test_every_builtin_that_calls_user_code_honours_its_error_policy(kind: str, policy: str) -> None:
    """[1, 2, 100, 4] with a function raising on 100: skip dead-letters it, restart calls again and keeps it."""
    topology = sl.Topology("builtins")
    source = topology.add_source("in", [sl.Record("k", v, float(i)) for i, v in enumerate([1, 2, 100, 4])])
    node = builtin(kind, FailsOn100(policy), topology, policy).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, batch_size=3)
    assert values(result.sink("out")) == EXPECTED[kind, policy]
    assert [d.record.value for d in result.dead_letters] == ([100] if policy == "skip" else [])


@pytest.mark.parametrize("policy", ["skip", "restart"])
@pytest.mark.parametrize("kind", ["aggregate", "where"])
def test_a_columnar_node_refuses_an_error_policy_it_has_no_user_code_for(kind: str, policy: str) -> None:
    """aggregate and where call no user code: a policy other than fail is refused, naming the node."""
    topology = sl.Topology("columnar")
    message = f"task 'n': {kind} calls no code of yours, so on_error='{policy}' has nothing to apply to"
    add = {
        "aggregate": lambda: topology.aggregate("n", "sum", on_error=policy),
        "where": lambda: topology.where("n", pc.field("value") > 1, on_error=policy),
    }[kind]
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}"):
        add()


class DropsThenFails(sl.Task):
    """Counts each key; the record 'boom' first drops key 'a', then fails. finish() walks the state in order."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            if record.value == "boom":
                self.state.values.pop("a")
                raise ValueError("boom")
            self.state.put(record.key, self.state.get(record.key, 0) + 1)

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit_all(self.state.items())


@pytest.mark.in_memory_state_only("the dict's insertion order; RocksDB lists keys by layout")
@pytest.mark.parametrize("batch_size", [1, 100])
def test_a_failed_call_that_removed_keys_leaves_the_state_in_its_order(batch_size: int) -> None:
    """The key the failed call popped comes back where it was: finish() sees a, b, c as without the failure."""
    items = [("a", 1), ("b", 1), ("x", "boom"), ("c", 1)]
    result = sl.run(job(items, DropsThenFails, on_error="skip"), batch_size=batch_size)
    assert pairs(result.sink("out")) == [("a", 1), ("b", 1), ("c", 1)]


class WindowFails(sl.Task):
    """Sums each count window; fails on a window holding 100, always or (``transient``) the first time."""

    transient = False
    failures = 0

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        values = [record.value for record in inputs.get()]
        if 100 in values and (not self.transient or type(self).failures == 0):
            type(self).failures += 1
            raise ValueError("no 100, please")
        outputs.emit("sum", sum(values))


class WindowFailsOnce(WindowFails):
    transient = True


def windowed(task: type[WindowFails], **options: Any) -> sl.JobResult:
    """Count windows of 2 over [1, 2, 100, 4, 5, 6] (ts 0..5) through ``task``."""
    task.failures = 0
    topology = sl.Topology("windowed")
    source = topology.add_source("in", [sl.Record(f"k{v}", v, float(i)) for i, v in enumerate([1, 2, 100, 4, 5, 6])])
    node = topology.add_task("w", task, window=sl.CountWindow(2), **options).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    return sl.run(topology)


def test_fail_on_a_window_names_the_window_and_its_first_key() -> None:
    """A window executed as one unit: the TaskError says so, with the first record's key and the error."""
    message = "task 'w' instance 0 failed on a window starting with key 'k100': ValueError: no 100, please"
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$") as failed:
        windowed(WindowFails)
    assert (failed.value.task, failed.value.key) == ("w", "k100")


def test_skip_dead_letters_every_record_of_a_failed_window_with_the_error() -> None:
    """Both records of the failing window are dead letters carrying the error; the other windows come out."""
    result = windowed(WindowFails, on_error="skip")
    assert values(result.sink("out")) == [3, 11]
    assert [(d.record.key, d.error) for d in result.dead_letters] == [
        ("k100", "ValueError: no 100, please"), ("k4", "ValueError: no 100, please"),
    ]  # fmt: skip


def test_restart_executes_a_failed_window_again() -> None:
    """A transient failure: the window is executed again by a fresh task object, and comes out once."""
    result = windowed(WindowFailsOnce, on_error="restart")
    assert values(result.sink("out")) == [3, 104, 11]
    assert result.dead_letters == []


def test_restart_gives_up_on_a_window_naming_it_after_max_failures() -> None:
    message = (
        "task 'w' instance 0 failed on a window starting with key 'k100' after 2 restarts: ValueError: no 100, please"
    )
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$"):
        windowed(WindowFails, on_error="restart", max_failures=2)
