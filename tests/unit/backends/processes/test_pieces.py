"""The pieces of a multi-process run that need no process: placement, records and errors across the control
channel, the merged result, and what is refused before anything forks."""

from __future__ import annotations

from pathlib import Path

import pytest

import streamlet as sl
from streamlet.backends.processes.failures import described, rebuilt
from streamlet.backends.processes.placement import holders, spread
from streamlet.backends.processes.results import PartReport, merged
from streamlet.backends.processes.wire import record_chunks, records_in
from streamlet.core.model.record import FiredWindowRecord, LoopRecord, WindowRecord
from streamlet.errors import EncodingError, JobError, TaskError, TopologyError
from tests.conftest import self_loop


def three_nodes(parallelism: int, sink_parallelism: int = 1) -> sl.Topology:
    topology = sl.Topology("spread")
    numbers = topology.add_source("numbers", range(10))
    work = topology.map("work", lambda r: (r.key, r.value), parallelism=parallelism).set_input(numbers)
    topology.add_sink("out", sl.CollectSink(), parallelism=sink_parallelism).set_input(work)
    return topology.validate()


def test_a_task_with_parallelism_n_has_one_instance_on_every_process() -> None:
    """Parallelism N over N processes: one instance each; the one-instance nodes take turns."""
    where = spread(three_nodes(3), 3)
    assert sorted(where[("work", index)] for index in range(3)) == [0, 1, 2]
    assert (where[("numbers", 0)], where[("out", 0)]) == (0, 1)


def test_more_instances_than_processes_go_in_contiguous_blocks() -> None:
    """Parallelism 4 over 2 processes: two neighbouring instances on each."""
    where = spread(three_nodes(4), 2)
    assert [where[("work", index)] for index in range(4)] == [1, 1, 0, 0]


def test_holders_are_ordered_by_the_instances_they_hold() -> None:
    """A sink's records come back instance by instance: process 1 holds instances 0-1, process 0 holds 2-3."""
    assert holders(spread(three_nodes(1, sink_parallelism=4), 2), "out") == [0, 1]
    assert holders(spread(three_nodes(4), 2), "work") == [1, 0]


def test_records_cross_the_control_channel_with_their_types() -> None:
    """Plain, window, fired-window and loop records come back as they were, tuples as tuples."""
    records = [
        sl.Record(("a", 1), [1, 2], 1.5),
        WindowRecord("k", {"count": 3}, 59.999, (0.0, 60.0)),
        FiredWindowRecord("k", 1, 59.999, (0.0, 60.0), "late"),
    ]
    back = [record for body in record_chunks(records, "test") for record in records_in(body)]
    assert [(type(r), r.key, r.value, r.ts, r.window, r.firing) for r in back] == [
        (type(r), r.key, r.value, r.ts, r.window, r.firing) for r in records
    ]
    loop = [record for body in record_chunks([LoopRecord(1, 2, None, 3)], "test") for record in records_in(body)]
    assert [(type(r), r.iteration) for r in loop] == [(LoopRecord, 3)]


def test_a_record_that_cannot_be_encoded_names_where_it_was_going() -> None:
    """A collected value msgpack cannot carry is an EncodingError naming the sink."""
    message = r"^channel to the parent process for sink 'out': the record with key 'k': the value cannot be encoded"
    with pytest.raises(EncodingError, match=message):
        record_chunks([sl.Record("k", object())], "to the parent process for sink 'out'")


def test_a_task_error_comes_back_with_its_attributes_and_cause() -> None:
    """Same class, message, task, instance and key; the cause chained, its traceback in a note."""
    message = "task 'parse' instance 1 failed on record with key ('a', 1)"
    error = TaskError(message, task="parse", instance=1, key=("a", 1))
    error.__cause__ = ValueError("bad value")
    again = rebuilt(described(error), "worker process 2 of 2 (pid 42)")
    assert (type(again), str(again), again.task, again.instance, again.key) == (  # type: ignore[attr-defined]
        TaskError, str(error), "parse", 1, ("a", 1)
    )  # fmt: skip
    assert type(again.__cause__) is ValueError
    assert str(again.__cause__) == "bad value"
    assert again.__cause__.__notes__[0].startswith("raised in worker process 2 of 2 (pid 42):\n")


