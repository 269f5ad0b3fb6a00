"""Per-key timers: ``self.timers.at/cancel/pending`` and ``Task.on_timer``.

Event-time timers fire as the watermark rises (sources with ``batch_size=1``
send one after every record, so the order is exact), processing-time ones
on the ``ManualClock``; pending event-time timers fire at the end of the
input; timers are checkpointed with their keys' exact types.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.model import world
from streamlet.core.state.store import encode

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

Logged = list[tuple[Any, Any, Any]]


def logged(records: list[sl.Record]) -> Logged:
    """``(key, value, ts)`` of ``records``, in order."""
    return [(record.key, record.value, record.ts) for record in records]


def run_task(task: Any, records: list[sl.Record], **options: Any) -> sl.JobResult:
    """``records`` -> task 't' (``options`` for add_task) -> CollectSink 'out', one record per batch."""
    topology = sl.Topology("timers")
    source = topology.add_source("in", records)
    node = topology.add_task("t", task, **options).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    return sl.run(topology, batch_size=1)


def at(*pairs: tuple[str, float]) -> list[sl.Record]:
    """A record per ``(key, ts)``, valued ``None``."""
    return [sl.Record(key, None, ts) for key, ts in pairs]


class Log(sl.Task):
    """Sets an event-time timer at ts + 10 per record; logs records, firings and finish() in order."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.timers.at(record.key, record.ts + 10)
            outputs.emit("record", (record.key, record.ts))

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit("timer", (key, when, time))

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit("finish", None)


# -- event time ---------------------------------------------------------------------------------


def test_event_timers_fire_when_the_watermark_reaches_them_and_the_rest_at_the_end() -> None:
    """a@0 sets a timer at 10: the watermark after c@10 reaches it (>=), after c's own record. d@30 fires b's
    and c's; d's (40) fires at the end of the input, before finish(). A timer's records are stamped ``when``."""
    result = run_task(Log, at(("a", 0), ("b", 5), ("c", 10), ("d", 30)))
    assert logged(result.sink("out")) == [
        ("record", ("a", 0), 0),
        ("record", ("b", 5), 5),
        ("record", ("c", 10), 10),
        ("timer", ("a", 10, "event"), 10),
        ("record", ("d", 30), 30),
        ("timer", ("b", 15, "event"), 15),
        ("timer", ("c", 20, "event"), 20),
        ("timer", ("d", 40, "event"), 40),
        ("finish", None, None),
    ]


class Several(sl.Task):
    """The first record sets timers out of order, one twice, and cancels one; each firing is emitted."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            if record.key == "set":
                for key, when in [("z", 20), ("y", 10), ("x", 20), ("w", 10), ("z", 20), ("v", 15)]:
                    self.timers.at(key, when)
                self.timers.cancel("x", 20)
                self.timers.cancel("v", 15, time="processing")  # another timer: v's event timer stays
                self.timers.cancel("never", 1)

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, when)


def test_timers_fire_by_time_then_in_the_order_set_once_each_and_never_when_cancelled() -> None:
    """y and w (10) before v (15) before z (20); at equal times the one set first; z set twice fires once."""
    result = run_task(Several, at(("set", 0), ("tick", 50)))
    assert logged(result.sink("out")) == [("y", 10, 10), ("w", 10, 10), ("v", 15, 15), ("z", 20, 20)]


class Remind(sl.Task):
    """A timer at ts + 5 per record; emits ``(key, when)`` when it fires."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.timers.at(record.key, record.ts + 5)

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, when)


def test_what_a_timer_emits_goes_downstream_before_the_watermark_that_fired_it() -> None:
    """a's timer (5) fires on the watermark 12 and emits at ts 5: a downstream event-time window [0, 10)
    gets it before that watermark closes the window, so it is not late."""
    topology = sl.Topology("downstream")
    source = topology.add_source("in", at(("a", 0), ("b", 12)))
    remind = topology.add_task("remind", Remind).set_input(source)
    counts = topology.window_reduce("count", "count", window=sl.TimeWindow(10, time="event")).set_input(remind)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    topology.add_sink("late", sl.CollectSink()).set_input(counts, out_port=sl.LATE)
    result = sl.run(topology, batch_size=1)
    out = [(record.key, record.value, record.window) for record in result.sink("out")]
    assert (out, result.sink("late")) == ([("a", 1, (0, 10)), ("b", 1, (10, 20))], [])


