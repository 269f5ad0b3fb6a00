"""The in-process runtime: shortcuts, sources, channels, ports, statistics, backpressure."""

from __future__ import annotations

import asyncio
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import structlog.testing

import streamlet as sl
from tests.conftest import pairs, values


def chain(items: list[Any], build: Callable[[sl.Topology, sl.NodeHandle], sl.NodeHandle], **run: Any) -> sl.JobResult:
    """source 'in' -> whatever ``build`` adds -> CollectSink 'out'."""
    topology = sl.Topology("chain")
    last = build(topology, topology.add_source("in", items))
    topology.add_sink("out", sl.CollectSink()).set_input(last)
    return sl.run(topology, **run)


def test_map_emits_fn_result_and_keeps_event_time() -> None:
    """map turns each record into fn(record) and keeps its ts."""
    items = [sl.Record("a", 1, 10.0), sl.Record("b", 2, 11.0)]
    result = chain(items, lambda t, s: t.map("m", lambda r: (r.key.upper(), r.value * 10)).set_input(s))
    assert result.sink("out") == [sl.Record("A", 10, 10.0), sl.Record("B", 20, 11.0)]


def test_filter_passes_matching_records_unchanged() -> None:
    """filter keeps the records whose predicate is true, in order."""
    result = chain(list(range(10)), lambda t, s: t.filter("even", lambda r: r.value % 2 == 0).set_input(s))
    assert values(result.sink("out")) == [0, 2, 4, 6, 8]


def test_flat_map_emits_zero_or_more_per_record() -> None:
    """flat_map emits every pair fn returns, nothing for an empty result."""
    result = chain(
        ["a b", "", "c"], lambda t, s: t.flat_map("w", lambda r: [(w, 1) for w in r.value.split()]).set_input(s)
    )
    assert pairs(result.sink("out")) == [("a", 1), ("b", 1), ("c", 1)]


def test_key_by_rekeys_and_keeps_value() -> None:
    """key_by replaces the key with fn(record)."""
    result = chain([("x", 3), ("y", 4)], lambda t, s: t.key_by("k", lambda r: r.value % 2).set_input(s))
    assert pairs(result.sink("out")) == [(1, 3), (0, 4)]


def test_reduce_emits_each_keys_running_value_once_per_batch() -> None:
    """reduce folds a whole batch per key, then emits one record per key it touched (in the order the keys
    first appear), with the key's value after the batch and the time of its last record."""
    items = [sl.Record("a", 1, 1.0), sl.Record("b", 5, 2.0), sl.Record("a", 2, 3.0), sl.Record("a", 3, 4.0)]
    result = chain([*items, sl.Record("b", 1, 5.0)], lambda t, s: t.reduce("sum", lambda acc, v: acc + v).set_input(s))
    assert [(r.key, r.value, r.ts) for r in result.sink("out")] == [("a", 6, 4.0), ("b", 6, 5.0)]


def test_reduce_carries_running_values_from_batch_to_batch() -> None:
    """Batches of 2: each batch emits its keys' values so far."""
    items = [("a", 1), ("b", 5), ("a", 2), ("a", 3), ("b", 1)]
    result = chain(items, lambda t, s: t.reduce("sum", lambda acc, v: acc + v).set_input(s), batch_size=2)
    assert pairs(result.sink("out")) == [("a", 1), ("b", 5), ("a", 6), ("b", 6)]


def test_reduce_with_emit_record_emits_the_running_value_after_every_record() -> None:
    """emit="record": one output per input, every intermediate value."""
    items = [("a", 1), ("b", 5), ("a", 2), ("a", 3), ("b", 1)]
    result = chain(items, lambda t, s: t.reduce("sum", lambda acc, v: acc + v, emit="record").set_input(s))
    assert pairs(result.sink("out")) == [("a", 1), ("b", 5), ("a", 3), ("a", 6), ("b", 6)]


def test_reduce_refuses_an_unknown_emit() -> None:
    topology = sl.Topology("t")
    with pytest.raises(sl.TopologyError, match=r"^task 'sum': emit must be 'batch' or 'record', got 'key'$"):
        topology.reduce("sum", lambda acc, v: acc + v, emit="key")  # type: ignore[arg-type]


def test_iterable_source_accepts_records_pairs_and_plain_values() -> None:
    """A Record stays, a pair becomes key/value, anything else is a value with key None."""
    record = sl.Record("r", 0, 5.0)
    result = chain(
        [record, ("k", "v"), "plain", [1, 2]], lambda t, s: t.map("id", lambda r: (r.key, r.value)).set_input(s)
    )
    assert pairs(result.sink("out")) == [("r", 0), ("k", "v"), (None, "plain"), (None, [1, 2])]
    assert result.sink("out")[0].ts == 5.0


