"""The four joins' semantics, driven record by record in one process.

Two ``QueueSource`` inputs ("left", "right") feed the join; a test sends on
one side, settles, then the other, so the order the join sees is the order
written, and each side's watermark is the largest ts it sent.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import streamlet as sl

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

Sent = list[tuple[str, Any, Any, float | None]]  # (side, key, value, ts)


def joined(add: Any, **wiring: Any) -> sl.Topology:
    """``add(topology)`` makes the join 'j'; queue sources 'left' and 'right' feed it, 'out' and 'late' collect."""
    topology = sl.Topology("join")
    join = add(topology)
    for side, port in (("left", sl.LEFT), ("right", sl.RIGHT)):
        source = topology.add_source(side, sl.QueueSource())
        join.set_input(source, in_port=port, partitioning=wiring.get(side, sl.SAME_KEY))
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    topology.add_sink("late", sl.CollectSink()).set_input(join, out_port=sl.LATE)
    return topology


async def drive(topology: sl.Topology, sent: Sent, **options: Any) -> sl.JobResult:
    """Send each record in turn (settling after each), end both inputs, return the result."""
    async with sl.start(topology, **options) as job:
        for side, key, value, ts in sent:
            await job.send(side, key, value, ts)
            await job.settle()
        for side in ("left", "right"):
            await job.close_source(side)
        return await job.wait()


def so_far(job: sl.Job) -> list[sl.Record]:
    """What 'out' has received while the job runs."""
    return job._result().sink("out")


def out(result: sl.JobResult, sink: str = "out") -> list[tuple[Any, Any, Any]]:
    return [(r.key, r.value, r.ts) for r in result.sink(sink)]


def interval(lower: float, upper: float, how: str = "inner", **options: Any) -> Any:
    return lambda topology: topology.interval_join("j", lower, upper, how=how, **options)


# -- interval_join ------------------------------------------------------------------------------------------------


async def test_interval_pairs_within_inclusive_bounds_once_with_the_later_ts() -> None:
    """a.ts + lower <= b.ts <= a.ts + upper, both ends included; each pair once, when its second record comes."""
    sent: Sent = [
        ("left", "k", "a", 10.0),
        ("right", "k", "at-lower", 8.0),  # 10 - 2: pairs
        ("right", "k", "below", 7.999),  # pairs with nothing
        ("right", "k", "at-upper", 13.0),  # 10 + 3: pairs
        ("left", "k", "a2", 11.0),  # held rights 8 (no: 11-2=9 > 8), 13 (yes)
        ("right", "other", "x", 10.0),
    ]
    result = await drive(joined(interval(-2.0, 3.0)), sent)
    assert out(result) == [
        ("k", ("a", "at-lower"), 10.0), ("k", ("a", "at-upper"), 13.0), ("k", ("a2", "at-upper"), 13.0),
    ]  # fmt: skip


async def test_interval_bounds_may_both_be_negative_and_fn_builds_the_value() -> None:
    """lower=-5, upper=-1: b up to 5 s before a; fn(key, left, right) makes the value, the key is kept."""
    add = interval(-5.0, -1.0, fn=lambda key, left, right: f"{key}:{left}+{right}")
    sent: Sent = [("right", "k", "r1", 1.0), ("right", "k", "r2", 4.5), ("left", "k", "l", 5.0)]
    assert out(await drive(joined(add), sent)) == [("k", "k:l+r1", 5.0)]


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("inner", [("k", ("l1", "r1"), 2.0)]),
        ("left", [("k", ("l1", "r1"), 2.0), ("k", ("l2", None), 20.0)]),
        ("right", [("k", ("l1", "r1"), 2.0), ("k", (None, "r2"), 30.0)]),
        ("outer", [("k", ("l1", "r1"), 2.0), ("k", ("l2", None), 20.0), ("k", (None, "r2"), 30.0)]),
    ],
)
async def test_outer_kinds_emit_the_unpaired_with_none_and_their_own_ts(how: str, expected: list[Any]) -> None:
    """An unpaired record comes out, with None on the other side, once its interval closes (at the end here)."""
    sent: Sent = [("left", "k", "l1", 1.0), ("right", "k", "r1", 2.0), ("left", "k", "l2", 20.0),
                  ("right", "k", "r2", 30.0)]  # fmt: skip
    assert out(await drive(joined(interval(0.0, 5.0, how)), sent)) == expected


async def test_an_unpaired_left_comes_out_only_once_the_watermark_passes_its_interval() -> None:
    """With the watermark at a.ts + upper the left record still waits (a right one at that ts may come)."""
    topology = joined(interval(0.0, 5.0, "left"))
    async with sl.start(topology) as job:
        await job.send("left", "k", "l", 10.0)
        await job.send("right", "x", "r", 15.0)  # the watermark: min(10, 15) = 10
        await job.send("left", "y", "m", 15.0)  # now min(15, 15) = 15 = 10 + 5: not past it
        await job.settle()
        assert job.statistics().nodes["out"].records_in == 0
        await job.send("right", "k", "at-the-end", 15.0)  # still pairs: the interval is closed at its end
        await job.send("left", "z", "n", 15.001)
        await job.send("right", "z", "s", 15.001)  # 15.001 > 15
        await job.settle()
        assert [r.value for r in so_far(job)] == [("l", "at-the-end"), ("n", "s")]
        for side in ("left", "right"):
            await job.close_source(side)
        result = await job.wait()
    assert sorted(r.value for r in result.sink("out")) == [("l", "at-the-end"), ("m", None), ("n", "s")]


async def test_a_record_behind_the_watermark_is_late_and_pairs_with_nothing() -> None:
    """To the LATE port, counted in statistics.late: ts < W is late even while its interval is still open."""
    sent: Sent = [
        ("left", "k", "l", 10.0), ("right", "k", "r", 20.0), ("left", "x", "w", 20.0),  # watermark 20
        ("left", "k", "late", 14.0),  # 14 < 20: late (and 14 + 5 = 19 < 20 too)
        ("right", "k", "behind", 16.0),  # 16 < 20: late
        ("left", "k", "open", 16.0),  # 16 < 20: late, though 16 + 5 = 21 >= 20 would still pair with r
        ("left", "k", "at-the-mark", 20.0),  # 20 = W: on time, pairs with the held r (20)
    ]  # fmt: skip
    result = await drive(joined(interval(0.0, 5.0)), sent)
    assert out(result) == [("k", ("at-the-mark", "r"), 20.0)]
    assert out(result, "late") == [("k", "late", 14.0), ("k", "behind", 16.0), ("k", "open", 16.0)]
    assert result.statistics.late == 3


@pytest.mark.parametrize(
    ("lower", "upper", "sent", "pair"),
    [
        # paid 5-10 s after the order: order o1@92 held, W = 97, the payment o1@100 is on time and pairs
        (5.0, 10.0, [("left", "o1", "order", 92.0), ("right", "x", "-", 97.0), ("left", "y", "-", 97.0),
                     ("right", "o1", "pay", 100.0)], ("order", "pay")),
        # a right record 5-10 s before the left one: r@92 held, W = 97, the left o1@100 is on time and pairs
        (-10.0, -5.0, [("right", "o1", "r", 92.0), ("left", "y", "-", 97.0), ("right", "x", "-", 97.0),
                       ("left", "o1", "l", 100.0)], ("l", "r")),
    ],
)  # fmt: skip
async def test_bounds_of_one_sign_pair_an_on_time_record_whose_interval_lies_behind_the_watermark(
    lower: float, upper: float, sent: Sent, pair: tuple[str, str]
) -> None:
    """The other source being ahead is enough: an on-time record (ts >= W) is never late, whatever its bounds."""
    result = await drive(joined(interval(lower, upper)), sent)
    assert out(result) == [("o1", pair, 100.0)]
    assert out(result, "late") == []
    assert result.statistics.late == 0


def test_a_record_without_ts_fails_the_job_naming_the_node_and_key() -> None:
    """An event-time join needs ts: a TaskError naming the task and the key."""
    topology = sl.Topology("no-ts")
    join = topology.interval_join("j", 0.0, 1.0)
    join.set_input(topology.add_source("l", [sl.Record("key-1", "v", None)]), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("r", [sl.Record("key-1", "w", 1.0)]), in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    with pytest.raises(sl.TaskError, match=r"task 'j' instance 0 input port 0: the record with key 'key-1' has no ts"):
        sl.run(topology)


# -- failures: nothing of a failed record stays ------------------------------------------------------------------


def failing_on(*bad: Any) -> Any:
    """A join fn raising on a pair holding every value of ``bad``."""

    def fn(key: Any, left: Any, right: Any) -> Any:
        if all(value in (left, right) for value in bad):
            raise ValueError(f"bad {' '.join(map(str, bad))}")
        return (left, right)

    return fn


async def test_skip_dead_letters_the_record_whose_arrival_failed_and_keeps_nothing_of_it() -> None:
    """The arriving 'bad' pairs with l1 (fine) and l2 (fails): no pair of it comes out, it is not held (it never
    comes out unpaired either), and it is the dead letter; r2 then pairs with both lefts."""
    add = interval(-10.0, 10.0, "right", fn=failing_on("l2", "bad"), on_error="skip")
    sent: Sent = [("left", "k", "l1", 1.0), ("left", "k", "l2", 2.0), ("right", "k", "bad", 3.0),
                  ("right", "k", "r2", 4.0)]  # fmt: skip
    result = await drive(joined(add), sent)
    assert [(d.record.key, d.record.value, d.record.ts) for d in result.dead_letters] == [("k", "bad", 3.0)]
    assert out(result) == [("k", ("l1", "r2"), 4.0), ("k", ("l2", "r2"), 4.0)]
    assert result.statistics.dead_lettered == 1


async def test_skip_on_an_outer_emission_dead_letters_the_unpaired_record() -> None:
    """fn fails on the unpaired 'x' at its interval's end: 'x' is the dead letter, the others come out."""
    add = interval(0.0, 1.0, "left", fn=failing_on("x"), on_error="skip")
    sent: Sent = [("left", "k", "x", 1.0), ("left", "k", "y", 2.0)]
    result = await drive(joined(add), sent)
    assert out(result) == [("k", ("y", None), 2.0)]
    assert [d.record.value for d in result.dead_letters] == ["x"]