class Chain(sl.Task):
    """'start' sets 'first' at 5; the first time 'first' fires it sets itself again, two timers already due
    and one far ahead."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit("record", record.key)
            if record.key == "start":
                self.timers.at("first", 5)

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit("timer", key)
        if key == "first" and not self.state.get("again"):
            self.state.put("again", True)
            self.timers.at("first", 5)  # its own timer again: the next pass
            self.timers.at("second", 3)  # due already: this pass
            self.timers.at("third", 8)  # due at the watermark 10: this pass
            self.timers.at("later", 100)  # not due

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit("finish", None)


def test_timers_set_by_on_timer_fire_in_the_same_pass_but_one_set_again_waits_for_the_next() -> None:
    """The watermark 10 fires first, then second and third that it set (due); first set again fires on the
    next watermark (20), not in a loop; 'later' at the end."""
    result = run_task(Chain, at(("start", 0), ("tick", 10), ("tock", 20)))
    assert [(record.key, record.value) for record in result.sink("out")] == [
        ("record", "start"),
        ("record", "tick"),
        ("timer", "first"),
        ("timer", "second"),
        ("timer", "third"),
        ("record", "tock"),
        ("timer", "first"),
        ("timer", "later"),
        ("finish", None),
    ]


class ForEver(sl.Task):
    """Timers that would never end at +infinity: 'tick' re-arms 10 later, 'same' sets itself again."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        self.timers.at("tick", 40)
        self.timers.at("k", 30)
        self.timers.at("same", 35)
        self.timers.at("p", self.timers.now() + 3600, time="processing")

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, when)
        if key == "tick":
            self.timers.at("tick", when + 10)
        elif key == "same":
            self.timers.at("same", when)

    def finish(self, outputs: sl.Outputs) -> None:
        outputs.emit("left", self.timers.pending())


def test_the_end_of_input_fires_event_timers_up_to_the_last_pending_and_drops_the_rest() -> None:
    """At the end: k, same and tick fire once each, in time order; tick's re-arm (50) is past the last timer
    pending then (40) and same's re-set was fired in that pass: both dropped, as is the processing timer."""
    result = run_task(ForEver, at(("x", 0)))
    assert logged(result.sink("out")) == [("k", 30, 30), ("same", 35, 35), ("tick", 40, 40), ("left", [], None)]


class Stamps(sl.Task):
    """``async def on_timer``: emits one record without ts, one with ts=1.5."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.timers.at(record.key, 7)

    async def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, "stamped")
        outputs.emit(key, "own", ts=1.5)


def test_records_an_async_on_timer_emits_get_ts_when_unless_given_one() -> None:
    result = run_task(Stamps, at(("a", 0)))
    assert logged(result.sink("out")) == [("a", "stamped", 7), ("a", "own", 1.5)]


def test_overriding_on_timer_makes_the_job_track_event_time() -> None:
    """A task with on_timer needs watermarks; the same job with a map does not."""
    with_timers, without = sl.Topology("with"), sl.Topology("without")
    with_timers.add_task("t", Log).set_input(with_timers.add_source("in", [1]))
    without.map("t", lambda r: (r.key, r.value)).set_input(without.add_source("in", [1]))
    assert (with_timers.uses_event_time(), without.uses_event_time()) == (True, False)


# -- processing time ----------------------------------------------------------------------------


class Later(sl.Task):
    """A processing-time timer 5 s of the job clock after each record."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.timers.at(record.key, self.timers.now() + 5, time="processing")

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, (when, time))


def queued(task: Any, seen: list[sl.Record], **options: Any) -> sl.Topology:
    """QueueSource 'in' -> task 't' -> a callback sink appending to ``seen``."""
    topology = sl.Topology("queued")
    source = topology.add_source("in", sl.QueueSource())
    node = topology.add_task("t", task, **options).set_input(source)
    topology.add_sink("out", seen.append).set_input(node)
    return topology


