"""Edges of the as-of and interval joins: bad ``ts`` on either port, versions dropped behind the watermark, the
``held`` counters as records come and go (restores included), and the order keys due together come out in.

Driven as in ``test_joins``: queue sources 'left' and 'right', a settle after each record, so the watermark is
the smaller of the largest ts each side sent.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.savepoints import read_savepoint
from tests.unit.core.test_joins import Sent, drive, interval, joined, out, so_far

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

Add = Any  # topology -> the join node


def asof(how: str = "inner", grace: float | None = None) -> Add:
    return lambda topology: topology.asof_join("j", how=how, grace=grace)


def held(job: sl.Job) -> int:
    """The records the join holds now."""
    return job.statistics().nodes["j"].held


async def send_all(job: sl.Job, sent: Sent) -> None:
    for side, key, value, ts in sent:
        await job.send(side, key, value, ts)
        await job.settle()


async def finish(job: sl.Job) -> sl.JobResult:
    for side in ("left", "right"):
        await job.close_source(side)
    return await job.wait()


async def keys_held(job: sl.Job, directory: str) -> list[Any]:
    """The keys the join has an entry for in its state, from a savepoint taken now."""
    path = await job.savepoint(f"{directory}/savepoint")
    state = KeyedState()
    state.restore(read_savepoint(path)[1]["tasks"]["j"][0]["state"])
    return sorted(key for key, _ in state.items())


class Crash(Exception):
    """Ends the first part of a checkpointed run."""


async def checkpointed_then_crashed(topology: sl.Topology, directory: str, sent: Sent, holding: int) -> None:
    """Run ``topology``, send ``sent`` (the join then holds ``holding`` records), take a checkpoint in
    ``directory``, and crash: the next run resumes from that checkpoint."""
    try:
        async with sl.start(topology, checkpoint_dir=directory) as job:
            await send_all(job, sent)
            assert held(job) == holding
            await job.checkpoint()
            raise Crash
    except Crash:
        pass


# -- a ts that is no number of seconds ------------------------------------------------------------------------------


@pytest.mark.parametrize("ts", [None, True, math.nan])
@pytest.mark.parametrize("port", [sl.LEFT, sl.RIGHT])
@pytest.mark.parametrize("add", [asof(), interval(0.0, 1.0)], ids=["asof", "interval"])
def test_a_bad_ts_on_either_port_fails_the_job_naming_that_port(add: Add, port: int, ts: Any) -> None:
    """None, a bool or NaN as ts, on the left or the right input: a TaskError naming the join, the port and key."""
    topology = sl.Topology("bad-ts")
    join = add(topology)
    for side in (sl.LEFT, sl.RIGHT):
        record = sl.Record("k", "v", ts if side == port else 1.0)
        join.set_input(topology.add_source(f"s{side}", [record]), in_port=side, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)
    rule = "has no ts" if ts is None else f"has ts {ts!r}"
    with pytest.raises(sl.TaskError, match=rf"^task 'j' instance 0 input port {port}: the record with key 'k' {rule};"):
        sl.run(topology)


# -- asof_join: versions behind the watermark, lefts within grace ---------------------------------------------------


async def test_asof_a_right_behind_the_watermark_drops_only_the_versions_before_the_newest_at_w_minus_grace() -> None:
    """grace=2, W=10: a version at 7 coming after one at 11 drops the one at 1 (7 is the newest at or before 8)
    but keeps itself, so a left at 8 meets it; a version at 8 (8 + 2 = W) retires the one before it at once."""
    async with sl.start(joined(asof(grace=2.0))) as job:
        await send_all(job, [("right", "k", "v0", 1.0), ("right", "k", "v2", 11.0), ("left", "x", "w", 10.0)])
        assert held(job) == 3  # k: v0, v2; x: w waiting (10 is not behind W = 10)
        await send_all(job, [("right", "k", "v1", 7.0)])
        assert held(job) == 3  # v0 went, v1 came
        await send_all(job, [("right", "q", "q0", 0.0), ("right", "q", "q1", 8.0)])
        assert held(job) == 4  # q0 went as q1 came
        await send_all(job, [("left", "k", "l", 8.0)])  # 2 behind W: joined at once with the versions kept
        assert so_far(job) == [sl.Record("k", ("l", "v1"), 8.0)]
        result = await finish(job)
    assert out(result) == [("k", ("l", "v1"), 8.0)]
    assert out(result, "late") == []


async def test_asof_left_a_left_within_grace_of_a_key_never_seen_comes_out_at_once_unmatched() -> None:
    """grace=2, W=10: a left at 9 of a new key is joined on arrival (no versions: None), not held."""
    async with sl.start(joined(asof("left", grace=2.0))) as job:
        await send_all(job, [("left", "x", "w", 10.0), ("right", "y", "r", 10.0), ("left", "new", "n", 9.0)])
        assert so_far(job) == [sl.Record("new", ("n", None), 9.0)]
        assert held(job) == 2  # w and r
        result = await finish(job)
    assert out(result) == [("new", ("n", None), 9.0), ("x", ("w", None), 10.0)]


async def test_asof_a_version_retires_the_one_before_only_once_w_reaches_its_ts_plus_grace_as_summed() -> None:
    """grace=0.7, W=2.9: a version at 2.2 keeps the one before it, as 2.2 + 0.7 (2.9000000000000004 in floats)
    is past W, though 2.9 - 0.7 is not below 2.2."""
    async with sl.start(joined(asof(grace=0.7))) as job:
        await send_all(job, [("left", "x", "w", 2.9), ("right", "y", "r", 2.9)])
        await send_all(job, [("right", "k", "v0", 0.0), ("right", "k", "v1", 2.2)])
        assert held(job) == 4  # w, r, v0, v1
        await finish(job)


async def test_a_key_whose_records_all_went_leaves_the_state_at_the_next_rise() -> None:
    """Once nothing of a key is held, its entry goes at the next rise of the watermark (a savepoint shows it)."""
    joins = {"asof": asof(), "interval": interval(0.0, 0.5)}
    for name, add in joins.items():
        with tempfile.TemporaryDirectory() as directory:
            async with sl.start(joined(add), checkpoint_dir=directory) as job:
                await send_all(job, [("left", "k", "l", 1.0), ("right", "z", "z", 2.0), ("left", "y", "y", 3.0)])
                await send_all(job, [("right", "z", "z2", 4.0)])  # W = 2, then 3: k is done at 2, gone at 3
                assert (name, await keys_held(job, directory)) == (name, ["y", "z"])
                await finish(job)


# -- asof_join: what it holds ---------------------------------------------------------------------------------------


async def test_asof_held_counts_waiting_lefts_and_versions_as_the_watermark_rises() -> None:
    """Lefts held until W passes them, each version until W passes the next one's ts: ``held`` follows."""
    async with sl.start(joined(asof())) as job:
        await job.send("left", "k", "l1", 1.0)
        await job.send("left", "k", "l2", 5.0)
        await job.send("left", "y", "m", 6.5)
        await job.settle()
        assert held(job) == 3
        await send_all(job, [("right", "k", "v0", 0.0)])  # W = 0
        assert held(job) == 4
        await send_all(job, [("right", "k", "v1", 4.0)])  # W = 4: l1 joined, v0 goes
        assert (so_far(job), held(job)) == ([sl.Record("k", ("l1", "v0"), 1.0)], 3)  # l2, m, v1
        await send_all(job, [("right", "k", "v2", 7.0)])  # W = 6.5: l2 joined, v1 stays (until W passes 7)
        assert held(job) == 3  # m, v1, v2
        await send_all(job, [("right", "y", "r", 8.0), ("left", "z", "z", 9.0)])  # W = 8: m joined (nothing), v1 goes
        assert held(job) == 3  # v2, r, z
        assert job.statistics().nodes["j"].held_peak == 5  # l2, m, v1, v2, r and z before W rose to 8
        result = await finish(job)
    assert out(result) == [("k", ("l1", "v0"), 1.0), ("k", ("l2", "v1"), 5.0)]
    assert result.statistics.nodes["j"].held == 0