def test_an_exception_class_that_cannot_be_made_again_becomes_a_job_error() -> None:
    """A class the parent cannot find (defined inside a function) is named in a JobError."""

    class Local(Exception):
        pass

    again = rebuilt(described(Local("odd")), "worker process 1 of 2 (pid 42)")
    assert type(again) is JobError
    assert str(again).endswith(".<locals>.Local: odd")


def test_the_merged_result_sums_the_parts_and_orders_sinks_by_instance() -> None:
    """Counters per node are summed; a sink's records come in instance order whatever the process order."""
    topology = three_nodes(2, sink_parallelism=2)
    where = spread(topology, 2)  # out.0 on process 0, out.1 on process 1
    parts = [PartReport("p0"), PartReport("p1")]
    for index in range(2):
        process = where[("out", index)]
        parts[process].take({"kind": "records", "sink": "out", "body": record_chunks([sl.Record(index, 0)], "t")[0]})
    for part in parts:
        part.take({"kind": "done", "sinks": {"out": 1}, "statistics": _statistics(part is parts[0])})
    result = merged(topology, where, parts, 1.5)
    assert [r.key for r in result.sink("out")] == [0, 1]
    work = result.statistics.nodes["work"]
    assert (work.parallelism, work.records_in, work.records_out) == (2, 10, 10)
    assert (result.statistics.late, result.statistics.wall_time) == (3, 1.5)


def _statistics(first: bool) -> dict[str, object]:
    nodes = {"work": {"records_in": 4 if first else 6, "records_out": 4 if first else 6, "queued": 0}}
    counters = dict.fromkeys(("dropped", "dead_lettered", "discarded", "restarts", "checkpoints", "shed"), 0)
    return {"nodes": nodes, **counters, "late": 1 if first else 2}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"processes": 0}, r"^processes must be a whole number >= 1, got 0$"),
        ({"processes": True}, r"^processes must be a whole number >= 1, got True$"),
        (
            {"processes": 2, "adapt": sl.AdaptSettings(policies=frozenset({"balance"}))},
            r"^adapt= steers a job running in this process: it is not supported with processes > 1$",
        ),
    ],
)
def test_what_a_multi_process_run_cannot_do_is_refused_before_it_forks(
    options: dict[str, object], message: str
) -> None:
    """A bad process count and adaptation are JobErrors raised in the caller's process."""
    with pytest.raises(JobError, match=message):
        sl.run(three_nodes(2), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [{"checkpoint_interval": 1.0}, {"from_savepoint": "somewhere.msgpack"}],
)
def test_checkpoint_options_without_a_store_are_refused_as_in_one_process(options: dict[str, object]) -> None:
    """The same JobError as a run in one process, before anything forks."""
    with pytest.raises(JobError) as one:
        sl.run(three_nodes(2), **options)  # type: ignore[arg-type]
    with pytest.raises(JobError) as two:
        sl.run(three_nodes(2), processes=2, **options)  # type: ignore[arg-type]
    assert str(two.value) == str(one.value)


def test_a_loop_cannot_take_checkpoints_in_several_processes_either(tmp_path: Path) -> None:
    """The same TopologyError as in one process."""
    with pytest.raises(TopologyError) as one:
        sl.run(self_loop(), checkpoint_dir=tmp_path / "one")
    with pytest.raises(TopologyError) as two:
        sl.run(self_loop(), checkpoint_dir=tmp_path / "two", processes=2)
    assert str(two.value) == str(one.value)


def test_an_invalid_topology_is_the_same_topology_error_as_in_one_process() -> None:
    """Validation happens in the caller's process, before any fork."""
    topology = sl.Topology("broken")
    topology.add_sink("out", sl.CollectSink())
    with pytest.raises(TopologyError) as one:
        sl.run(topology)
    with pytest.raises(TopologyError) as two:
        sl.run(topology, processes=2)
    assert str(two.value) == str(one.value)