async def test_fail_stops_the_job_naming_the_join_and_the_key() -> None:
    add = interval(-10.0, 10.0, fn=failing_on("l1"))
    with pytest.raises(sl.TaskError, match=r"^task 'j' instance 0 failed on record with key 'k': ValueError: bad l1$"):
        await drive(joined(add), [("left", "k", "l1", 1.0), ("right", "k", "r", 1.0)])


async def test_restart_calls_a_failing_fn_again_and_each_pair_comes_out_once() -> None:
    """fn fails the first time only: after the restart the pair comes out once, state intact."""
    calls: list[Any] = []

    def flaky(key: Any, left: Any, right: Any) -> Any:
        calls.append((left, right))
        if len(calls) == 2:
            raise RuntimeError("once")
        return (left, right)

    add = interval(-10.0, 10.0, fn=flaky, on_error="restart")
    sent: Sent = [("left", "k", "l", 1.0), ("right", "k", "r1", 2.0), ("right", "k", "r2", 3.0)]
    result = await drive(joined(add), sent)
    assert out(result) == [("k", ("l", "r1"), 2.0), ("k", ("l", "r2"), 3.0)]
    assert calls == [("l", "r1"), ("l", "r2"), ("l", "r2")]
    assert result.statistics.restarts == 1


# -- table_join -----------------------------------------------------------------------------------------------------