def test_source_stamps_records_with_the_clock() -> None:
    """Records made from plain items carry the job clock's time."""

    class FixedClock(sl.SystemClock):
        def now(self) -> float:
            return 1234.5

    result = chain([("a", 1)], lambda t, s: t.map("id", lambda r: (r.key, r.value)).set_input(s), clock=FixedClock())
    assert [r.ts for r in result.sink("out")] == [1234.5]


def test_async_iterable_source_is_read_to_the_end() -> None:
    """An async generator feeds the topology like a list."""

    async def numbers() -> AsyncIterator[int]:
        for number in range(2500):
            if number % 100 == 0:
                await asyncio.sleep(0)
            yield number

    result = chain([], lambda t, s: s)  # warm-up: an empty source ends at once
    assert result.sink("out") == []
    topology = sl.Topology("async-source")
    source = topology.add_source("numbers", numbers())
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    assert values(sl.run(topology).sink("out")) == list(range(2500))


class Doubler(sl.Task):
    """An ``async def execute`` task."""

    async def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        await asyncio.sleep(0)
        for record in inputs.get():
            outputs.emit(record.key, record.value * 2)


def test_async_execute_is_awaited() -> None:
    """execute may be a coroutine function."""
    result = chain([("a", 1), ("b", 2)], lambda t, s: t.add_task("double", Doubler).set_input(s))
    assert pairs(result.sink("out")) == [("a", 2), ("b", 4)]