async def test_processing_timers_fire_when_the_clock_reaches_them_stamped_with_the_clock(
    manual_clock: sl.ManualClock,
) -> None:
    """Set at 0 for 5: nothing at 3; at 7 it fires, its record stamped 7 (the clock when it fired)."""
    seen: list[sl.Record] = []
    async with sl.start(queued(Later, seen), clock=manual_clock) as job:
        await job.send("in", "k", "v")
        await job.settle()
        manual_clock.advance(3)
        await job.settle()
        assert seen == []
        manual_clock.advance(4)
        await job.settle()
        assert logged(seen) == [("k", (5, "processing"), 7)]
        await job.close_source("in")
        await job.wait()


class Windowed(sl.Task):
    """A processing-time window task with a processing-time timer at 3, set before the first record."""

    def prepare(self, config: dict[str, Any]) -> None:
        self.timers.at("alarm", 3, time="processing")

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        outputs.emit("window", [record.value for record in inputs.get()])

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, when)


async def test_a_processing_timer_before_the_window_end_wakes_the_instance_first(
    manual_clock: sl.ManualClock,
) -> None:
    """Window [0, 10) and a timer at 3: the instance sleeps until the earlier of the two."""
    seen: list[sl.Record] = []
    async with sl.start(queued(Windowed, seen, window=sl.TimeWindow(10)), clock=manual_clock) as job:
        await job.send("in", "k", "a")
        await job.settle()
        manual_clock.advance(3)
        await job.settle()
        assert [(r.key, r.value) for r in seen] == [("alarm", 3)]
        manual_clock.advance(7)
        await job.settle()
        assert [(r.key, r.value) for r in seen] == [("alarm", 3), ("window", ["a"])]
        await job.close_source("in")
        await job.wait()


# -- error policies -----------------------------------------------------------------------------


class Flaky(sl.Task):
    """Timers at ts + 10; b's fails ``times`` times (counted in ``failures``, shared by the task objects a
    restart makes; a failed call's state writes are taken back), after emitting."""

    def __init__(self, times: int = 1_000, failures: list[str] | None = None) -> None:
        self.times = times
        self.failures = [] if failures is None else failures

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.timers.at(record.key, record.ts + 10)

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, when)
        if key == "b" and len(self.failures) < self.times:
            self.failures.append(key)
            raise ValueError("no timer for b")


FLAKY_RECORDS = at(("a", 0), ("b", 5), ("c", 30))


def test_a_failing_timer_fails_the_job_naming_task_instance_key_and_timer() -> None:
    message = "task 't' instance 0 failed on the event-time timer at 15 for key 'b': ValueError: no timer for b"
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$") as caught:
        run_task(Flaky, FLAKY_RECORDS)
    assert (caught.value.task, caught.value.instance, caught.value.key) == ("t", 0, "b")
    assert isinstance(caught.value.__cause__, ValueError)


def test_skip_dead_letters_a_failing_timer_as_a_record_of_its_key_and_time_and_goes_on() -> None:
    """What b's timer emitted before it failed is rolled back; a and c fire."""
    result = run_task(Flaky, FLAKY_RECORDS, on_error="skip")
    assert logged(result.sink("out")) == [("a", 10, 10), ("c", 40, 40)]
    assert [(d.task, d.instance, d.record, d.error) for d in result.dead_letters] == [
        ("t", 0, sl.Record("b", None, 15), "ValueError: no timer for b")
    ]


def test_restart_runs_the_failed_timer_again_with_state_and_timers_kept() -> None:
    """b fails twice, then fires on the third task object; its failed attempts' records are rolled back."""
    failures: list[str] = []
    result = run_task(lambda: Flaky(times=2, failures=failures), FLAKY_RECORDS, on_error="restart")
    assert failures == ["b", "b"]
    assert (logged(result.sink("out")), result.dead_letters) == ([("a", 10, 10), ("b", 15, 15), ("c", 40, 40)], [])


def test_restart_gives_up_after_max_failures_naming_the_timer() -> None:
    message = (
        "task 't' instance 0 failed on the event-time timer at 15 for key 'b' after 2 restarts: "
        "ValueError: no timer for b"
    )
    with pytest.raises(sl.TaskError, match=f"^{re.escape(message)}$"):
        run_task(Flaky, FLAKY_RECORDS, on_error="restart", max_failures=2)


# -- checkpoints ---------------------------------------------------------------------------------


class Crash(Exception):
    """Leaves a job's ``async with`` without finishing it, like a crash."""


