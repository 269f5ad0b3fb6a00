"""``run_in``: what running a task's plain ``def execute`` in a thread or a process of the job's pool costs and gains.

The headline: a CPU-bound map (``benchmarks.parallel.burn``, about 20 µs of pure Python per record) at
parallelism 2 with ``run_in="process"`` against the same job with ``run_in="loop"`` (both instances share
the event loop: one core; the baseline), in one ``sl.run``. ``thread_ratio``: the same map in threads
(the GIL lets one run at a time: no gain expected, the cost of the hop shown). ``io_*``: a task that blocks
2 ms per batch (``time.sleep``, a stand-in for a blocking client call) at parallelism 4, in threads against
the loop (threads overlap the waits). ``light_thread_ratio``: a trivial map in a thread against the loop
(the hop's cost per batch, where nothing is gained). ``service_*_p99_ms``: an embedding service's own
coroutine, ticking every millisecond beside the CPU-bound job in ``sl.start``, late by this much at the
99th percentile with the map on the loop, in a thread, in a process. Every run's totals are checked equal.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import streamlet as sl
from benchmarks.common import alternating, latency_ms, median_rate, report
from benchmarks.parallel import KEYS, Totals, burn

IO_BATCHES = 200  # batches of the I/O-bound run


def build(records: int, run_in: str, parallelism: int = 2) -> sl.Topology:
    """numbers -> ``work`` (the CPU-bound map, ``run_in``) -> per-key totals -> a sink."""
    topology = sl.Topology("offload-bench")
    numbers = topology.add_source("numbers", [sl.Record(n % KEYS, n, 0.0) for n in range(records)])
    work = topology.map("work", lambda r: (r.key, burn(r.value)), parallelism=parallelism, run_in=run_in)
    totals = topology.add_task("totals", Totals).set_input(work.set_input(numbers))
    topology.add_sink("out", sl.CollectSink()).set_input(totals)
    return topology


def totals(topology: sl.Topology, **options: Any) -> dict[Any, Any]:
    """One run: its totals per key."""
    return {record.key: record.value for record in sl.run(topology, **options).sink("out")}


class Blocking(sl.Task):
    """Blocks 2 ms per batch, as a synchronous client call would."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        time.sleep(0.002)
        outputs.emit_batch(inputs.get())


def io_bound(run_in: str, batch_size: int = 100) -> sl.Topology:
    topology = sl.Topology("offload-io")
    numbers = topology.add_source("numbers", [sl.Record(n % KEYS, n, 0.0) for n in range(IO_BATCHES * batch_size)])
    calls = topology.add_task("calls", Blocking, parallelism=4, run_in=run_in).set_input(numbers)
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_task("totals", Totals).set_input(calls))
    return topology


def light(records: int, run_in: str) -> sl.Topology:
    topology = sl.Topology("offload-light")
    numbers = topology.add_source("numbers", [sl.Record(n % KEYS, n, 0.0) for n in range(records)])
    plus = topology.map("plus", lambda r: (r.key, r.value + 1), run_in=run_in).set_input(numbers)
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_task("totals", Totals).set_input(plus))
    return topology


def service_lateness(records: int, run_in: str) -> list[float]:
    """Seconds late of each tick of a coroutine asking to wake every millisecond while the job runs."""

    async def main() -> list[float]:
        late: list[float] = []
        async with sl.start(build(records, run_in)) as job:
            finished = asyncio.ensure_future(job.wait())
            while not finished.done():
                asked = time.perf_counter()
                await asyncio.sleep(0.001)
                late.append(time.perf_counter() - asked - 0.001)
            await finished
        return late

    return asyncio.run(main())


def main(records: int, repeats: int) -> dict[str, Any]:
    """Each pair ``repeats`` times, alternating which goes first; medians."""
    cpu = alternating(repeats, {
        "process": lambda: totals(build(records, "process")),
        "loop": lambda: totals(build(records, "loop")),
        "thread": lambda: totals(build(records, "thread")),
    })  # fmt: skip
    expected = cpu["loop"][0][1]
    if any(result != expected for runs in cpu.values() for _, result in runs):
        raise AssertionError("a run's totals differ from the loop's")
    io = alternating(repeats, {
        "thread": lambda: totals(io_bound("thread")), "loop": lambda: totals(io_bound("loop")),
    })  # fmt: skip
    light_records = records * 10
    cheap = alternating(repeats, {
        "thread": lambda: totals(light(light_records, "thread"), batch_size=1000),
        "loop": lambda: totals(light(light_records, "loop"), batch_size=1000),
    })  # fmt: skip
    rate = {name: median_rate(records, [seconds for seconds, _ in runs]) for name, runs in cpu.items()}
    io_rate = {name: median_rate(IO_BATCHES * 100, [s for s, _ in runs]) for name, runs in io.items()}
    light_rate = {name: median_rate(light_records, [s for s, _ in runs]) for name, runs in cheap.items()}
    service = {run_in: latency_ms(service_lateness(records // 2, run_in), f"service_{run_in}_") for run_in in RUN_INS}
    return report(
        "offload",
        rate["process"],
        rate["loop"],
        thread_records_per_s=round(rate["thread"]),
        thread_ratio=round(rate["thread"] / rate["loop"], 3),
        io_thread_records_per_s=round(io_rate["thread"]),
        io_loop_records_per_s=round(io_rate["loop"]),
        io_thread_ratio=round(io_rate["thread"] / io_rate["loop"], 3),
        light_thread_ratio=round(light_rate["thread"] / light_rate["loop"], 3),
        **{key: value for figures in service.values() for key, value in figures.items()},
    )


RUN_INS = ("loop", "thread", "process")