class LastTs(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit("n", len(inputs.get()))


def test_emit_without_ts_uses_last_event_time_of_the_batch() -> None:
    """emit(ts=None) stamps the ts of the last record of the batch that woke the task."""
    items = [sl.Record("a", 1, 1.0), sl.Record("b", 2, 7.0)]
    result = chain(items, lambda t, s: t.add_task("count", LastTs).set_input(s))
    assert [(r.value, r.ts) for r in result.sink("out")] == [(2, 7.0)]


class CountInFinish(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        self.state.put("n", self.state.get("n", 0) + len(inputs.get()))

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit("n", self.state.get("n"))


def test_emit_without_ts_in_finish_has_no_event_time() -> None:
    """finish has no batch to take a ts from: what it emits without ts= has ts None."""
    items = [sl.Record("a", 1, 1.0), sl.Record("b", 2, 7.0)]
    result = chain(items, lambda t, s: t.add_task("count", CountInFinish).set_input(s))
    assert [(r.value, r.ts) for r in result.sink("out")] == [(2, None)]


def test_one_output_port_feeds_several_nodes() -> None:
    """1-to-N: every downstream node gets every record."""
    topology = sl.Topology("fan-out")
    source = topology.add_source("in", list(range(5)))
    for name in ("left", "right"):
        topology.add_sink(name, sl.CollectSink()).set_input(source)
    result = sl.run(topology)
    assert values(result.sink("left")) == values(result.sink("right")) == [0, 1, 2, 3, 4]


def test_several_upstreams_into_one_port() -> None:
    """M-to-1: two sources into one input port; everything arrives."""
    topology = sl.Topology("fan-in")
    first = topology.add_source("a", [1, 2, 3])
    second = topology.add_source("b", [10, 20])
    topology.add_sink("out", sl.CollectSink()).set_input(first).set_input(second)
    assert sorted(values(sl.run(topology).sink("out"))) == [1, 2, 3, 10, 20]


class SplitEvenOdd(sl.Task):
    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_outputs(3)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit(record.key, record.value, port=record.value % 2)
            outputs.emit(record.key, record.value, port=2)


def test_output_ports_route_separately_and_unconnected_port_is_counted() -> None:
    """Records go out of the port they were emitted on; an unconnected port counts them as discarded."""
    topology = sl.Topology("ports")
    source = topology.add_source("in", list(range(6)))
    split = topology.add_task("split", SplitEvenOdd).set_input(source)
    topology.add_sink("even", sl.CollectSink()).set_input(split, out_port=0)
    topology.add_sink("odd", sl.CollectSink()).set_input(split, out_port=1)
    result = sl.run(topology)
    assert values(result.sink("even")) == [0, 2, 4]
    assert values(result.sink("odd")) == [1, 3, 5]
    assert result.statistics.discarded == 6
    assert result.statistics.nodes["split"].records_out == 12


def test_unconnected_output_port_drops_records_and_warns_once_per_port() -> None:
    """Records emitted on a port nothing is connected to are dropped and counted; the job warns once per such
    port when it starts (a structlog warning, not a Python warning), however many records go there."""
    topology = sl.Topology("ports")
    split = topology.add_task("split", SplitEvenOdd).set_input(topology.add_source("in", list(range(6))))
    topology.add_sink("even", sl.CollectSink()).set_input(split, out_port=0)
    with structlog.testing.capture_logs() as logged, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        result = sl.run(topology)
    effect = "records emitted there are dropped (counted in statistics.discarded)"
    assert logged == [
        {"job": "ports", "node": "split", "port": port, "effect": effect, "event": "output port has no consumer",
         "log_level": "warning"}
        for port in (1, 2)
    ]  # fmt: skip
    assert (result.statistics.discarded, warned) == (9, [])


def test_a_topology_with_every_port_wired_logs_nothing() -> None:
    """The warning is only for ports left unwired (the late port of a task never counts)."""
    topology = sl.Topology("wired")
    split = topology.add_task("split", SplitEvenOdd).set_input(topology.add_source("in", list(range(6))))
    for port in range(3):
        topology.add_sink(f"out{port}", sl.CollectSink()).set_input(split, out_port=port)
    with structlog.testing.capture_logs() as logged:
        sl.run(topology)
    assert logged == []


class Totals(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)

    def finish(self, outputs: sl.Outputs) -> None:
        for key, total in sorted(self.state.items()):
            outputs.emit(key, total)


def test_finish_emits_after_all_input_and_same_key_keeps_keys_together() -> None:
    """A parallel SAME_KEY count emits exact totals from finish()."""
    words = [f"w{i % 37}" for i in range(5000)]
    topology = sl.Topology("totals")
    source = topology.add_source("in", [(w, 1) for w in words], parallelism=1)
    count = topology.add_task("count", Totals, parallelism=3).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    result = sl.run(topology, batch_size=64)
    assert sorted(pairs(result.sink("out"))) == sorted(Counter(words).items())


def test_statistics_count_records_per_node() -> None:
    """records_in/out per node, summed over instances, are exact."""
    result = chain(list(range(100)), lambda t, s: t.filter("f", lambda r: r.value < 30, parallelism=2).set_input(s))
    nodes = result.statistics.nodes
    assert (nodes["in"].records_in, nodes["in"].records_out) == (100, 100)
    assert (nodes["f"].records_in, nodes["f"].records_out) == (100, 30)
    assert (nodes["out"].records_in, nodes["out"].records_out) == (30, 0)
    assert result.statistics.running is False


def test_parallel_sources_split_a_list() -> None:
    """A list source with parallelism 3 reads each item exactly once."""
    topology = sl.Topology("parallel-source")
    source = topology.add_source("in", list(range(1000)), parallelism=3)
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    assert sorted(values(sl.run(topology, batch_size=7).sink("out"))) == list(range(1000))


def test_one_shot_iterator_cannot_feed_parallel_instances() -> None:
    """A generator with parallelism > 1 is refused with the source named."""
    topology = sl.Topology("gen")
    source = topology.add_source("in", (i for i in range(3)), parallelism=2)
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    with pytest.raises(sl.TopologyError, match=r"^source 'in': a one-shot iterator cannot feed 2 instances"):
        sl.run(topology)


def test_backpressure_bounds_records_in_flight() -> None:
    """With a slow sink, the source is never more than a few batches ahead."""
    read = 0
    lead: list[int] = []

    def items() -> Any:
        nonlocal read
        for number in range(2000):
            read += 1
            yield number

    class SlowSink(sl.Sink):
        def open(self, context: sl.SinkContext) -> sl.SinkWriter:
            return SlowWriter()

    class SlowWriter(sl.SinkWriter):
        def __init__(self) -> None:
            self.written = 0

        async def write(self, batch: list[sl.Record]) -> None:
            await asyncio.sleep(0.001)
            self.written += len(batch)
            lead.append(read - self.written)

    topology = sl.Topology("backpressure")
    source = topology.add_source("in", items())
    step = topology.map("id", lambda r: (r.key, r.value)).set_input(source)
    topology.add_sink("out", SlowSink()).set_input(step)
    sl.run(topology, batch_size=10, channel_capacity=2)
    # in flight at most: 2 queued + 1 in hand per inbox (2 inboxes), 1 buffered at the map, 1 being read
    assert max(lead) <= 10 * 8
    assert read == 2000


def test_result_sink_names_the_collecting_sinks() -> None:
    """Asking for a sink that keeps nothing raises JobError listing those that do."""
    topology = sl.Topology("names")
    source = topology.add_source("in", [1])
    topology.add_sink("kept", sl.CollectSink()).set_input(source)
    topology.add_sink("printed", lambda r: None).set_input(source)
    result = sl.run(topology)
    with pytest.raises(
        sl.JobError, match=r"^no collecting sink called 'printed'; sinks that keep records: \['kept'\]$"
    ):
        result.sink("printed")


def test_run_inside_a_running_loop_is_refused() -> None:
    """streamlet.run() in a coroutine points to streamlet.start()."""
    topology = sl.Topology("nested")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", [1]))

    async def inside() -> None:
        sl.run(topology)

    with pytest.raises(sl.JobError, match=r"^streamlet.run\(\) was called inside a running event loop"):
        asyncio.run(inside())


def test_runs_without_uvloop() -> None:
    """use_uvloop=False runs on the default asyncio loop with the same result."""
    topology = sl.Topology("plain-loop")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", [1, 2]))
    assert values(sl.run(topology, use_uvloop=False).sink("out")) == [1, 2]


class PassThrough(sl.Task):
    """Forwards records with a positive value unchanged, with emit_record."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            if record.value > 0:
                outputs.emit_record(record)


def test_emit_record_passes_the_record_itself_on() -> None:
    """emit_record sends the record on unchanged: same type, key, value and event time."""
    items = [sl.Record("a", 1, 5.0), sl.Record("b", -1, 6.0), sl.Record("c", 2, 7.0)]
    result = chain(items, lambda t, s: t.add_task("pass", PassThrough).set_input(s))
    assert result.sink("out") == [items[0], items[2]]
    assert [type(record) for record in result.sink("out")] == [sl.Record, sl.Record]


class _ReadOnce(sl.SourceReader):
    """Returns its items as one batch, then ends."""

    def __init__(self, items: list[Any]) -> None:
        self.items: list[Any] | None = items

    async def read(self, max_records: int) -> Any:
        items, self.items = self.items, None
        return items


class ReadOnce(sl.Source):
    """A user source whose reader returns ``items`` exactly as given."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _ReadOnce(list(self.items))


def test_a_failing_record_is_found_by_position_when_a_batch_holds_one_tuple_twice() -> None:
    """A reader may return the same tuple object several times: on_error="skip" dead-letters the third
    call's record and keeps the others, each once."""
    same = ("k", 1, None)
    calls: list[int] = []

    def numbered(record: sl.Record) -> tuple[Any, Any]:
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("third")
        return record.key, len(calls)

    topology = sl.Topology("aliased")
    mapped = topology.map("m", numbered, on_error="skip").set_input(topology.add_source("in", ReadOnce([same] * 4)))
    topology.add_sink("out", sl.CollectSink()).set_input(mapped)
    result = sl.run(topology)
    assert values(result.sink("out")) == [1, 2, 4]
    assert [(letter.task, letter.record.key) for letter in result.dead_letters] == [("m", "k")]


def test_a_reader_may_return_records_elements_pairs_and_values_mixed() -> None:
    """Records are taken apart, (key, value, ts) tuples are elements, pairs get the clock's time, anything
    else is a value with key None."""
    items = [("a", 1, 5.0), sl.Record("b", 2, 6.0), ("c", 3), "plain"]
    clock = sl.ManualClock(9.0)
    topology = sl.Topology("mixed")
    mapped = topology.map("id", lambda r: (r.key, r.value)).set_input(topology.add_source("in", ReadOnce(items)))
    topology.add_sink("out", sl.CollectSink()).set_input(mapped)
    out = sl.run(topology, clock=clock).sink("out")
    assert [(r.key, r.value, r.ts) for r in out] == [("a", 1, 5.0), ("b", 2, 6.0), ("c", 3, 9.0), (None, "plain", 9.0)]


def test_a_record_a_shortcut_function_keeps_is_never_changed_afterwards() -> None:
    """The shortcuts reuse one record per call unless the function keeps it: kept records (in a list, and
    through a generator) keep their own fields."""
    kept: list[sl.Record] = []

    def keep_odd(record: sl.Record) -> bool:
        if record.value % 2:
            kept.append(record)
        return True

    def lazily(record: sl.Record) -> Any:
        yield record.key, record.value

    items = [(f"k{i}", i) for i in range(50)]
    result = chain(items, lambda t, s: t.flat_map("fm", lazily).set_input(t.filter("f", keep_odd).set_input(s)))
    assert values(result.sink("out")) == list(range(50))
    assert [(r.key, r.value) for r in kept] == [(f"k{i}", i) for i in range(1, 50, 2)]


def test_a_shortcut_reuses_one_record_only_where_reference_counts_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function that keeps nothing gets one record refilled for the whole batch on CPython; where counts
    cannot be trusted (PyPy, a free-threaded build) every call gets a new one."""
    from streamlet.core.model import task

    made: list[int] = []
    original = task._view

    def counted() -> sl.Record:
        made.append(1)
        return original()

    monkeypatch.setattr(task, "_view", counted)
    items = [("a", 1), ("b", 2), ("c", 3)]
    result = chain(items, lambda t, s: t.map("m", lambda r: (r.key, r.value)).set_input(s))
    assert (pairs(result.sink("out")), len(made)) == (items, 1)
    made.clear()
    monkeypatch.setattr(task, "_getrefcount", task._never_free)
    result = chain(items, lambda t, s: t.map("m", lambda r: (r.key, r.value)).set_input(s))
    assert (pairs(result.sink("out")), len(made)) == (items, 4)  # the first, then one after every call