async def test_asof_a_lone_version_stays_held_as_its_left_records_are_joined() -> None:
    """A key's only version is kept however far the watermark goes: each left joined takes one off ``held``."""
    async with sl.start(joined(asof())) as job:
        await send_all(job, [("right", "k", "v", 0.0), ("left", "k", "a", 1.0), ("left", "k", "b", 2.0)])
        await send_all(job, [("right", "z", "z", 1.5)])  # W = 1.5: a joined
        assert held(job) == 3  # v, b, z
        await send_all(job, [("right", "z", "z2", 3.0)])  # W = 2: b waits (2 is not behind 2)
        assert held(job) == 4  # v, b, z, z2
        await send_all(job, [("left", "k", "c", 4.0)])  # W = 3: b joined
        assert held(job) == 3  # v, z2, c
        result = await finish(job)
    assert out(result) == [("k", ("a", "v"), 1.0), ("k", ("b", "v"), 2.0), ("k", ("c", "v"), 4.0)]


async def test_asof_after_a_restore_held_and_the_versions_retired_are_as_before() -> None:
    """A checkpoint taken with a key holding two versions and no left: the restored join counts what it holds
    and still retires the older version once the watermark passes the newer one's ts."""
    sent: Sent = [("right", "q", "q0", 1.0), ("right", "q", "q1", 5.0), ("right", "k", "k0", 1.0),
                  ("right", "k", "k1", 5.0), ("left", "k", "l", 4.5)]  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        await checkpointed_then_crashed(joined(asof()), directory, sent, 5)
        async with sl.start(joined(asof()), checkpoint_dir=directory) as job:
            await job.settle()
            assert held(job) == 5
            await send_all(job, [("left", "x", "x", 6.0), ("right", "y", "y", 6.0)])  # W = 6: l joined, q0, k0 go
            assert held(job) == 4  # q1, k1, x, y
            result = await finish(job)
    assert out(result) == [("k", ("l", "k0"), 4.5)]