async def test_table_join_meets_the_row_its_key_holds_when_the_left_record_is_processed() -> None:
    """Rows set, replaced and deleted (None) in processing order; right records emit nothing; ts is the left's."""
    sent: Sent = [
        ("left", "u1", "click-0", 1.0),  # no row yet
        ("right", "u1", "alice", 5.0),
        ("left", "u1", "click-1", 2.0),
        ("right", "u1", "alice-2", 6.0),
        ("left", "u1", "click-2", 3.0),
        ("right", "u1", None, 7.0),  # deleted
        ("left", "u1", "click-3", 4.0),
        ("left", "u2", "click-4", 0.5),  # processing order: ts plays no part
    ]
    inner = await drive(joined(lambda t: t.table_join("j")), sent)
    assert out(inner) == [("u1", ("click-1", "alice"), 2.0), ("u1", ("click-2", "alice-2"), 3.0)]
    left = await drive(joined(lambda t: t.table_join("j", how="left", fn=lambda k, v, row: [v, row])), sent)
    assert out(left) == [
        ("u1", ["click-0", None], 1.0), ("u1", ["click-1", "alice"], 2.0), ("u1", ["click-2", "alice-2"], 3.0),
        ("u1", ["click-3", None], 4.0), ("u2", ["click-4", None], 0.5),
    ]  # fmt: skip