class Keep(sl.Task):
    """Keeps each record's value; an event-time timer at ts + 10, and a processing one 5 s on for value 'p'.
    A firing emits ``(when, time, the key's value)``."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.state.put(record.key, record.value)
            self.timers.at(record.key, record.ts + 10)
            if record.value == "p":
                self.timers.at(record.key, self.timers.now() + 5, time="processing")

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, (when, time, self.state.get(key)))


def kept(seen: list[sl.Record], parallelism: int = 1) -> sl.Topology:
    """QueueSource 'in' -> Keep 't' (``parallelism``, SAME_KEY) -> callback sink appending to ``seen``."""
    topology = sl.Topology("kept")
    source = topology.add_source("in", sl.QueueSource())
    node = topology.add_task("t", Keep, parallelism=parallelism).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", seen.append).set_input(node)
    return topology


async def first_run(store: sl.InMemoryCheckpointStore, sends: list[tuple[Any, Any, float]]) -> None:
    """Send ``sends`` (key, value, ts) one per batch at clock 0, take a checkpoint, then crash."""

    async def crashing() -> None:
        async with sl.start(kept([]), clock=sl.ManualClock(), checkpoint_store=store, batch_size=1) as job:
            for key, value, ts in sends:
                await job.send("in", key, value, ts=ts)
            await job.settle()
            await job.checkpoint()
            raise Crash

    with pytest.raises(Crash):
        await crashing()


async def test_timers_survive_a_checkpoint_and_resume_with_their_tuple_keys(manual_clock: sl.ManualClock) -> None:
    """Run 1 sets event timers for ('user', 1) at 10 and 'b' at 12, and a processing one for 'b' at 5, then
    crashes after a checkpoint. Run 2: the watermark 11 fires the tuple key's (a tuple again), the clock at 5
    'b''s processing timer, the end of the input the rest."""
    store = sl.InMemoryCheckpointStore()
    await first_run(store, [(("user", 1), "x", 0), ("b", "p", 2)])
    seen: list[sl.Record] = []
    async with sl.start(kept(seen), clock=manual_clock, checkpoint_store=store, batch_size=1) as job:
        await job.send("in", "c", "y", ts=11)
        await job.settle()
        assert logged(seen) == [(("user", 1), (10, "event", "x"), 10)]
        manual_clock.advance(5)
        await job.settle()
        await job.close_source("in")
        await job.wait()
    assert logged(seen) == [
        (("user", 1), (10, "event", "x"), 10),
        ("b", (5, "processing", "p"), 5),
        ("b", (12, "event", "p"), 12),
        ("c", (21, "event", "y"), 21),
    ]
    assert type(seen[0].key) is tuple


async def test_a_checkpoint_taken_before_timers_existed_restores_with_none() -> None:
    """The same checkpoint without its 'timers' entries (as older streamlet wrote them): the state comes
    back, the timers of run 1 are gone, run 2's fire."""
    store = sl.InMemoryCheckpointStore()
    await first_run(store, [("a", "x", 0)])
    latest = store.latest()
    assert latest is not None
    epoch, document = latest
    for snapshot in document["tasks"]["t"]:
        del snapshot["timers"]
    store.save(epoch + 1, encode(document))
    seen: list[sl.Record] = []
    async with sl.start(kept(seen), clock=sl.ManualClock(), checkpoint_store=store, batch_size=1) as job:
        await job.send("in", "b", "y", ts=1)
        await job.close_source("in")
        await job.wait()
    assert logged(seen) == [("b", (11, "event", "y"), 11)]


async def test_a_resume_with_more_instances_splits_timers_by_key_with_their_state() -> None:
    """Six keys' timers checkpointed by one instance fire once each after a resume with two, each where its
    key's state went (every firing finds its value)."""
    store = sl.InMemoryCheckpointStore()
    keys = [f"k{index}" for index in range(6)]
    await first_run(store, [(key, key.upper(), 0) for key in keys])
    seen: list[sl.Record] = []
    async with sl.start(kept(seen, parallelism=2), checkpoint_store=store, batch_size=1) as job:
        await job.close_source("in")
        await job.wait()
    assert sorted(logged(seen)) == [(key, (10, "event", key.upper()), 10) for key in keys]


# -- the Timers object ---------------------------------------------------------------------------


