"""Bad inputs a new user makes, and the error each one gets: the class, and the whole message.

Each case is a small program as a user would write it. The message must name
where the mistake is (node, instance, port, the record's key) and, where there
is one, the fix. Messages are compared whole, so a vaguer one fails the test.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.transport import codec

ENCODABLE = "(use None, bool, int, float, str, bytes, list, tuple and dict)"


class Passthrough(sl.Task):
    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit(record.key, record.value)


class EmitsOnPortFive(sl.Task):
    def declare_ports(self, ports: sl.PortDeclarer) -> None:
        ports.set_outputs(2)

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit(record.key, record.value, port=5)


def one_task(
    task: Any, items: list[Any] | None = None, sink: Any = None, run: dict[str, Any] | None = None, **options: Any
) -> sl.JobResult:
    """source 'src' -> task 'work' (``options``) -> sink 'out', run (``run`` options) to the end."""
    topology = sl.Topology("t")
    source = topology.add_source("src", [("a", 1)] if items is None else items)
    work = topology.add_task("work", task, **options).set_input(source)
    topology.add_sink("out", sink if sink is not None else sl.CollectSink()).set_input(work)
    return sl.run(topology, **(run or {}))


def source_to_sink(source: Any, sink: Any = None, **options: Any) -> sl.JobResult:
    """source 's' -> sink 'o', run to the end."""
    topology = sl.Topology("t")
    topology.add_sink("o", sink if sink is not None else sl.CollectSink()).set_input(topology.add_source("s", source))
    return sl.run(topology, **options)


def shortcut(make: Callable[[sl.Topology], sl.NodeHandle], items: list[Any]) -> sl.JobResult:
    """source 's' -> the shortcut ``make`` adds -> sink 'o'."""
    topology = sl.Topology("t")
    node = make(topology).set_input(topology.add_source("s", items))
    topology.add_sink("o", sl.CollectSink()).set_input(node)
    return sl.run(topology)


# -- building a topology ------------------------------------------------------------------------------------


def lambda_as_task() -> None:
    one_task(lambda r: (r.key, r.value))


def function_as_task() -> None:
    def double(record: sl.Record) -> tuple[Any, Any]:
        return record.key, record.value * 2

    one_task(double)


def abstract_task() -> None:
    class NoExecute(sl.Task):  # forgot execute
        pass

    one_task(NoExecute)


def class_not_a_task() -> None:
    class Upper:
        def execute(self, inputs: Any, outputs: Any) -> None:
            pass

    one_task(Upper)


def task_class_needing_arguments() -> None:
    class Threshold(sl.Task):
        def __init__(self, limit: int) -> None:
            self.limit = limit

        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            pass

    one_task(Threshold)


def not_callable_as_task() -> None:
    one_task(5)


def source_not_iterable() -> None:
    source_to_sink(5)


def sink_not_callable() -> None:
    sl.Topology("t").add_sink("o", 5)  # type: ignore[arg-type]


def empty_topology_name() -> None:
    sl.Topology("")


def duplicate_node_name() -> None:
    topology = sl.Topology("t")
    topology.add_source("s", [1])
    topology.add_source("s", [2])


def zero_parallelism() -> None:
    sl.Topology("t").add_source("s", [1], parallelism=0)


def upstream_of_wrong_type() -> None:
    sl.Topology("t").add_task("w", Passthrough).set_input(42)  # type: ignore[arg-type]


def unknown_upstream() -> None:
    topology = sl.Topology("t")
    topology.add_source("s", [1])
    topology.add_sink("o", sl.CollectSink()).set_input(topology.add_task("w", Passthrough).set_input("nope"))
    sl.run(topology)


def input_port_out_of_range() -> None:
    topology = sl.Topology("t")
    work = topology.add_task("w", Passthrough).set_input(topology.add_source("s", [1]), in_port=3)
    topology.add_sink("o", sl.CollectSink()).set_input(work)
    sl.run(topology)


def output_port_out_of_range() -> None:
    topology = sl.Topology("t")
    work = topology.add_task("w", Passthrough).set_input(topology.add_source("s", [1]))
    topology.add_sink("o", sl.CollectSink()).set_input(work, out_port=2)
    sl.run(topology)


def input_left_unconnected() -> None:
    topology = sl.Topology("t")
    topology.add_source("s", [1])
    topology.add_sink("o", sl.CollectSink()).set_input(topology.add_task("w", Passthrough))
    sl.run(topology)


def sink_feeding_a_task() -> None:
    topology = sl.Topology("t")
    out = topology.add_sink("o", sl.CollectSink()).set_input(topology.add_source("s", [1]))
    topology.add_sink("o2", sl.CollectSink()).set_input(topology.add_task("w", Passthrough).set_input(out))
    sl.run(topology)


def unknown_partitioning() -> None:
    topology = sl.Topology("t")
    topology.add_task("w", Passthrough).set_input(topology.add_source("s", [1]), partitioning="hash")  # type: ignore[arg-type]


def unknown_error_policy() -> None:
    sl.Topology("t").add_task("w", Passthrough, on_error="ignore")  # type: ignore[arg-type]


def unknown_fold() -> None:
    sl.Topology("t").window_reduce("w", "avg", window=sl.CountWindow(2))  # type: ignore[arg-type]


def negative_window_size() -> None:
    sl.Topology("t").window_reduce("w", "sum", window=sl.TimeWindow(-1))


def unknown_window_time() -> None:
    sl.Topology("t").window_reduce("w", "sum", window=sl.TimeWindow(1, time="wall"))  # type: ignore[arg-type]


def unknown_missing_ts() -> None:
    sl.Topology("t").window_reduce("w", "sum", window=sl.TimeWindow(1, time="event", missing_ts="drop"))  # type: ignore[arg-type]


def zero_input_ports() -> None:
    class NoInputs(sl.Task):
        def declare_ports(self, ports: sl.PortDeclarer) -> None:
            ports.set_inputs(0)

        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            pass

    sl.Topology("t").add_task("z", NoInputs)


def cycle_without_limit() -> None:
    class TwoInputs(sl.Task):
        def declare_ports(self, ports: sl.PortDeclarer) -> None:
            ports.set_inputs(2)

        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            pass

    topology = sl.Topology("t")
    head = topology.add_task("b", TwoInputs).set_input(topology.add_source("s", [1]), in_port=0)
    body = topology.add_task("a", Passthrough).set_input(head)
    head.set_input(body, in_port=1)
    topology.add_sink("o", sl.CollectSink()).set_input(head)
    sl.run(topology)


def no_source() -> None:
    topology = sl.Topology("t")
    topology.add_sink("o", sl.CollectSink()).set_input(topology.window_reduce("w", "sum", window=sl.CountWindow(2)))
    sl.run(topology)


# -- running a job -------------------------------------------------------------------------------------------


def run_a_list() -> None:
    sl.run([1, 2])  # type: ignore[arg-type]


def batch_size_zero() -> None:
    source_to_sink([("a", 1)], batch_size=0)


def checkpoint_dir_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    source_to_sink([("a", 1)], checkpoint_dir=tmp_path / "state")


def send_to_unknown_source() -> None:
    async def main() -> None:
        topology = sl.Topology("t")
        topology.add_sink("o", sl.CollectSink()).set_input(topology.add_source("s", sl.QueueSource()))
        async with sl.start(topology) as job:
            await job.send("nope", "a", 1)

    asyncio.run(main())


# -- user code while it runs ---------------------------------------------------------------------------------


def emit_on_undeclared_port() -> None:
    one_task(EmitsOnPortFive)


def emit_batch_on_undeclared_port() -> None:
    class Forward(sl.Task):
        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            outputs.emit_batch(inputs.get(), port=-2)

    one_task(Forward)


def read_undeclared_input_port() -> None:
    class ReadsThree(sl.Task):
        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            inputs.get(3)

    one_task(ReadsThree)


def task_raises() -> None:
    class Divide(sl.Task):
        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            for record in inputs.get():
                outputs.emit(record.key, 1 / 0)

    one_task(Divide)


def prepare_raises() -> None:
    class NeedsConfig(sl.Task):
        def prepare(self, config: dict[str, Any]) -> None:
            self.threshold = config["threshold"]

        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            pass

    one_task(NeedsConfig)


def map_returns_one_value() -> None:
    shortcut(lambda t: t.map("m", lambda r: r.value * 2), [("a", 1)])


def flat_map_returns_a_number() -> None:
    shortcut(lambda t: t.flat_map("m", lambda r: 5), [("a", 1)])  # type: ignore[arg-type, return-value]


def key_by_raises() -> None:
    shortcut(lambda t: t.key_by("k", lambda r: r.value["user"]), [("a", {"page": 1})])


def reduce_of_mixed_types() -> None:
    shortcut(lambda t: t.reduce("sum", lambda a, b: a + b), [("a", 1), ("a", "x")])


def ts_not_a_number() -> None:
    class Stamps(sl.Task):
        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            for record in inputs.get():
                outputs.emit(record.key, record.value, ts="yesterday")  # type: ignore[arg-type]

    topology = sl.Topology("t")
    stamped = topology.add_task("stamp", Stamps).set_input(topology.add_source("s", [("a", 1)]))
    summed = topology.window_reduce("sum", "sum", window=sl.TimeWindow(10, time="event")).set_input(stamped)
    topology.add_sink("o", sl.CollectSink()).set_input(summed)
    sl.run(topology)


def missing_ts_refused() -> None:
    window = sl.TimeWindow(10, time="event", missing_ts="fail")
    shortcut(lambda t: t.window_reduce("sum", "sum", window=window), [sl.Record("a", 1, 3.0), sl.Record("b", 2)])


def source_iterator_raises() -> None:
    def readings() -> Iterator[tuple[str, int]]:
        yield ("a", 1)
        raise ValueError("sensor offline")

    source_to_sink(readings())


def file_source_missing(tmp_path: Path) -> None:
    source_to_sink(sl.FileSource(tmp_path / "missing.txt"))


def sink_callback_raises() -> None:
    source_to_sink([("a", 1)], lambda r: r.value["total"])


def async_sink_raises() -> None:
    async def store(record: sl.Record) -> None:
        raise ConnectionError("database unreachable")

    source_to_sink([("a", 1)], store)


def sink_writer_raises() -> None:
    class Writer(sl.SinkWriter):
        def write(self, batch: list[sl.Record]) -> None:
            raise KeyError("column")

    class TableSink(sl.Sink):
        def open(self, context: sl.SinkContext) -> sl.SinkWriter:
            return Writer()

    source_to_sink([("a", 1), ("b", 2)], TableSink())


def sink_open_raises() -> None:
    class Unreachable(sl.Sink):
        def open(self, context: sl.SinkContext) -> sl.SinkWriter:
            raise ConnectionRefusedError("db:5432")

    source_to_sink([("a", 1)], Unreachable())


# -- values that cannot be encoded ---------------------------------------------------------------------------


def state_value_not_encodable(tmp_path: Path) -> None:
    class Remember(sl.Task):
        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            for record in inputs.get():
                self.state.put(record.key, {"seen": {record.value}})  # a set

    one_task(Remember, [("a", 1)], run={"checkpoint_dir": tmp_path})


def windowed_value_not_encodable(tmp_path: Path) -> None:
    class CountAll(sl.Task):
        def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
            outputs.emit("n", len(inputs.get()))

    topology = sl.Topology("t")
    source = topology.add_source("s", sl.QueueSource())
    counted = topology.add_task("w", CountAll, window=sl.CountWindow(10)).set_input(source)
    topology.add_sink("o", sl.CollectSink()).set_input(counted)

    async def checkpoint_with_the_lock_buffered() -> None:
        async with sl.start(topology, checkpoint_dir=tmp_path) as job:
            await job.send("s", "a", threading.Lock())
            await job.settle()  # the lock waits in the open window
            await job.checkpoint()

    asyncio.run(checkpoint_with_the_lock_buffered())


def key_not_encodable_for_same_key() -> None:
    topology = sl.Topology("t")
    source = topology.add_source("s", [(object(), 1)])
    work = topology.add_task("m", Passthrough, parallelism=2).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("o", sl.CollectSink()).set_input(work)
    sl.run(topology)


def value_not_encodable_over_tcp() -> None:
    codec.data_body("job/0/0/1", 1, 1, [("a", 1, 1.0), ("b", {"x": [1, {2}]}, 1.0)])


CASES: list[tuple[Callable[..., Any], type[Exception], str]] = [
    (lambda_as_task, sl.TopologyError,
     "task 'work': add_task takes a Task subclass or a zero-argument factory, got the function lambda(r); "
     "for a function of each record use topology.map('work', fn) (or filter, flat_map, key_by, reduce)"),
    (function_as_task, sl.TopologyError,
     "task 'work': add_task takes a Task subclass or a zero-argument factory, got the function double(record: "
     "'sl.Record') -> 'tuple[Any, Any]'; for a function of each record use topology.map('work', fn) "
     "(or filter, flat_map, key_by, reduce)"),
    (abstract_task, sl.TopologyError, "task 'work': NoExecute does not define execute(self, inputs, outputs)"),
    (class_not_a_task, sl.TopologyError, "task 'work': Upper is not a subclass of streamlet.Task"),
    (task_class_needing_arguments, sl.TopologyError,
     "task 'work': making a task object failed with TypeError: task_class_needing_arguments.<locals>.Threshold"
     ".__init__() missing 1 required positional argument: 'limit' (a class is called with no arguments; to pass "
     "some, give a factory: lambda: MyTask(...))"),
    (not_callable_as_task, sl.TopologyError, "task 'work': expected a Task subclass or a factory, got 5"),
    (source_not_iterable, sl.TopologyError, "source 's': expected a Source or an iterable, got 5"),
    (sink_not_callable, sl.TopologyError, "sink 'o': expected a Sink or a callable, got 5"),
    (empty_topology_name, sl.TopologyError, "a topology needs a non-empty name, got ''"),
    (duplicate_node_name, sl.TopologyError, "source 's': topology 't' already has a node with that name"),
    (zero_parallelism, sl.TopologyError, "source 's': parallelism must be >= 1, got 0"),
    (upstream_of_wrong_type, sl.TopologyError,
     "task 'w' input port 0: upstream must be a node handle or a node name, got 42"),
    (unknown_upstream, sl.TopologyError, "task 'w' input port 0: unknown upstream 'nope'"),
    (input_port_out_of_range, sl.TopologyError, "task 'w' has 1 input port but input port 3 was connected from 's'"),
    (output_port_out_of_range, sl.TopologyError, "task 'w' has 1 output port but output port 2 was connected to 'o'"),
    (input_left_unconnected, sl.TopologyError, "task 'w' has 1 input port but input port 0 is not connected"),
    (sink_feeding_a_task, sl.TopologyError, "sink 'o' has no output ports but feeds 'w'"),
    (unknown_partitioning, sl.TopologyError,
     "task 'w' input port 0: partitioning must be ROUND_ROBIN, SAME_KEY, SESSION_TABLE, BROADCAST or a function, "
     "got 'hash'"),
    (unknown_error_policy, sl.TopologyError,
     "task 'w': on_error must be one of ('fail', 'skip', 'restart'), got 'ignore'"),
    (unknown_fold, sl.TopologyError,
     "task 'w': how must be one of ('sum', 'count', 'min', 'max') or a function, got 'avg'"),
    (negative_window_size, sl.TopologyError, "task 'w': window size must be > 0, got -1"),
    (unknown_window_time, sl.TopologyError, "task 'w': window time must be 'processing' or 'event', got 'wall'"),
    (unknown_missing_ts, sl.TopologyError, "task 'w': missing_ts must be 'clock' or 'fail', got 'drop'"),
    (zero_input_ports, sl.TopologyError, "task 'z': a task needs at least one input port, got 0"),
    (cycle_without_limit, sl.TopologyError,
     "topology 't' has a cycle b -> a -> b (back edge into input of 'b') without an iteration limit; "
     "call topology.set_max_iterations(n)"),
    (no_source, sl.TopologyError, "topology 't' has no source"),
    (run_a_list, sl.TopologyError, "a job runs a streamlet.Topology, got list: [1, 2]"),
    (batch_size_zero, sl.JobError, "batch_size must be a whole number >= 1, got 0"),
    (checkpoint_dir_is_a_file, sl.CheckpointError,
     "cannot use {tmp}/state as the checkpoint directory: [Errno 17] File exists: '{tmp}/state'"),
    (send_to_unknown_source, sl.JobError, "job 't' has no QueueSource called 'nope'"),
    (emit_on_undeclared_port, sl.PortError,
     "task 'work' instance 0: emitted on output port 5, but it has 2 output ports (0, 1) and LATE (-1); "
     "declare more with ports.set_outputs(n) in declare_ports"),
    (emit_batch_on_undeclared_port, sl.PortError,
     "task 'work' instance 0: emitted on output port -2, but it has 1 output port (0) and LATE (-1); "
     "declare more with ports.set_outputs(n) in declare_ports"),
    (read_undeclared_input_port, sl.PortError,
     "task 'work' instance 0: inputs.get(3), but it has 1 input port (0); declare more with ports.set_inputs(n) "
     "in declare_ports"),
    (task_raises, sl.TaskError,
     "task 'work' instance 0 failed on record with key 'a': ZeroDivisionError: division by zero"),
    (prepare_raises, sl.TaskError, "task 'work' instance 0 failed in prepare(config): KeyError: 'threshold'"),
    (map_returns_one_value, sl.TaskError,
     "task 'm' instance 0 failed on record with key 'a': TypeError: the map function must return a (key, value) "
     "pair, got 2"),
    (flat_map_returns_a_number, sl.TaskError,
     "task 'm' instance 0 failed on record with key 'a': TypeError: the flat_map function must return an iterable "
     "of (key, value) pairs ('int' object is not iterable)"),
    (key_by_raises, sl.TaskError, "task 'k' instance 0 failed on record with key 'a': KeyError: 'user'"),
    (reduce_of_mixed_types, sl.TaskError,
     "task 'sum' instance 0 failed on record with key 'a': TypeError: unsupported operand type(s) for +: 'int' "
     "and 'str'"),
    (ts_not_a_number, sl.TaskError,
     "task 'sum' instance 0 input port 0: the record with key 'a' has ts 'yesterday'; an event-time window needs "
     "ts in seconds (an int or a float)"),
    (missing_ts_refused, sl.TaskError,
     "task 'sum' instance 0 input port 0: the record with key 'b' has ts None; this window has missing_ts='fail' "
     "(give every record a ts, or leave missing_ts='clock')"),
    (source_iterator_raises, sl.SourceError,
     "source 's' instance 0 failed reading at position 0: ValueError: sensor offline"),
    (file_source_missing, sl.SourceError,
     "source 's' instance 0 failed to open: FileNotFoundError: [Errno 2] No such file or directory: "
     "'{tmp}/missing.txt'"),
    (sink_callback_raises, sl.SinkError,
     "sink 'o' instance 0 failed writing the record with key 'a': TypeError: 'int' object is not subscriptable"),
    (async_sink_raises, sl.SinkError,
     "sink 'o' instance 0 failed writing the record with key 'a': ConnectionError: database unreachable"),
    (sink_writer_raises, sl.SinkError,
     "sink 'o' instance 0 failed writing a batch of 2 records starting with key 'a': KeyError: 'column'"),
    (sink_open_raises, sl.SinkError, "sink 'o' instance 0 failed to open: ConnectionRefusedError: db:5432"),
    (state_value_not_encodable, sl.EncodingError,
     f"task 'work' instance 0: keyed state: the value at ['a']['seen'] cannot be encoded: set is not encodable "
     f"{ENCODABLE}"),
    (windowed_value_not_encodable, sl.EncodingError,
     "checkpoint 1: the snapshot of 'w' instance 0: the value at ['window']['open'][0][2][0][1][0][1] cannot be "
     f"encoded: lock is not encodable {ENCODABLE}"),
    (key_not_encodable_for_same_key, sl.EncodingError,
     f"edge 's' -> 'm' input port 0: SAME_KEY partitioning: the key cannot be encoded: object is not encodable "
     f"{ENCODABLE}"),
    (value_not_encodable_over_tcp, sl.EncodingError,
     f"channel job/0/0/1: the record with key 'b': the value at ['x'][1] cannot be encoded: set is not encodable "
     f"{ENCODABLE}"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "error", "message"), CASES, ids=[case.__name__ for case, *_ in CASES])
def test_a_bad_input_gets_an_error_that_says_where_and_what(
    case: Callable[..., Any], error: type[Exception], message: str, tmp_path: Path
) -> None:
    """The exact class and message; every error is a StreamletError."""
    takes_a_directory = "tmp_path" in case.__code__.co_varnames[: case.__code__.co_argcount]
    with pytest.raises(error) as raised:
        case(tmp_path) if takes_a_directory else case()
    assert str(raised.value) == message.format(tmp=tmp_path)
    assert isinstance(raised.value, sl.StreamletError)


def test_a_failing_callback_sink_chains_the_users_exception() -> None:
    """The cause stays reachable for debugging: ``raise ... from`` the user's own exception."""
    with pytest.raises(sl.SinkError) as raised:
        sink_callback_raises()
    assert (type(raised.value.__cause__), raised.value.sink, raised.value.instance, raised.value.key) == (
        TypeError, "o", 0, "a",
    )  # fmt: skip


def test_a_port_mistake_ignores_the_skip_policy() -> None:
    """Emitting on a port that does not exist is a wiring mistake: even on_error='skip' stops the job."""
    with pytest.raises(sl.PortError, match=re.escape("emitted on output port 5")):
        one_task(EmitsOnPortFive, on_error="skip")


def test_an_unencodable_key_is_dead_lettered_under_skip() -> None:
    """A SAME_KEY key that cannot be hashed is the record's fault: under on_error='skip' it is dead-lettered."""
    topology = sl.Topology("t")
    bad = object()
    keyed = topology.add_task("key", Passthrough, on_error="skip").set_input(
        topology.add_source("s", [(bad, 1), ("ok", 2)])
    )
    work = topology.add_task("m", Passthrough, parallelism=2).set_input(keyed, partitioning=sl.SAME_KEY)
    topology.add_sink("o", sl.CollectSink()).set_input(work)
    result = sl.run(topology)
    assert [(r.key, r.value) for r in result.sink("o")] == [("ok", 2)]
    assert [(d.task, d.record.key) for d in result.dead_letters] == [("key", bad)]