async def test_table_rows_expire_after_state_ttl(manual_clock: sl.ManualClock) -> None:
    """A row lives state_ttl seconds of the job clock after its last write."""
    topology = joined(lambda t: t.table_join("j", how="left", state_ttl=10.0))
    async with sl.start(topology, clock=manual_clock) as job:
        await job.send("right", "u", "row", 0.0)
        await job.settle()
        manual_clock.advance(9.0)
        await job.send("left", "u", "early", 1.0)
        await job.settle()
        manual_clock.advance(2.0)  # 11 s after the write
        await job.send("left", "u", "after", 2.0)
        await job.settle()
        for side in ("left", "right"):
            await job.close_source(side)
        result = await job.wait()
    assert out(result) == [("u", ("early", "row"), 1.0), ("u", ("after", None), 2.0)]


# -- asof_join ------------------------------------------------------------------------------------------------------


async def test_asof_meets_the_latest_right_at_or_before_and_waits_for_the_watermark() -> None:
    """Greatest ts <= a.ts (equal included, the last of equal ts wins); a tombstone ends the row; emitted only
    once the watermark passes a.ts, whatever comes in between."""
    topology = joined(lambda t: t.asof_join("j", how="left"))
    async with sl.start(topology) as job:
        for key, value, ts in [("AAPL", 100, 1.0), ("AAPL", 101, 5.0), ("AAPL", 102, 5.0), ("AAPL", None, 9.0)]:
            await job.send("right", key, value, ts)
        await job.send("left", "AAPL", "t0", 0.5)
        await job.send("left", "AAPL", "t1", 5.0)
        await job.send("left", "AAPL", "t2", 8.0)
        await job.settle()
        # the watermark is 8 (min(9, 8)): t0 and t1 are due, t2 waits
        assert so_far(job) == [sl.Record("AAPL", ("t0", None), 0.5), sl.Record("AAPL", ("t1", 102), 5.0)]
        await job.send("right", "AAPL", 103, 7.0)  # behind the right side's watermark: joins the versions
        await job.send("left", "AAPL", "t3", 9.5)
        await job.settle()
        for side in ("left", "right"):
            await job.close_source(side)
        result = await job.wait()
    assert out(result) == [
        ("AAPL", ("t0", None), 0.5), ("AAPL", ("t1", 102), 5.0), ("AAPL", ("t2", 103), 8.0),
        ("AAPL", ("t3", None), 9.5),
    ]  # fmt: skip


async def test_asof_inner_emits_nothing_without_a_match_and_grace_bounds_late_lefts() -> None:
    """grace=2: a left 2 s behind the watermark is joined with the versions kept, 2.001 behind is late."""
    sent: Sent = [("right", "k", "v1", 1.0), ("right", "k", "v2", 10.0), ("left", "x", "w", 10.0),  # watermark 10
                  ("left", "k", "in-grace", 8.0), ("left", "k", "too-late", 7.999),
                  ("left", "nothing", "n", 11.0)]  # fmt: skip
    result = await drive(joined(lambda t: t.asof_join("j", grace=2.0)), sent)
    assert out(result) == [("k", ("in-grace", "v1"), 8.0)]
    assert out(result, "late") == [("k", "too-late", 7.999)]
    assert result.statistics.late == 1


# -- window_join ----------------------------------------------------------------------------------------------------


async def test_window_join_pairs_left_major_in_arrival_order_with_the_window_bounds() -> None:
    """Tumbling 10 s: each window's pairs of a key; stamped with the last tick; outer kinds emit the lonely side."""
    sent: Sent = [("left", "k", "a", 1.0), ("right", "k", "x", 2.0), ("left", "k", "b", 3.0), ("right", "k", "y", 4.0),
                  ("right", "q", "alone", 5.0), ("left", "k", "c", 12.0), ("right", "q", "z", 12.0)]  # fmt: skip
    topology = joined(lambda t: t.window_join("j", sl.TimeWindow(10.0, time="event"), how="outer"))
    result = await drive(topology, sent)
    assert [(r.key, r.value, r.ts, r.window) for r in result.sink("out")] == [
        ("k", ("a", "x"), 9.999, (0.0, 10.0)), ("k", ("a", "y"), 9.999, (0.0, 10.0)),
        ("k", ("b", "x"), 9.999, (0.0, 10.0)), ("k", ("b", "y"), 9.999, (0.0, 10.0)),
        ("q", (None, "alone"), 9.999, (0.0, 10.0)),
        ("k", ("c", None), 19.999, (10.0, 20.0)), ("q", (None, "z"), 19.999, (10.0, 20.0)),
    ]  # fmt: skip