# -- asof_join: keys due together come out in the order they were scheduled ---------------------------------------


async def test_asof_a_new_version_does_not_reorder_keys_whose_lefts_came_in_one_batch() -> None:
    """grace=4: A holds versions at 0 and 8 (the one at 0 retires once W reaches 12); lefts of A and C at 10
    come in one batch, A's first, so at the end A's row comes out before C's."""
    async with sl.start(joined(asof("left", grace=4.0))) as job:
        await send_all(job, [("right", "A", "a0", 0.0), ("right", "A", "a1", 8.0)])
        await job.send("left", "A", "la", 10.0)
        await job.send("left", "C", "lc", 10.0)
        await job.settle()  # W = 8
        result = await finish(job)
    assert out(result) == [("A", ("la", "a1"), 10.0), ("C", ("lc", None), 10.0)]


async def test_asof_a_key_just_joined_is_due_next_at_its_next_left_not_earlier() -> None:
    """grace=4: A's left at 1 is joined at W = 2 with A holding versions at 0 and 8 (the one at 0 retires once
    W reaches 12); then lefts of C and A at 10, C's first: at the end C's row comes out before A's."""
    async with sl.start(joined(asof("left", grace=4.0))) as job:
        await send_all(job, [("left", "A", "la0", 1.0), ("right", "A", "a0", 0.0), ("right", "A", "a1", 8.0)])
        await send_all(job, [("left", "X", "x", 2.0)])  # W = 2: la0 joined
        await send_all(job, [("left", "C", "lc", 10.0), ("left", "A", "la", 10.0)])  # W = 8
        result = await finish(job)
    assert out(result) == [("A", ("la0", "a0"), 1.0), ("X", ("x", None), 2.0), ("C", ("lc", None), 10.0),
                           ("A", ("la", "a1"), 10.0)]  # fmt: skip


@pytest.mark.in_memory_state_only(
    "after a restore, keys due together come in the order the state lists them: the dict's, first written first"
)
async def test_asof_after_a_restore_keys_due_together_keep_their_order() -> None:
    """Restored with A (two versions, 0 and 8, grace 4) and B, each with a left at 10: a rise of the watermark
    before 12 does not wake A early, so A's row comes out before B's as it would have without the restore."""
    with tempfile.TemporaryDirectory() as directory:
        try:
            async with sl.start(joined(asof("left", grace=4.0)), checkpoint_dir=directory) as job:
                await send_all(job, [("left", "A", "la", 10.0), ("left", "B", "lb", 10.0),
                                     ("right", "A", "a0", 0.0), ("right", "A", "a1", 8.0)])  # fmt: skip
                await job.checkpoint()
                raise Crash
        except Crash:
            pass
        async with sl.start(joined(asof("left", grace=4.0)), checkpoint_dir=directory) as job:
            await send_all(job, [("left", "D", "d", 10.0), ("right", "C", "c", 9.0)])  # W = 9
            result = await finish(job)
    assert out(result) == [("A", ("la", "a1"), 10.0), ("B", ("lb", None), 10.0), ("D", ("d", None), 10.0)]


# -- interval_join --------------------------------------------------------------------------------------------------