@pytest.fixture(params=["memory", "rocksdb"])
def make_timers(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., sl.Timers]:
    """Makes empty timers: the in-memory ones, then RocksDB's (``RocksDBState.open_timers``)."""
    if request.param == "memory":
        return sl.Timers
    backend = sl.RocksDBState(tmp_path)
    opened = itertools.count()
    return lambda now=world.wall_time: backend.open_timers("job", "task", next(opened), now)


def test_pending_lists_timers_in_firing_order_and_by_key(make_timers: Callable[..., sl.Timers]) -> None:
    timers = make_timers(now=lambda: 100.0)
    timers.at("a", 20)
    timers.at(("t", 1), 10, time="processing")
    timers.at("a", 10)
    timers.at("a", 10)
    timers.at(None, 15)
    assert timers.pending() == [
        (("t", 1), 10, "processing"),
        ("a", 10, "event"),
        (None, 15, "event"),
        ("a", 20, "event"),
    ]
    assert (timers.pending("a"), timers.now(), timers.watermark) == (
        [("a", 10, "event"), ("a", 20, "event")],
        100.0,
        float("-inf"),
    )


def test_bad_times_and_kinds_are_refused(make_timers: Callable[..., sl.Timers]) -> None:
    timers = make_timers()
    cases: list[tuple[Any, Any, type[Exception], str]] = [
        (10, "wall", ValueError, "time must be 'event' or 'processing', got 'wall'"),
        ("10", "event", TypeError, "a timer's when must be a number of seconds, got '10'"),
        (True, "event", TypeError, "a timer's when must be a number of seconds, got True"),
        (float("nan"), "event", TypeError, "a timer's when must be a number of seconds, got nan"),
    ]
    for when, time, error, message in cases:
        with pytest.raises(error, match=f"^{re.escape(message)}$"):
            timers.at("k", when, time)
    assert timers.pending() == []


def test_a_snapshot_round_trips_keys_exactly_and_splits_and_merges_by_key(
    make_timers: Callable[..., sl.Timers],
) -> None:
    timers = make_timers()
    keys: list[Any] = [("user", 1), ("nested", ("x", 2)), "a", 7, b"raw", None]
    for index, key in enumerate(keys):
        timers.at(key, index, time="processing" if index % 2 else "event")
    restored = make_timers()
    restored.restore(timers.checkpoint())
    parts = sl.Timers.partition(timers.checkpoint(), 3)
    merged = make_timers()
    merged.restore(sl.Timers.merge([*parts, None]))
    assert restored.pending() == merged.pending() == timers.pending()
    assert [type(key) for key, _, _ in restored.pending()] == [type(key) for key in keys]


def test_many_cancelled_timers_leave_the_live_ones_in_order(make_timers: Callable[..., sl.Timers]) -> None:
    """Cancelling most timers compacts the heap; the rest still come out in order."""
    timers = make_timers()
    for index in range(500):
        timers.at(index, 500 - index)
    for index in range(500):
        if index % 100:
            timers.cancel(index, 500 - index)
    assert (timers.next_due("event"), list(timers.due("event", 1000))) == (
        100,
        [(400, 100), (300, 200), (200, 300), (100, 400), (0, 500)],
    )


def test_equal_times_are_one_slot_and_whole_times_keep_their_exact_order(
    make_timers: Callable[..., sl.Timers],
) -> None:
    """0.0 and -0.0 (and 5 and 5.0) are one timer; whole-number times past 2**53, which one float stands for,
    still fire in their own order (a due one is never skipped for a later one set first)."""
    timers = make_timers()
    timers.at("a", 0.0)
    timers.at("a", -0.0)
    timers.at("b", 5)
    timers.at("b", 5.0)
    late, early = 1_700_000_000_000_000_001, 1_700_000_000_000_000_000  # one float for both
    timers.at("late", late)
    timers.at("early", early)
    assert [(key, when) for key, when, _ in timers.pending()] == [
        ("a", 0.0),
        ("b", 5),
        ("early", early),
        ("late", late),
    ]
    assert list(timers.due("event", 10)) == [("a", 0.0), ("b", 5)]
    assert (timers.next_due("event"), list(timers.due("event", early))) == (early, [("early", early)])
    timers.cancel("late", late)
    assert timers.pending() == []
    with pytest.raises(TypeError, match="unhashable"):
        timers.at(["a", "list"], 1.0)