async def test_window_join_sessions_span_both_inputs_and_late_records_go_to_late() -> None:
    """A gap-3 session per key grows with records of either side; a record after its session closed is late."""
    sent: Sent = [("left", "k", "a", 1.0), ("right", "k", "x", 3.5), ("left", "k", "b", 6.0),  # one session 1..9
                  ("right", "k", "y", 20.0), ("left", "k", "c", 20.0),  # a second session; watermark 20
                  ("left", "k", "late", 2.0)]  # fmt: skip
    topology = joined(lambda t: t.window_join("j", sl.SessionWindow(3.0, time="event")))
    result = await drive(topology, sent)
    assert [(r.key, r.value, r.window) for r in result.sink("out")] == [
        ("k", ("a", "x"), (1.0, 9.0)), ("k", ("b", "x"), (1.0, 9.0)), ("k", ("c", "y"), (20.0, 23.0)),
    ]  # fmt: skip
    assert out(result, "late") == [("k", "late", 2.0)]
    assert result.statistics.late == 1


# -- what validation refuses ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("add", "message"),
    [
        (lambda t: t.table_join("j", how="outer"), r"task 'j': how must be one of \('inner', 'left'\), got 'outer'"),
        (lambda t: t.asof_join("j", how="right"), r"task 'j': how must be one of \('inner', 'left'\), got 'right'"),
        (lambda t: t.interval_join("j", 0, 1, how="full"), r"task 'j': how must be one of \('inner', 'left', "),
        (lambda t: t.interval_join("j", 2.0, 1.0), r"task 'j': lower \(2.0\) must be at most upper \(1.0\)"),
        (lambda t: t.interval_join("j", 0, 1, state_ttl=5), r"task 'j': this join's state is dropped by the "),
        (lambda t: t.window_join("j", sl.CountWindow(3)), r"task 'j': window_join needs a TimeWindow or a "),
        (lambda t: t.asof_join("j", grace=-1), r"task 'j': grace must be None or a number of seconds >= 0"),
    ],
)
def test_a_join_refuses_what_it_cannot_do_naming_the_node(add: Any, message: str) -> None:
    with pytest.raises(sl.TopologyError, match=message):
        add(sl.Topology("bad"))


def test_a_join_input_not_partitioned_by_same_key_is_refused_naming_node_and_port() -> None:
    topology = joined(interval(0.0, 1.0), right=sl.ROUND_ROBIN)
    message = r"^task 'j' input port 1: a join's inputs are partitioned by SAME_KEY .*, not by ROUND_ROBIN$"
    with pytest.raises(sl.TopologyError, match=message):
        topology.validate()