async def test_interval_an_unpaired_left_comes_out_when_its_interval_closes_though_a_right_is_held_longer() -> None:
    """lower=-2, upper=3: with c (1, closes at 4) and b (5, closes at 7) held for k, W = 5 lets c out unpaired."""
    async with sl.start(joined(interval(-2.0, 3.0, "left"))) as job:
        await send_all(job, [("left", "k", "a", 0.0), ("left", "k", "c", 1.0), ("right", "k", "b", 5.0)])
        await send_all(job, [("left", "x", "x", 3.5)])  # W = 3.5: a closes
        assert so_far(job) == [sl.Record("k", ("a", None), 0.0)]
        await send_all(job, [("left", "y", "y", 5.0)])  # W = 5: c closes, b (until 7) stays
        assert so_far(job) == [sl.Record("k", ("a", None), 0.0), sl.Record("k", ("c", None), 1.0)]
        assert held(job) == 3  # b, x, y
        result = await finish(job)
    assert out(result) == [("k", ("a", None), 0.0), ("k", ("c", None), 1.0), ("x", ("x", None), 3.5),
                           ("y", ("y", None), 5.0)]  # fmt: skip


async def test_interval_keys_closing_together_come_out_in_the_order_they_were_scheduled() -> None:
    """lower=-2, upper=3: b1 (right, 0) closes at 2, a1 (left, 0) at 3; b2 (6) and a2 (5) both at 8. B is
    rescheduled before A at W = 5, so at the end B's record comes out first, as at W = 5."""
    sent: Sent = [("right", "B", "b1", 0.0), ("left", "A", "a1", 0.0), ("right", "B", "b2", 6.0),
                  ("left", "A", "a2", 5.0)]  # fmt: skip
    result = await drive(joined(interval(-2.0, 3.0, "outer")), sent)
    assert out(result) == [("B", (None, "b1"), 0.0), ("A", ("a1", None), 0.0), ("B", (None, "b2"), 6.0),
                           ("A", ("a2", None), 5.0)]  # fmt: skip


async def test_interval_a_left_and_a_right_closing_together_come_out_in_arrival_order() -> None:
    """lower=-2, upper=3: b (right, 6) and a (left, 5) both close at 8; b came first, so it comes out first."""
    result = await drive(joined(interval(-2.0, 3.0, "outer")), [("right", "B", "b", 6.0), ("left", "A", "a", 5.0)])
    assert out(result) == [("B", (None, "b"), 6.0), ("A", ("a", None), 5.0)]


@pytest.mark.in_memory_state_only(
    "after a restore, keys due together come in the order the state lists them: the dict's, first written first"
)
async def test_interval_after_a_restore_held_and_the_order_of_keys_closing_together_are_kept() -> None:
    """lower=-2, upper=3. Restored holding, per key, one record closing at 8 or 10 (B1 and A1 at 8, A2 and B2 at
    10, in that order) and a pair for key P: ``held`` counts them all, and they close in their order, after the
    pair (P, (p, q)), which the join emitted before the checkpoint and the CollectSink's part of it gives back."""
    sent: Sent = [("right", "B1", "b1", 6.0), ("left", "A1", "a1", 5.0), ("left", "P", "p", 6.0),
                  ("right", "P", "q", 6.0), ("left", "A2", "a2", 7.0), ("right", "B2", "b2", 8.0)]  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        await checkpointed_then_crashed(joined(interval(-2.0, 3.0, "outer")), directory, sent, 6)
        async with sl.start(joined(interval(-2.0, 3.0, "outer")), checkpoint_dir=directory) as job:
            await job.settle()
            assert held(job) == 6
            result = await finish(job)
    assert out(result) == [("P", ("p", "q"), 6.0), ("B1", (None, "b1"), 6.0), ("A1", ("a1", None), 5.0),
                           ("A2", ("a2", None), 7.0), ("B2", (None, "b2"), 8.0)]  # fmt: skip


@pytest.mark.parametrize("fn", [None, lambda key, left, right: (left, right)])
def test_interval_a_pair_of_equal_times_carries_the_arriving_records_ts(fn: Any) -> None:
    """ts = max(a.ts, b.ts), and between equal times (5 and 5.0) the arriving record's, with or without fn."""
    topology = sl.Topology("equal-times")
    join = topology.interval_join("j", 0.0, 1.0, fn=fn)
    for side, port in (("left", sl.LEFT), ("right", sl.RIGHT)):
        join.set_input(topology.add_source(side, sl.QueueSource()), in_port=port, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(join)

    async def run() -> list[Any]:
        async with sl.start(topology) as job:
            await job.send("left", "k", "a", 5)
            await job.settle()
            await job.send("right", "k", "b", 5.0)
            for side in ("left", "right"):
                await job.close_source(side)
            result = await job.wait()
        return [(r.value, r.ts, type(r.ts)) for r in result.sink("out")]

    assert asyncio.run(run()) == [(("a", "b"), 5.0, float)]
