"""The testing harness: run_topology, arun_topology, the manual_clock fixture, ManualClock, ExactlyOnceSink and the
simulated cluster's exports (the cluster itself: tests/unit/backends/cluster/test_simulated.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator

import pytest

import streamlet as sl
from streamlet import testing
from streamlet.core.model.sinks import RestorePoint, SinkContext, SinkWriter
from streamlet.testing import ExactlyOnceSink, arun_topology, run_topology
from tests.conftest import pairs, values


def word_counts() -> tuple[sl.Topology, list[sl.Record]]:
    """lines (QueueSource) -> split -> count (SAME_KEY, 3 instances) -> 'counts' CallbackSink and 'words' sink.

    The callback sink appends to the returned list, which the harness must leave untouched.
    """
    called: list[sl.Record] = []
    topology = sl.Topology("wordcount")
    lines = topology.add_source("lines", sl.QueueSource())
    words = topology.flat_map("split", lambda r: [(w, 1) for w in r.value.split()]).set_input(lines)
    count = topology.reduce("count", lambda a, b: a + b, parallelism=3, emit="record").set_input(
        words, partitioning=sl.SAME_KEY
    )
    topology.add_sink("counts", called.append).set_input(count)
    topology.add_sink("words", sl.CollectSink()).set_input(words)
    return topology, called


LINES = ["a b a", "c a", "b"]


def test_run_topology_replaces_the_named_source_and_collects_every_sink() -> None:
    """Inputs replace the QueueSource; both sinks (even the CallbackSink) are collected, the callback is not called."""
    topology, called = word_counts()
    out = run_topology(topology, inputs={"lines": LINES})
    assert sorted(out) == ["counts", "words"]
    assert pairs(out["words"]) == [("a", 1), ("b", 1), ("a", 1), ("c", 1), ("a", 1), ("b", 1)]
    assert sorted(pairs(out["counts"])) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)]
    assert called == []


def test_run_topology_leaves_the_topology_unchanged() -> None:
    """The original topology keeps its own source and sinks."""
    topology, _ = word_counts()
    before = {name: (node.source, node.sink) for name, node in topology.nodes.items()}
    run_topology(topology, inputs={"lines": LINES})
    assert {name: (node.source, node.sink) for name, node in topology.nodes.items()} == before


def test_run_topology_is_deterministic() -> None:
    """With a ManualClock, the same input twice gives identical output lists, order and timestamps included."""
    topology, _ = word_counts()
    many = [f"w{n % 7} w{n % 5} w{n % 3}" for n in range(300)]
    first = run_topology(topology, inputs={"lines": many}, clock=sl.ManualClock(), batch_size=16)
    assert run_topology(topology, inputs={"lines": many}, clock=sl.ManualClock(), batch_size=16) == first
    assert len(first["counts"]) == 900


def test_run_topology_keeps_sources_that_are_not_named() -> None:
    """A source not given in inputs runs as written."""
    topology = sl.Topology("t")
    source = topology.add_source("numbers", [1, 2, 3])
    topology.add_sink("out", lambda r: None).set_input(source)
    assert values(run_topology(topology)["out"]) == [1, 2, 3]


def test_run_topology_rejects_an_unknown_source_name() -> None:
    """Naming a source the topology lacks is a TopologyError naming the topology and the source."""
    topology, _ = word_counts()
    message = "topology 'wordcount' has no source called 'line'"
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        run_topology(topology, inputs={"line": LINES})


async def test_arun_topology_runs_inside_the_test_event_loop(manual_clock: sl.ManualClock) -> None:
    """arun_topology replaces sources and collects sinks like run_topology, from an async test."""
    topology, called = word_counts()
    out = await arun_topology(topology, inputs={"lines": LINES}, clock=manual_clock)
    assert pairs(out["words"]) == [("a", 1), ("b", 1), ("a", 1), ("c", 1), ("a", 1), ("b", 1)]
    assert sorted(pairs(out["counts"])) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)]
    assert [record.ts for record in out["words"]] == [0.0] * 6
    assert called == []


def test_manual_clock_fixture_starts_at_zero(manual_clock: sl.ManualClock) -> None:
    """The fixture is a ManualClock at 0 with no timers; this test then moves it."""
    assert (manual_clock.now(), manual_clock.pending()) == (0.0, 0)
    manual_clock.call_at(50.0, lambda: None)
    manual_clock.advance(10)


def test_manual_clock_fixture_is_fresh_per_test(manual_clock: sl.ManualClock) -> None:
    """Another test sees a new clock, untouched by the previous one."""
    assert (manual_clock.now(), manual_clock.pending()) == (0.0, 0)


def test_advance_fires_due_timers_in_time_order_at_their_time(manual_clock: sl.ManualClock) -> None:
    """Timers run ordered by time (ties in scheduling order), each seeing now() == its time."""
    fired: list[tuple[str, float]] = []

    def timer(name: str) -> Callable[[], None]:
        return lambda: fired.append((name, manual_clock.now()))

    for name, when in [("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("late", 9.0)]:
        manual_clock.call_at(when, timer(name))
    manual_clock.advance(5)
    assert fired == [("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("c", 3.0)]
    assert (manual_clock.now(), manual_clock.pending()) == (5.0, 1)


def test_timer_due_exactly_at_the_target_fires(manual_clock: sl.ManualClock) -> None:
    """advance(t) fires a timer at exactly now + t."""
    fired: list[float] = []
    manual_clock.call_at(4.0, lambda: fired.append(manual_clock.now()))
    manual_clock.advance(3.5)
    manual_clock.advance(0.5)
    assert fired == [4.0]


def test_cancelled_timer_does_not_fire(manual_clock: sl.ManualClock) -> None:
    """cancel() before the time stops the callback and the timer no longer counts as pending."""
    fired: list[str] = []
    timer = manual_clock.call_at(1.0, lambda: fired.append("cancelled"))
    manual_clock.call_at(2.0, lambda: fired.append("kept"))
    timer.cancel()
    assert manual_clock.pending() == 1
    manual_clock.advance(3)
    assert fired == ["kept"]


def test_timer_fires_only_once(manual_clock: sl.ManualClock) -> None:
    """A timer that ran is not run again by a later advance; cancelling it then is harmless."""
    fired: list[float] = []
    timer = manual_clock.call_at(1.0, lambda: fired.append(manual_clock.now()))
    manual_clock.advance(2)
    timer.cancel()
    manual_clock.advance(2)
    assert (fired, manual_clock.pending()) == ([1.0], 0)


def test_advance_backwards_is_refused(manual_clock: sl.ManualClock) -> None:
    """A negative advance raises ValueError and leaves the time unchanged."""
    manual_clock.advance(2)
    with pytest.raises(ValueError, match=r"^a clock cannot go back \(-0\.5 s\)$"):
        manual_clock.advance(-0.5)
    assert manual_clock.now() == 2.0


def test_manual_clock_starts_where_told() -> None:
    """ManualClock(start=100) reads 100 until advanced."""
    clock = sl.ManualClock(start=100.0)
    clock.advance(2.5)
    assert clock.now() == 102.5


async def test_sleep_wakes_only_after_the_clock_is_advanced(manual_clock: sl.ManualClock) -> None:
    """sleep(5) is still waiting after advance(4) and returns after one more second."""
    sleeper = asyncio.ensure_future(manual_clock.sleep(5))
    await asyncio.sleep(0)
    manual_clock.advance(4)
    await asyncio.sleep(0)
    assert not sleeper.done()
    manual_clock.advance(1)
    await asyncio.wait_for(sleeper, timeout=5)
    assert manual_clock.now() == 5.0


def test_testing_exports_the_simulated_cluster() -> None:
    """streamlet.testing names the simulated cluster, its kill points and outcome, and the exactly-once sink."""
    names = {"Attempt", "ExactlyOnceSink", "JobOutcome", "Kill", "KillAt", "SimulatedCluster", "SimulatedJob"}
    assert names <= set(testing.__all__)
    assert all(hasattr(testing, name) for name in testing.__all__)


def writer(job_id: str, attempt: str, index: int = 0) -> SinkWriter:
    """An ExactlyOnceSink writer of instance ``index`` of sink 'out', in run ``attempt`` of ``job_id``."""
    return ExactlyOnceSink().open(SinkContext("out", index, 2, job_id, attempt))


@pytest.fixture
def job_id() -> Iterator[str]:
    """A job id whose committed output is forgotten after the test."""
    yield "test.exactly-once"
    ExactlyOnceSink.forget("test.exactly-once")


def committed(job_id: str) -> list[object]:
    """The values published for sink 'out'."""
    return values(ExactlyOnceSink.committed(job_id).get("out", []))


def test_exactly_once_sink_publishes_an_epoch_once_when_its_checkpoint_commits(job_id: str) -> None:
    """Staged at prepare_commit, visible at commit (twice is once); what no barrier covered dies with abort."""
    out = writer(job_id, "run1")
    out.write([sl.Record("a", 1), sl.Record("b", 2)])
    out.prepare_commit(1)
    out.write([sl.Record("c", 3)])
    assert committed(job_id) == []
    out.commit(1)
    out.commit(1)
    assert committed(job_id) == [1, 2]
    out.abort()
    out.prepare_commit(2)
    out.commit(2)
    assert committed(job_id) == [1, 2]


def test_exactly_once_sink_restore_publishes_what_the_checkpointing_run_staged_and_drops_the_rest(
    job_id: str,
) -> None:
    """Run 1 staged epochs 1-3 and committed 1 before dying; checkpoint 2 completed. Run 2 restores from it:
    epoch 2 is published, epoch 3 dropped (replayed), and a stale commit of run 1 publishes nothing."""
    first = writer(job_id, "run1")
    for epoch, value in enumerate([10, 20, 30], start=1):
        first.write([sl.Record("k", value)])
        first.prepare_commit(epoch)
    first.commit(1)
    second = writer(job_id, "run2")
    second.restore(RestorePoint(2, "run1"))
    assert committed(job_id) == [10, 20]
    second.write([sl.Record("k", 31)])
    second.prepare_commit(4)
    second.commit(4)
    first.commit(3)  # a zombie of run 1: its epoch 3 is gone
    other = writer(job_id, "run2", index=1)
    other.restore(RestorePoint(2, "run1"))  # another instance restores nothing of instance 0's
    other.restore(None)
    assert committed(job_id) == [10, 20, 31]


def test_exactly_once_sink_without_checkpoints_publishes_when_the_input_ends() -> None:
    """In-process, no checkpoints: everything at close; a second run of the same job replaces the first."""
    topology = sl.Topology("once")
    numbers = topology.add_source("numbers", range(5))
    topology.add_sink("out", ExactlyOnceSink()).set_input(numbers)
    try:
        sl.run(topology)
        sl.run(topology)
        assert committed("local.once") == [0, 1, 2, 3, 4]
    finally:
        ExactlyOnceSink.forget("local.once")
    assert ExactlyOnceSink.committed("local.once") == {}
