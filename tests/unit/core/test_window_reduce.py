"""window_reduce: per-window, per-key folds computed as records arrive."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import streamlet as sl
from tests.conftest import as_listed, pairs

pytestmark = pytest.mark.usefixtures("each_state_backend")  # open windows in memory, then on RocksDB


def reduce_job(items: list[Any], how: Any, window: sl.WindowSpec, **options: Any) -> sl.JobResult:
    topology = sl.Topology("reduce")
    source = topology.add_source("in", items)
    folded = topology.window_reduce("fold", how, window=window, **options).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(folded)
    return sl.run(topology, batch_size=2)


ITEMS = [("a", 5), ("b", 1), ("a", 2), ("b", 7), ("a", 9), ("c", 4), ("a", 1)]


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("sum", [("a", 7), ("b", 8), ("a", 10), ("c", 4)]),
        ("count", [("a", 2), ("b", 2), ("a", 2), ("c", 1)]),
        ("min", [("a", 2), ("b", 1), ("a", 1), ("c", 4)]),
        ("max", [("a", 5), ("b", 7), ("a", 9), ("c", 4)]),
        (lambda acc, value: acc * value, [("a", 10), ("b", 7), ("a", 9), ("c", 4)]),
    ],
    ids=["sum", "count", "min", "max", "function"],
)
def test_count_window_folds_per_key(how: Any, expected: list[tuple[str, int]]) -> None:
    """Windows of 4 then 3 records: one result per key per window, keys in first-seen order."""
    result = reduce_job(ITEMS, how, sl.CountWindow(4))
    assert pairs(result.sink("out")) == expected


def test_event_time_window_results_carry_the_window_end(each_state_backend: str) -> None:
    """Each result is stamped with its window's last tick (its end minus 1 ms); late records are counted, not
    folded."""
    items = [
        sl.Record(k, 1, ts) for k, ts in [("x", 1.0), ("y", 2.0), ("x", 9.0), ("x", 12.0), ("y", 25.0), ("x", 3.0)]
    ]
    result = reduce_job(items, "sum", sl.TimeWindow(10, time="event"))
    assert as_listed([(r.key, r.value, r.ts) for r in result.sink("out")], each_state_backend) == as_listed([
        ("x", 2, 9.999), ("y", 1, 9.999), ("x", 1, 19.999), ("y", 1, 29.999),
    ], each_state_backend)  # fmt: skip
    assert result.statistics.late == 1


def test_count_window_results_carry_the_last_event_time() -> None:
    """With a count window, results get the event time of the last record folded in."""
    items = [sl.Record("k", 1, float(ts)) for ts in range(5)]
    result = reduce_job(items, "sum", sl.CountWindow(2))
    assert [(r.value, r.ts) for r in result.sink("out")] == [(2, 1.0), (2, 3.0), (1, 4.0)]


def test_unknown_fold_is_refused() -> None:
    """how must be a built-in name or a function."""
    topology = sl.Topology("bad")
    message = r"^task 'fold': how must be one of \('sum', 'count', 'min', 'max'\) or a function, got 'avg'$"
    with pytest.raises(sl.TopologyError, match=message):
        topology.window_reduce("fold", "avg", window=sl.CountWindow(2))


def test_a_failing_fold_function_stops_the_job_naming_the_task() -> None:
    """An exception in the fold function is a TaskError of the window_reduce task."""
    with pytest.raises(sl.TaskError, match=r"^task 'fold' instance 0 failed folding a window: TypeError: "):
        reduce_job([("a", 1), ("a", "x")], lambda acc, value: acc + value, sl.CountWindow(2))


def test_open_folds_survive_a_checkpoint_and_restore() -> None:
    """Values folded before a checkpoint are part of it: the restored job finishes the windows exactly."""
    store = sl.InMemoryCheckpointStore()
    window = sl.CountWindow(4)

    def topology(sink: sl.Sink) -> sl.Topology:
        built = sl.Topology("fold-restore")
        source = built.add_source("in", sl.QueueSource())
        folded = built.window_reduce("fold", "sum", window=window).set_input(source)
        built.add_sink("out", sink).set_input(folded)
        return built

    async def crash_after_checkpoint() -> None:
        async with sl.start(topology(sl.CollectSink()), checkpoint_store=store) as job:
            for key, value in [("a", 1), ("b", 2), ("a", 3)]:
                await job.send("in", key, value)
            await job.checkpoint()
            raise KeyboardInterrupt  # leave without finishing: the open window lives only in the checkpoint

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(crash_after_checkpoint())

    async def resume() -> list[tuple[str, int]]:
        async with sl.start(topology(sl.CollectSink()), checkpoint_store=store) as job:
            await job.send("in", "b", 10)
            await job.close_source("in")
            result = await job.wait()
        return pairs(result.sink("out"))

    assert asyncio.run(resume()) == [("a", 4), ("b", 12)]


async def test_checkpoint_interval_follows_the_injected_clock(manual_clock: sl.ManualClock) -> None:
    """With a ManualClock, checkpoints are taken when the test advances time, not before."""
    saved = asyncio.Event()

    class SignallingStore(sl.InMemoryCheckpointStore):
        def save(self, epoch: int, data: bytes) -> None:
            super().save(epoch, data)
            saved.set()

    store = SignallingStore()
    topology = sl.Topology("ticking")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", sl.QueueSource()))
    async with sl.start(topology, clock=manual_clock, checkpoint_store=store, checkpoint_interval=10.0) as job:
        await job.send("in", "a", 1)
        for _ in range(20):
            await asyncio.sleep(0)
        assert store.epochs() == []
        manual_clock.advance(10.0)
        await asyncio.wait_for(saved.wait(), timeout=10)
        assert store.epochs() == [1]
        assert job.statistics().checkpoints == 1


class FoldFailing:
    """A sum that raises on the value 100: always, or only the first ``times`` times (a transient failure)."""

    def __init__(self, times: int | None = None) -> None:
        self.left = times

    def __call__(self, acc: int, value: int) -> int:
        if value == 100 and (self.left is None or self.left > 0):
            if self.left is not None:
                self.left -= 1
            raise ValueError("no 100, please")
        return acc + value


WINDOWS = {
    "tumbling": sl.TimeWindow(10, time="event"),
    "session": sl.SessionWindow(5, time="event"),
    "sliding": sl.TimeWindow(10, slide=5, time="event"),
}


def fold_records(window: str, how: Any, batch_size: int, **options: Any) -> tuple[list[Any], list[Any]]:
    """[1, 2, 100, 4] of one key at 0..3 folded by ``how``: the results and the dead letters' values."""
    topology = sl.Topology("fold-policy")
    source = topology.add_source("in", [sl.Record("k", value, float(ts)) for ts, value in enumerate([1, 2, 100, 4])])
    folded = topology.window_reduce("fold", how, window=WINDOWS[window], **options)
    folded.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(folded)
    result = sl.run(topology, batch_size=batch_size)
    return [r.value for r in result.sink("out")], [d.record.value for d in result.dead_letters]


