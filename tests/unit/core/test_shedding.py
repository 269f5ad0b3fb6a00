"""Load shedding at the sources under a QoS: which records are shed, where they go, the replay of held ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.runtime.channel import LocalChannel
from streamlet.core.runtime.shedding import Shedder, split_snapshot


def records(values: range) -> list[tuple[Any, ...]]:
    """Elements (as the runtime carries records) keyed and valued ``value``."""
    return [(value, value, None) for value in values]


def test_records_are_shed_evenly_and_the_share_carries_over_between_batches() -> None:
    shedder = Shedder()
    assert shedder.split(records(range(4))) == (records(range(4)), [])  # ratio 0: nothing shed
    shedder.ratio = 0.25
    kept, shed = shedder.split(records(range(6)))
    assert [r[1] for r in shed] == [3]
    kept, shed = shedder.split(records(range(6, 10)))
    assert [r[1] for r in shed] == [7]  # the credit went on from the last batch: every 4th record
    assert [r[1] for r in kept] == [6, 8, 9]


def test_held_records_ride_in_the_checkpoint() -> None:
    shedder = Shedder(recover=True)
    assert shedder.snapshot(7) == 7  # nothing held: the reader's position alone, as without shedding
    shedder.held.extend(records(range(3)))
    position, held = split_snapshot(shedder.snapshot(7))
    assert (position, held) == (7, records(range(3)))
    assert split_snapshot({"offset": 3}) == ({"offset": 3}, [])  # a reader's own dict is left alone


def shedding_job(qos: sl.QoS) -> sl.Topology:
    topology = sl.Topology("shedding").set_qos(qos)
    source = topology.add_source("in", sl.QueueSource())
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    topology.add_sink("shed", sl.CollectSink()).set_input(source, out_port=sl.SHED)
    return topology


async def run_in_three_phases(qos: sl.QoS) -> tuple[list[int], list[int], int]:
    """0..39 as is, 40..79 shedding half, 80..99 not shedding: (out, shed port, shed count)."""
    async with sl.start(shedding_job(qos), batch_size=10) as job:
        for value in range(100):
            if value == 40:
                await job.settle()
                job.shed(0.5)
            if value == 80:
                await job.settle()
                job.shed(0)
            await job.send("in", value, value)
        await job.close_source("in")
        result = await job.wait()
    statistics = job.statistics()
    return [r.value for r in result.sink("out")], [r.value for r in result.sink("shed")], statistics.shed


async def test_shed_records_go_to_the_shed_port() -> None:
    out, shed, count = await run_in_three_phases(sl.QoS(max_latency=1.0, max_shed_ratio=0.5))
    assert out == [*range(40), *range(40, 80, 2), *range(80, 100)]
    assert shed == list(range(41, 80, 2))
    assert count == 20


async def test_held_records_are_replayed_before_newer_ones_when_order_is_kept() -> None:
    out, shed, count = await run_in_three_phases(
        sl.QoS(max_latency=1.0, max_shed_ratio=0.5, recover=True, preserve_order=True)
    )
    assert out == [*range(40), *range(40, 80, 2), *range(41, 80, 2), *range(80, 100)]
    assert (shed, count) == ([], 20)


async def test_held_records_are_mixed_in_when_order_is_not_kept() -> None:
    out, shed, count = await run_in_three_phases(sl.QoS(max_latency=1.0, max_shed_ratio=0.5, recover=True))
    assert sorted(out) == list(range(100))  # every record once
    assert out[:60] == [*range(40), *range(40, 80, 2)]
    assert out.index(41) > out.index(80)  # the replay came with newer records
    assert [value for value in out if value in range(41, 80, 2)] == list(range(41, 80, 2))  # in their order
    assert (shed, count) == ([], 20)


@pytest.mark.parametrize("ending", ["the source ends", "the job stops it"])
async def test_records_still_held_when_the_source_ends_or_stops_go_out(ending: str) -> None:
    qos = sl.QoS(max_latency=1.0, max_shed_ratio=0.5, recover=True, preserve_order=True)
    async with sl.start(shedding_job(qos), batch_size=10) as job:
        job.shed(0.5)
        for value in range(20):
            await job.send("in", value, value)
        if ending == "the source ends":
            await job.close_source("in")
        else:
            await job.settle()
            await job.stop()
        result = await job.wait()
    assert [r.value for r in result.sink("out")] == [*range(0, 20, 2), *range(1, 20, 2)]


async def test_shedding_needs_a_qos_and_stays_within_it() -> None:
    topology = sl.Topology("no-qos")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", sl.QueueSource()))
    async with sl.start(topology) as job:
        with pytest.raises(sl.JobError, match=r"job 'no-qos' has no QoS: topology.set_qos\(sl.QoS\(...\)\) lets it"):
            job.shed(0.1)
        await job.close_source("in")
    async with sl.start(shedding_job(sl.QoS(max_latency=1.0, max_shed_ratio=0.3))) as job:
        with pytest.raises(sl.JobError, match=r"shed ratio must be within 0..0.3 \(the QoS's max_shed_ratio\), not"):
            job.shed(0.5)
        await job.close_source("in")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_latency": 0}, "QoS max_latency must be > 0 seconds, got 0"),
        ({"max_latency": 1, "max_shed_ratio": 1.5}, "QoS max_shed_ratio must be within 0..1, got 1.5"),
        ({"max_latency": 1, "preserve_order": True}, "QoS preserve_order orders the replay of shed records"),
    ],
)
def test_a_bad_qos_is_refused(options: dict[str, float], message: str) -> None:
    with pytest.raises(sl.TopologyError, match=message):
        sl.QoS(**options)  # type: ignore[arg-type]


def test_set_qos_takes_a_qos() -> None:
    with pytest.raises(sl.TopologyError, match=r"set_qos takes a streamlet\.QoS, got 1\.0"):
        sl.Topology("t").set_qos(1.0)  # type: ignore[arg-type]


def test_the_shed_policy_needs_a_qos() -> None:
    topology = sl.Topology("plain")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", [1]))
    with pytest.raises(sl.JobError, match="the shed policy keeps a QoS: topology 'plain' has none"):
        sl.run(topology, adapt=sl.AdaptSettings(frozenset({"shed"})))


class Counted(sl.Source):
    """Records 0..39 in batches of 10; it keeps the positions its reader is told were committed."""

    def __init__(self) -> None:
        self.committed: list[object] = []

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return _Counted(self)


class _Counted(sl.SourceReader):
    def __init__(self, source: Counted) -> None:
        self.source, self.sent = source, 0

    async def read(self, max_records: int) -> list[sl.Record] | None:
        batch = [sl.Record(n, n, None) for n in range(self.sent, self.sent + 10)]
        self.sent += 10
        return batch if self.sent <= 40 else None

    def position(self) -> int:
        return self.sent

    def checkpoint_complete(self, epoch: int, position: object) -> None:
        self.source.committed.append(position)


async def test_a_reader_is_told_its_own_position_even_while_records_are_held(tmp_path: Path) -> None:
    source = Counted()
    topology = sl.Topology("held").set_qos(sl.QoS(max_latency=1.0, max_shed_ratio=0.5, recover=True))
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", source))
    async with sl.start(topology, batch_size=10, checkpoint_dir=tmp_path) as job:
        job.shed(0.5)
        result = await job.wait()
    assert source.committed
    assert all(isinstance(position, int) for position in source.committed)
    assert sorted(r.value for r in result.sink("out")) == list(range(40))


async def test_a_share_set_before_the_job_runs_applies() -> None:
    topology = sl.Topology("early").set_qos(sl.QoS(max_latency=1.0, max_shed_ratio=0.5))
    source = topology.add_source("in", list(range(20)))
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    topology.add_sink("shed", sl.CollectSink()).set_input(source, out_port=sl.SHED)
    job = sl.Job(topology, channel_factory=LocalChannel, batch_size=10)
    job.shed(0.5)  # as a worker does when the part exists but its plan is not built yet
    result = await job.run()
    assert [r.value for r in result.sink("shed")] == list(range(1, 20, 2))


def watched_job(qos: sl.QoS) -> tuple[sl.Topology, list[int], list[int]]:
    """in (sent by the test) -> out, and its shed records -> shed; both seen as they arrive."""
    out: list[int] = []
    shed: list[int] = []
    topology = sl.Topology("watched").set_qos(qos)
    source = topology.add_source("in", sl.QueueSource())
    topology.add_sink("out", sl.CallbackSink(lambda record: out.append(record.value))).set_input(source)
    topology.add_sink("shed", sl.CallbackSink(lambda record: shed.append(record.value))).set_input(
        source, out_port=sl.SHED
    )
    return topology, out, shed


async def test_a_quiet_source_replays_what_it_held_without_waiting_for_new_input() -> None:
    topology, out, _ = watched_job(sl.QoS(max_latency=1.0, max_shed_ratio=0.5, recover=True))
    async with sl.start(topology, batch_size=10) as job:
        job.shed(0.5)
        for value in range(20):
            await job.send("in", value, value)
        await job.settle()
        job.shed(0)
        await job.settle()  # no new input: the replay goes on by itself
        delivered = sorted(out)
        await job.close_source("in")
    assert delivered == list(range(20))


async def test_at_a_ratio_of_one_shed_records_reach_the_shed_port_while_the_job_runs() -> None:
    topology, out, shed = watched_job(sl.QoS(max_latency=1.0, max_shed_ratio=1.0))
    async with sl.start(topology, batch_size=10) as job:
        job.shed(1.0)
        for value in range(30):
            await job.send("in", value, value)
        await job.settle()
        seen = list(shed)
        await job.close_source("in")
    assert (seen, out) == (list(range(30)), [])
