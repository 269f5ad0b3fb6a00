"""``run_in``: a task's plain ``def execute`` on the loop, in a thread or in a process of the job's pool, and a
call that holds the loop counted (``loop_held``) and warned of once per task."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, ClassVar

import pytest
from structlog.testing import capture_logs

import streamlet as sl
from tests.support.held_calls import until_true

RUN_IN = ["loop", "thread", "process"]


class Double(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for r in inputs.get():
            outputs.emit(r.key, r.value * 2, ts=r.ts)
            if r.value % 3 == 0:
                outputs.emit(r.key, -r.value, port=1, ts=r.ts)

    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_outputs(2)


def square(record: sl.Record) -> tuple[Any, Any]:
    return record.key, record.value**2


def reciprocal(record: sl.Record) -> tuple[Any, Any]:
    return record.key, 1 / record.value


def _doubled(run_in: str, batch_size: int) -> tuple[list[Any], list[Any]]:
    topology = sl.Topology("run-in-double")
    src = topology.add_source("src", [sl.Record(f"k{i % 4}", i, float(i)) for i in range(40)])
    work = topology.add_task("double", Double, parallelism=2, run_in=run_in).set_input(src)
    squared = topology.map("square", square, run_in=run_in).set_input(work)
    topology.add_sink("out", sl.CollectSink()).set_input(squared)
    topology.add_sink("side", sl.CollectSink()).set_input(work, out_port=1)
    result = sl.run(topology, batch_size=batch_size)
    out = sorted((r.key, r.value, r.ts) for r in result.sink("out"))
    return out, sorted((r.key, r.value, r.ts) for r in result.sink("side"))


@pytest.mark.parametrize("run_in", ["thread", "process"])
@pytest.mark.parametrize("batch_size", [1, 7])
def test_every_place_gives_what_the_loop_gives(run_in: str, batch_size: int) -> None:
    """Two output ports, the records' times, a shortcut after a task: exactly the loop's answer."""
    want = _doubled("loop", batch_size)
    assert want[0] == sorted((f"k{i % 4}", 4 * i * i, float(i)) for i in range(40))
    assert want[1] == sorted((f"k{i % 4}", -i, float(i)) for i in range(0, 40, 3))
    assert _doubled(run_in, batch_size) == want


@pytest.mark.parametrize("run_in", RUN_IN)
def test_a_failing_record_follows_the_policy_in_every_place(run_in: str) -> None:
    """skip: the record that raised (in a process, too) is dead-lettered with its error's type and message."""
    topology = sl.Topology("run-in-skip")
    src = topology.add_source("src", [("a", 1), ("b", 0), ("c", 4)])
    node = topology.map("inverse", reciprocal, on_error="skip", run_in=run_in).set_input(src)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, batch_size=3)
    assert [(r.key, r.value) for r in result.sink("out")] == [("a", 1.0), ("c", 0.25)]
    assert [(d.record.key, d.error) for d in result.dead_letters] == [("b", "ZeroDivisionError: division by zero")]


@pytest.mark.parametrize("run_in", RUN_IN)
def test_fail_names_the_record_in_every_place(run_in: str) -> None:
    topology = sl.Topology("run-in-fail")
    src = topology.add_source("src", [("a", 1), ("b", 0)])
    node = topology.map("inverse", reciprocal, run_in=run_in).set_input(src)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    with pytest.raises(
        sl.TaskError, match=r"^task 'inverse' instance 0 failed on record with key 'b'.*ZeroDivisionError"
    ):
        sl.run(topology, batch_size=1)


class Count(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for r in inputs.get():
            if r.value < 0:
                raise ValueError("negative")
            self.state.put(r.key, self.state.get(r.key, 0) + 1)
            outputs.emit(r.key, self.state.get(r.key))


def test_a_stateful_task_in_a_thread_keeps_its_state_and_takes_back_a_failed_call() -> None:
    """In a thread the instance's state is its own as on the loop: counts per key, and skip takes back what the
    failed call did to it."""
    topology = sl.Topology("run-in-thread-state")
    rows = [("a", 1), ("b", 1), ("a", 1), ("a", -1), ("b", 1), ("a", 1)]
    src = topology.add_source("src", rows)
    node = topology.add_task("count", Count, on_error="skip", run_in="thread").set_input(src)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, batch_size=6)
    assert [(r.key, r.value) for r in result.sink("out")] == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]
    assert [d.record.value for d in result.dead_letters] == [-1]


