"""Queue-state CPU scheduling: batches per turn by queue state, and jobs run under each policy."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import streamlet as sl
from streamlet.adaptation.cpu import equal_turns, queue_state_turns
from streamlet.core.runtime.channel import LocalChannel


@pytest.mark.parametrize(("fill", "turns"), [(0.0, 1), (0.49, 1), (0.5, 2), (0.79, 2), (0.8, 8), (1.0, 8)])
def test_a_fuller_queue_gets_more_batches_per_turn(fill: float, turns: int) -> None:
    assert queue_state_turns(fill) == turns
    assert equal_turns(fill) == 1


def two_chains() -> sl.Topology:
    """A heavy and a light chain side by side, each counting words into its own sink."""
    topology = sl.Topology("shared-loop")
    for name, words in (("heavy", 40), ("light", 5)):
        source = topology.add_source(f"{name}_in", [(f"w{n % words}", 1) for n in range(5_000)])
        count = topology.reduce(name, lambda total, one: total + one).set_input(source, partitioning=sl.SAME_KEY)
        topology.add_sink(f"{name}_out", sl.CollectSink()).set_input(count)
    return topology


@pytest.mark.parametrize("scheduling", ["queue-state", "turns", None])
def test_jobs_give_the_same_results_under_every_scheduling(scheduling: str | None) -> None:
    result = sl.run(two_chains(), batch_size=50, channel_capacity=4, cpu_scheduling=scheduling)
    for name, words in (("heavy", 40), ("light", 5)):
        finals = {record.key: record.value for record in result.sink(f"{name}_out")}
        assert finals == dict(Counter(f"w{n % words}" for n in range(5_000)))


def test_an_unknown_scheduling_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(sl.JobError, match=r"cpu_scheduling must be one of \['queue-state', 'turns'\] or None"):
        sl.run(two_chains(), cpu_scheduling="fair")


def batch_runs(order: list[str], batch: int) -> dict[str, int]:
    """The longest run of consecutive batches each task processed, from the order its records were seen."""
    longest: dict[str, int] = {}
    run_task, run = "", 0
    for name in order:
        run = run + 1 if name == run_task else 1
        run_task = name
        longest[name] = max(longest.get(name, 0), run)
    return {name: records // batch for name, records in longest.items()}


def interleaved(cpu_turns: object) -> dict[str, int]:
    """Two maps with full queues logging each record they see; the longest runs of batches each got."""
    order: list[str] = []
    topology = sl.Topology("turns")
    for name in ("a", "b"):
        source = topology.add_source(f"{name}_in", list(range(400)))
        seen = topology.map(name, lambda record, name=name: (order.append(name), (record.key, record.value))[1])
        seen.set_input(source)
        topology.add_sink(f"{name}_out", sl.CollectSink()).set_input(seen)

    async def run() -> None:
        options = {"batch_size": 10, "channel_capacity": 10, "cpu_turns": cpu_turns}
        await sl.Job(topology, channel_factory=LocalChannel, **options).run()  # type: ignore[arg-type]

    asyncio.run(run())
    assert order.count("a") == order.count("b") == 400
    return batch_runs(order, 10)


def test_each_instance_takes_as_many_batches_a_turn_as_the_policy_gives() -> None:
    assert interleaved(equal_turns) == {"a": 1, "b": 1}  # both always have input: they alternate batch by batch
    assert interleaved(lambda fill: 3) == {"a": 3, "b": 3}


def test_a_red_queue_takes_eight_batches_a_turn() -> None:
    # the sources fill both queues to the brim before either map runs: RED, so eight batches a turn
    assert interleaved(queue_state_turns) == {"a": 8, "b": 8}