@pytest.mark.parametrize("batch_size", [1, 3, 100])
@pytest.mark.parametrize("window", ["tumbling", "session"])
def test_skip_dead_letters_the_record_whose_fold_failed_and_folds_the_rest(window: str, batch_size: int) -> None:
    """on_error="skip": 1 + 2 + 4 = 7; the 100 is a dead letter and nothing of it is in the window."""
    assert fold_records(window, FoldFailing(), batch_size, on_error="skip") == ([7], [100])


@pytest.mark.parametrize("batch_size", [1, 3, 100])
@pytest.mark.parametrize("window", ["tumbling", "session"])
def test_restart_folds_again_after_a_transient_failure(window: str, batch_size: int) -> None:
    """on_error="restart": the fold fails once on 100, the batch is folded again: 107, each value once."""
    assert fold_records(window, FoldFailing(times=1), batch_size, on_error="restart") == ([107], [])


def test_skip_in_sliding_windows_takes_the_record_out_of_every_window_it_belongs_to() -> None:
    """A record of two sliding windows whose fold fails in the second is taken out of the first too."""
    assert fold_records("sliding", FoldFailing(), 3, on_error="skip") == ([7, 7], [100])


def test_restart_past_max_failures_fails_naming_the_record() -> None:
    """A fold that always fails: after max_failures restarts the TaskError names the key."""
    with pytest.raises(sl.TaskError, match=r"^task 'fold' instance 0 failed on record with key 'k' after 2 restarts"):
        fold_records("tumbling", FoldFailing(), 3, on_error="restart", max_failures=2)


def test_fail_stops_the_job_on_a_failing_fold() -> None:
    """The default policy: the job fails, saying the fold failed."""
    with pytest.raises(sl.TaskError, match=r"failed folding a window: ValueError: no 100, please$"):
        fold_records("tumbling", FoldFailing(), 3)