class Timed(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for r in inputs.get():
            outputs.emit(r.key, r.value)

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, when)


STATEFUL = {
    "window": ({"window": sl.TimeWindow(10, time="event")}, "has a window"),
    "state_ttl": ({"state_ttl": 5.0}, "has a state_ttl"),
}


@pytest.mark.parametrize("options", [options for options, _ in STATEFUL.values()], ids=list(STATEFUL))
def test_process_refuses_a_task_with_state_when_built(options: dict[str, Any]) -> None:
    topology = sl.Topology("run-in-refused")
    with pytest.raises(
        sl.TopologyError, match=r"^task 'count': run_in='process' .* stateless tasks only, and this one"
    ):
        topology.add_task("count", Count, run_in="process", **options)


def test_process_refuses_reduce_on_timer_and_async_calls() -> None:
    topology = sl.Topology("run-in-refused-more")
    with pytest.raises(sl.TopologyError, match=r"^task 'sum': .* this one folds per key \(reduce\)"):
        topology.reduce("sum", lambda acc, v: acc + v, run_in="process")
    with pytest.raises(sl.TopologyError, match=r"^task 'timed': .* this one has on_timer"):
        topology.add_task("timed", Timed, run_in="process")

    async def lookup(record: sl.Record) -> Any:
        return record.key, record.value

    with pytest.raises(sl.TopologyError, match=r"^task 'enrich': run_in='thread' is for a plain def execute"):
        topology.map_async("enrich", lookup, run_in="thread")
    with pytest.raises(sl.TopologyError, match=r"^task 'x': run_in must be one of \('loop', 'thread', 'process'\)"):
        topology.map("x", square, run_in="gpu")


class AsyncPass(sl.Task):
    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for r in inputs.get():
            outputs.emit(r.key, r.value)


def test_an_async_execute_takes_the_loop_only() -> None:
    with pytest.raises(sl.TopologyError, match=r"^task 'pass': run_in='process' is for a plain def execute"):
        sl.Topology("run-in-async").add_task("pass", AsyncPass, run_in="process")


def test_a_task_that_reads_state_in_a_process_fails_as_a_wiring_mistake() -> None:
    """Count reads self.state: in a process there is none, and no policy applies (on_error='skip' too)."""
    topology = sl.Topology("run-in-process-state")
    src = topology.add_source("src", [("a", 1)])
    node = topology.add_task("count", Count, on_error="skip", run_in="process").set_input(src)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    with pytest.raises(
        sl.TopologyError,
        match=r"^task 'count': run_in='process' runs execute in another process, which has no self.state",
    ):
        sl.run(topology)


# -- a call that holds the loop ---------------------------------------------------------------------------


class Sleepy(sl.Task):
    """Sleeps 0.15 s per batch: blocks whatever runs it."""

    @staticmethod
    def block(seconds: float) -> None:
        """Hold the calling thread (on a loop: the loop) for ``seconds``."""
        time.sleep(seconds)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        time.sleep(0.15)
        for r in inputs.get():
            outputs.emit(r.key, r.value)


def _held(run_in: str) -> tuple[float, list[dict[str, Any]], sl.JobStatistics]:
    topology = sl.Topology("run-in-held")
    src = topology.add_source("src", [("a", 1), ("b", 2), ("c", 3)])
    node = topology.add_task("sleepy", Sleepy, run_in=run_in).set_input(src)
    topology.add_sink("out", sl.CollectSink()).set_input(node)

    async def main() -> tuple[float, sl.JobStatistics]:
        async with sl.start(topology, batch_size=1, loop_warning=0.1) as job:
            await job.wait()
            return sum(s.loop_held for s in job.instance_statistics() if s.node == "sleepy"), job.statistics()

    with capture_logs() as logs:
        held, statistics = asyncio.run(main())
    return held, [line for line in logs if line["event"] == "task held the event loop"], statistics