def test_a_join_with_nothing_on_its_right_port_is_refused() -> None:
    """Two set_input calls without in_port both land on LEFT."""
    topology = sl.Topology("one-sided")
    join = topology.interval_join("j", 0.0, 1.0)
    join.set_input(topology.add_source("a", [1]), partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("b", [2]), partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    with pytest.raises(
        sl.TopologyError, match=re.escape("task 'j' has 2 input ports but input port 1 is not connected")
    ):
        topology.validate()


async def test_window_join_on_processing_time_pairs_what_arrived_in_the_same_window(
    manual_clock: sl.ManualClock,
) -> None:
    """By the job clock: records in [0, 10) pair, the window closes when the clock passes 10."""
    topology = joined(lambda t: t.window_join("j", sl.TimeWindow(10.0)))
    async with sl.start(topology, clock=manual_clock) as job:
        await job.send("left", "k", "a")
        await job.send("right", "k", "x")
        await job.settle()
        manual_clock.advance(11.0)
        await job.settle()
        assert [(r.value, r.window) for r in so_far(job)] == [(("a", "x"), (0.0, 10.0))]
        await job.send("right", "k", "y")  # a window of its own: nothing to pair with
        for side in ("left", "right"):
            await job.close_source(side)
        result = await job.wait()
    assert [r.value for r in result.sink("out")] == [("a", "x")]


def test_an_event_time_window_join_refuses_a_record_without_ts() -> None:
    topology = sl.Topology("no-ts-window")
    join = topology.window_join("j", sl.TimeWindow(10.0, time="event"))
    join.set_input(topology.add_source("l", [sl.Record("key-2", "v", None)]), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("r", [sl.Record("key-2", "w", 1.0)]), in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    with pytest.raises(
        sl.TaskError, match=r"task 'j' instance 0 input port 0: the record with key 'key-2' has ts None"
    ):
        sl.run(topology)


def test_a_window_join_fires_each_window_once() -> None:
    """allowed_lateness (or early_firing) would fire a window again and emit its pairs twice: refused."""
    with pytest.raises(sl.TopologyError, match=r"^task 'j': window_join fires each window once"):
        sl.Topology("late").window_join("j", sl.TimeWindow(10.0, time="event", allowed_lateness=5.0))


@pytest.mark.parametrize("ts", [float("nan"), True])
def test_a_ts_that_is_not_a_number_of_seconds_fails_the_job(ts: Any) -> None:
    """NaN would never close (and be held for ever), a bool is no time: a TaskError naming the key."""
    topology = sl.Topology("bad-ts")
    join = topology.asof_join("j")
    join.set_input(topology.add_source("l", [sl.Record("k", "v", 1.0)]), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("r", [sl.Record("k", "w", ts)]), in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    with pytest.raises(sl.TaskError, match=r"^task 'j' instance 0 input port 1: the record with key 'k' has ts "):
        sl.run(topology)


def test_a_key_a_join_cannot_hold_fails_naming_the_join() -> None:
    """An unhashable key is no error of fn: the job fails with a TaskError naming the join and the key."""
    topology = sl.Topology("bad-key")
    join = topology.table_join("j")
    join.set_input(topology.add_source("l", [sl.Record(["a"], "v", 1.0)]), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("r", [sl.Record("k", "w", 1.0)]), in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    with pytest.raises(sl.TaskError, match=r"^task 'j' instance 0 failed on a batch starting with key \['a'\]"):
        sl.run(topology)


async def test_table_join_skip_dead_letters_the_left_record_it_failed_on() -> None:
    add = lambda t: t.table_join("j", how="left", fn=failing_on("bad"), on_error="skip")  # noqa: E731
    sent: Sent = [
        ("right", "u", "row", 0.0),
        ("left", "u", "ok", 1.0),
        ("left", "u", "bad", 2.0),
        ("left", "u", "ok2", 3.0),
    ]
    result = await drive(joined(add), sent)
    assert out(result) == [("u", ("ok", "row"), 1.0), ("u", ("ok2", "row"), 3.0)]
    assert [(d.record.key, d.record.value, d.record.ts) for d in result.dead_letters] == [("u", "bad", 2.0)]


async def test_asof_skip_at_the_watermark_dead_letters_the_waiting_left_record() -> None:
    """The failing call happens when the watermark passes the left record: that record is the dead letter."""
    add = lambda t: t.asof_join("j", fn=failing_on("t2", "p"), on_error="skip")  # noqa: E731
    sent: Sent = [
        ("right", "s", "p", 0.0),
        ("left", "s", "t1", 1.0),
        ("left", "s", "t2", 2.0),
        ("left", "s", "t3", 3.0),
    ]
    result = await drive(joined(add), sent)
    assert out(result) == [("s", ("t1", "p"), 1.0), ("s", ("t3", "p"), 3.0)]
    assert [(d.record.key, d.record.value, d.record.ts) for d in result.dead_letters] == [("s", "t2", 2.0)]


async def test_window_join_skip_leaves_the_failing_left_record_out_of_its_window() -> None:
    """fn fails on (a, x): a is dead-lettered and the window is joined without it; with "outer", y and x still
    meet b, so nothing comes out unpaired."""
    add = lambda t: t.window_join("j", sl.TimeWindow(10.0, time="event"), how="outer",  # noqa: E731
                                  fn=failing_on("a", "x"), on_error="skip")  # fmt: skip
    sent: Sent = [("left", "k", "a", 1.0), ("left", "k", "b", 2.0), ("right", "k", "x", 3.0), ("right", "k", "y", 4.0)]
    result = await drive(joined(add), sent)
    assert [r.value for r in result.sink("out")] == [("b", "x"), ("b", "y")]
    assert [d.record.value for d in result.dead_letters] == ["a"]