def test_a_call_that_holds_the_loop_is_counted_and_warned_of_once() -> None:
    """Three batches of 0.15 s each on the loop: 0.45 s or more held, one warning naming the task; the job's
    loop ran its 100 ms tick at least one call's length late (its lag now, the job over, is 0)."""
    held, warnings, statistics = _held("loop")
    assert (statistics.loop_lag_max >= 0.15 - 0.1, statistics.loop_lag) == (True, 0.0)
    assert held >= 0.45
    assert len(warnings) == 1
    assert warnings[0]["task"] == "sleepy"
    assert warnings[0]["seconds"] >= 0.15
    assert warnings[0]["threshold"] == 0.1
    assert "run_in='thread'" in warnings[0]["advice"]


def test_a_call_in_a_thread_holds_nothing() -> None:
    held, warnings, _ = _held("thread")
    assert held == 0.0
    assert warnings == []


def test_the_loop_lag_of_an_embedding_job_counts_what_the_program_holds_too() -> None:
    """sl.start in a program that itself blocks its loop 0.6 s while the job runs: the job's statistics say the
    loop ran at least 0.5 s late (its tick came 0.6 s - 0.1 s late, at least), though no task held it."""

    async def main() -> sl.JobStatistics:
        topology = sl.Topology("run-in-lag")
        topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("src", sl.QueueSource()))
        async with sl.start(topology) as job:
            await job.built()
            Sleepy.block(0.6)  # the program's own blocking call, on the loop the job shares
            await until_true(lambda: job.statistics().loop_lag_max >= 0.5)  # the late tick runs at the next turn
            return job.statistics()

    statistics = asyncio.run(main())
    assert (statistics.loop_lag_max >= 0.5, statistics.nodes["src"].records_out) == (True, 0)


def test_loop_warning_must_be_positive() -> None:
    topology = sl.Topology("run-in-warning")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("src", [1]))
    with pytest.raises(sl.JobError, match=r"^loop_warning must be a number of seconds above 0, got 0$"):
        sl.run(topology, loop_warning=0)


class WaitsForTheLoop(sl.Task):
    """Blocks until the caller's own coroutine has run (which it can only while the loop is free)."""

    calling = threading.Event()
    ticked = threading.Event()

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        self.calling.set()
        if not self.ticked.wait(30):
            raise TimeoutError("the loop never ran the service's coroutine")
        for r in inputs.get():
            outputs.emit(r.key, r.value)


def test_an_embedding_service_runs_while_a_task_blocks_in_a_thread() -> None:
    """sl.start inside a service: while the task's call blocks (in a thread), the service's coroutine runs."""
    WaitsForTheLoop.calling.clear()
    WaitsForTheLoop.ticked.clear()
    topology = sl.Topology("run-in-service")
    src = topology.add_source("src", sl.QueueSource())
    node = topology.add_task("blocking", WaitsForTheLoop, run_in="thread").set_input(src)
    topology.add_sink("out", sl.CollectSink()).set_input(node)

    async def main() -> list[Any]:
        async with sl.start(topology) as job:
            await job.send("src", "a", 1)
            await until_true(WaitsForTheLoop.calling.is_set)  # the loop runs this while the call blocks
            WaitsForTheLoop.ticked.set()  # the service answering a request, with the task's call in flight
            await job.close_source("src")
            result = await job.wait()
        return [(r.key, r.value) for r in result.sink("out")]

    assert asyncio.run(main()) == [("a", 1)]


class Computes(sl.Task):
    """2 ms of CPU a record (a busy loop: the GIL and the loop held); notes how many records each call got."""

    calls: ClassVar[list[int]] = []

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        self.calls.append(inputs.count())
        for r in inputs.get():
            until = time.thread_time() + 0.002
            while time.thread_time() < until:
                pass
            outputs.emit(r.key, r.value, ts=r.ts)


def test_calls_that_compute_long_get_their_batches_in_pieces() -> None:
    """A batch of 50 records at 2 ms each holds the loop 0.1 s: after the first such call, the next batches go in
    pieces of about 50 ms (25 records), so the loop turns between them; every record is processed once, in order."""
    Computes.calls = []
    topology = sl.Topology("run-in-turns")
    src = topology.add_source("src", [sl.Record("k", i, float(i)) for i in range(150)])
    node = topology.add_task("computes", Computes).set_input(src)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, batch_size=50)
    assert [r.value for r in result.sink("out")] == list(range(150))
    assert Computes.calls[0] == 50
    assert sum(Computes.calls) == 150
    assert max(Computes.calls[1:]) <= 25  # a piece: 50 ms of 2 ms records, or fewer
