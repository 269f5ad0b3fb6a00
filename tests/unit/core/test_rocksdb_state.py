"""Keyed state in RocksDB (``sl.RocksDBState``): the store itself (a write-back cache of decoded values over the
database, checkpoints that either backend restores, a failed call taken back), and operators giving the same
answers on it as on the in-memory dict: user state, reduce, each join, an error policy, a checkpoint and restore,
a live rescale."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.model.encoding import unpackb
from streamlet.core.model.segments import segment_of
from streamlet.core.state.changelog import changelog, pack_chunk
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.rocks_keyed import RocksKeyedState
from streamlet.core.state.rocks_windows import WindowStore
from tests.support import join_jobs as jj


@pytest.fixture
def store(tmp_path: Path) -> Any:
    backend = sl.RocksDBState(tmp_path / "rocks", cache_entries=3)
    yield backend.open("job", "count", 0, 128)
    backend.close()


def test_values_changed_in_place_persist_past_the_cache_and_come_back_with_their_types(store: RocksKeyedState) -> None:
    """A list read and appended to, then pushed out of the 3-entry cache by other keys, is written back whole;
    tuple keys and values, big ints and bytes keep their types."""
    store.put(("user", 1), [1])
    store.get(("user", 1)).append(2)
    for n in range(10):
        store.put(n, (n, 2**70 + n, b"x"))
    assert len(store.values.cache) == 3
    assert store.get(("user", 1)) == [1, 2]
    assert store.get(7) == (7, 2**70 + 7, b"x")
    store.delete(3)
    store.delete("never there")
    assert store.get(3, "gone") == "gone"
    assert sorted(map(repr, (key for key, _ in store.items()))) == sorted(
        map(repr, [("user", 1), *(n for n in range(10) if n != 3)])
    )
    assert len(store) == 10


def test_a_checkpoint_restores_on_either_backend_and_regroups_by_key(store: RocksKeyedState) -> None:
    for n in range(20):
        store.put(f"k{n}", {"n": n, "seen": [n, n + 1]})
    snapshot = store.checkpoint()
    in_memory = KeyedState()
    in_memory.restore(snapshot)
    assert in_memory.values == {f"k{n}": {"n": n, "seen": [n, n + 1]} for n in range(20)}
    in_memory.put("extra", 1)
    store.put("dropped", 2)
    store.restore(in_memory.checkpoint())
    assert dict(store.items()) == {**{f"k{n}": {"n": n, "seen": [n, n + 1]} for n in range(20)}, "extra": 1}
    regrouped = KeyedState()
    regrouped.restore(KeyedState.merge(KeyedState.partition(snapshot, 3)))  # split and joined by key as ever
    assert regrouped.values == {f"k{n}": {"n": n, "seen": [n, n + 1]} for n in range(20)}


def test_keys_python_holds_equal_are_one_key_as_in_a_dict(store: RocksKeyedState) -> None:
    """1, 1.0 and True (also inside tuples) are one key, cached or read back from the database."""
    store.put(1, "int")
    store.put(1.0, "float")
    store.put((True, 2.0), "tuple")
    for n in range(10):  # push both out of the 3-entry cache
        store.put(f"filler{n}", n)
    assert (store.get(True), store.get(1), store.get((1, 2))) == ("float", "float", "tuple")
    store.delete(1.0)
    assert store.get(1, "gone") == "gone"
    assert dict(store.items()) == {(1, 2): "tuple", **{f"filler{n}": n for n in range(10)}}


def test_a_failed_call_is_taken_back_whole(store: RocksKeyedState) -> None:
    """What a call changed (in place, put, delete, a new key) is as before once taken back, cached or not."""
    values = store.values
    store.put("a", [1])
    store.put("b", 5)
    values.before = {}
    store.get("a").append(2)
    store.put("b", 6)
    store.put("new", 1)
    for n in range(10):  # push the changed values out to the database
        store.put(f"filler{n}", n)
    store.delete("b")
    values.take_back()
    assert (store.get("a"), store.get("b"), store.get("new", "absent"), store.get("filler0", "absent")) == (
        [1], 5, "absent", "absent",
    )  # fmt: skip


class CountWords(sl.Task):
    def execute(self, inputs: Any, outputs: Any) -> None:
        for record in inputs.get():
            if record.value == "poison":
                self.state.put("poisoned", True)  # taken back with the failed call
                raise ValueError("poison")
            self.state.put(record.key, self.state.get(record.key, 0) + 1)

    def finish(self, outputs: Any) -> None:
        outputs.emit_all(self.state.items())


WORDS = [f"w{(i * 7919) % 97}" for i in range(5000)]


def counting(words: list[str], on_error: str = "fail") -> sl.Topology:
    topology = sl.Topology("count")
    source = topology.add_source("words", [sl.Record(w, "poison" if w == "w13" else 1, 0.0) for w in words])
    count = topology.add_task("count", CountWords, parallelism=2, on_error=on_error)  # type: ignore[arg-type]
    count.set_input(source, partitioning=sl.SAME_KEY)
    total = topology.reduce("total", lambda a, b: a + b, parallelism=2)
    total.set_input(topology.map("ones", lambda r: (r.key, 1)).set_input(source), partitioning=sl.SAME_KEY)
    topology.add_sink("counts", sl.CollectSink()).set_input(count)
    topology.add_sink("totals", sl.CollectSink()).set_input(total)
    return topology


@pytest.mark.parametrize("cache_entries", [4, 4096])
def test_user_state_reduce_and_skip_give_the_in_memory_answers(tmp_path: Path, cache_entries: int) -> None:
    """A keyed count (under skip: the poison word's calls are taken back) and a reduce, with a cache far smaller
    than the 97 keys and with one holding them all."""
    backend = sl.RocksDBState(tmp_path / "rocks", cache_entries=cache_entries)
    on_rocks = sl.run(counting(WORDS, "skip"), state_backend=backend)
    in_memory = sl.run(counting(WORDS, "skip"))
    expected = Counter(w for w in WORDS if w != "w13")
    assert dict((r.key, r.value) for r in on_rocks.sink("counts")) == dict(expected)
    assert sorted((r.key, r.value) for r in on_rocks.sink("counts")) == sorted(
        (r.key, r.value) for r in in_memory.sink("counts")
    )
    finals: dict[str, int] = {}
    for record in on_rocks.sink("totals"):  # running totals, once per batch (batches differ run to run)
        finals[record.key] = max(finals.get(record.key, 0), record.value)
    assert finals == dict(Counter(WORDS))
    assert len(on_rocks.dead_letters) == WORDS.count("w13")
    assert sorted(backend.opened) == [("local.count", node, i) for node in ("count", "total") for i in (0, 1)]
    assert not any((tmp_path / "rocks").rglob("CURRENT"))  # every database closed and removed at the end


@pytest.mark.parametrize(("kind", "how"), [("interval", "outer"), ("asof", "left"), ("window", "outer")])
def test_each_join_gives_the_reference_on_rocksdb(tmp_path: Path, kind: str, how: str) -> None:
    backend = sl.RocksDBState(tmp_path, cache_entries=8)
    result = sl.run(jj.BUILDERS[kind](how), state_backend=backend)
    assert jj.outcome(result.sink("out")) == jj.EXPECTED[kind](how)
    # a window join holds its records in its windows, which stay in memory for now (docs/state-backends.md)
    assert [node for _, node, _ in backend.opened] == ([] if kind == "window" else ["join", "join"])


def test_the_table_join_gives_each_left_record_once_on_rocksdb(tmp_path: Path) -> None:
    jj.check_table(sl.run(jj.table_topology(), state_backend=sl.RocksDBState(tmp_path, cache_entries=8)).sink("out"))


class Crash(Exception):
    """Stops a job the hard way."""


async def first_half_then_crash(checkpoints: Path, backend: sl.RocksDBState) -> None:
    async with sl.start(
        jj.queue_topology("interval", "outer"), checkpoint_dir=checkpoints, state_backend=backend
    ) as job:
        await jj.feed(job, "interval", 2000, 0.0, 0.5)
        await job.settle()
        await job.checkpoint()
        raise Crash


async def test_a_restore_and_a_live_rescale_on_rocksdb_give_the_reference(tmp_path: Path) -> None:
    """Half the records, a checkpoint, a crash; the restored job (RocksDB again, its databases made anew from the
    checkpoint) rescales 2 -> 3 and gets the other half: the reference, once."""
    with pytest.raises(Crash):
        await first_half_then_crash(tmp_path / "checkpoints", sl.RocksDBState(tmp_path / "first", cache_entries=8))
    backend = sl.RocksDBState(tmp_path / "second", cache_entries=8)
    async with sl.start(
        jj.queue_topology("interval", "outer"), checkpoint_dir=tmp_path / "checkpoints", state_backend=backend
    ) as job:
        await jj.feed(job, "interval", 2000, 0.5, 0.75)
        await job.rescale("join", 3)
        await jj.feed(job, "interval", 2000, 0.75, 1.0)
        for side in ("left", "right"):
            await job.close_source(side)
        result = await job.wait()
    assert jj.outcome(result.sink("out")) == jj.EXPECTED["interval"]("outer")


def test_a_task_can_choose_rocksdb_alone_with_a_ttl_and_bad_backends_are_refused(tmp_path: Path) -> None:
    """A task's own backend, with state_ttl: the counts of words whose last write is younger than 5 s of the
    job clock (every word is, in a run this short), in a RocksDB state with its write times beside it."""
    backend = sl.RocksDBState(tmp_path, cache_entries=4)
    topology = sl.Topology("t")
    source = topology.add_source("in", [sl.Record(word, 1, 0.0) for word in ["a", "b", "a", "c", "a", "b", "d"]])
    count = topology.add_task("c", CountWords, state_ttl=5.0, state_backend=backend).set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    result = sl.run(topology)
    assert sorted((r.key, r.value) for r in result.sink("out")) == [("a", 3), ("b", 2), ("c", 1), ("d", 1)]
    assert backend.opened == [("local.t", "c", 0)]
    with pytest.raises(sl.TopologyError, match=r"task 'c': state_backend must be a state backend"):
        topology.add_task("c", CountWords, state_backend="rocksdb")  # type: ignore[arg-type]
    with pytest.raises(sl.StreamletError, match=r"cache_mb must be a whole number of MB >= 1, got 0"):
        sl.RocksDBState(tmp_path, cache_mb=0)


FORKED_RUNS = """
import sys
import streamlet as sl

class Count(sl.Task):
    def execute(self, inputs, outputs):
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + 1)

    def finish(self, outputs):
        outputs.emit_all(sorted(self.state.items()))
        outputs.emit("state", type(self.state).__name__)

def counted(processes, folder):
    topology = sl.Topology("forked")
    source = topology.add_source("in", [(f"k{n % 3}", n) for n in range(30)])
    node = topology.add_task("count", Count, parallelism=2).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    result = sl.run(topology, processes=processes, state_backend=sl.RocksDBState(folder, cache_entries=2))
    return sorted((record.key, record.value) for record in result.sink("out"))

print(counted(2, sys.argv[1] + "/first"))
print(counted(1, sys.argv[1] + "/second"))
try:
    counted(2, sys.argv[1] + "/third")
except sl.JobError as exc:
    print("refused:", exc)
"""


def test_processes_run_rocksdb_state_in_each_child_and_refuse_to_fork_a_process_that_ran_it(tmp_path: Path) -> None:
    """processes=2 keeps each child's instances in RocksDB (the job's backend reaches every process); once the
    program has run RocksDB itself, a fork would leave the children without RocksDB's background threads (they
    hang at their first flush), so the job is refused before anything starts, saying why."""
    program = tmp_path / "forked.py"
    program.write_text(FORKED_RUNS)
    done = subprocess.run(
        [sys.executable, str(program), str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    )
    counts = "[('k0', 10), ('k1', 10), ('k2', 10), ('state', 'RocksKeyedState'), ('state', 'RocksKeyedState')]"
    assert done.stdout.splitlines() == [
        counts,
        counts,
        "refused: processes=2 forks worker processes, and this process has run RocksDB state already: RocksDB's "
        "background threads do not survive a fork, so the children would hang. Run this job in a program of its "
        "own (or before any job of this program keeps state in RocksDB)",
    ]


async def test_a_join_scaled_in_on_rocksdb_counts_each_held_record_once(tmp_path: Path) -> None:
    """2 -> 1 instances of an as-of join holding one left record: the retiring instance hands it over and holds
    nothing after (it reported the record as still held, so the job counted it twice)."""
    topology = sl.Topology("held")
    lefts, rights = topology.add_source("left", sl.QueueSource()), topology.add_source("right", sl.QueueSource())
    joined = topology.asof_join("j", how="left", parallelism=2)
    joined.set_input(lefts, in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    joined.set_input(rights, in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    async with sl.start(topology, state_backend=sl.RocksDBState(tmp_path, cache_entries=2)) as job:
        await job.send("left", "d", "l0", ts=0)
        await job.settle()
        held_before = job.statistics().nodes["j"].held
        await job.rescale("j", 1)
        await job.settle()
        held_after = job.statistics().nodes["j"].held
        for side in ("left", "right"):
            await job.close_source(side)
        result = await job.wait()
    assert (held_before, held_after) == (1, 1)
    assert [(record.key, record.value) for record in result.sink("out")] == [("d", ("l0", None))]


class RemindEachKey(sl.Task):
    """A timer per key at its record's ts + 10; on_timer emits the key and when, and says where timers live."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            self.timers.at(record.key, record.ts + 10)

    def on_timer(self, key: Any, when: float, time: str, outputs: sl.Outputs) -> None:
        outputs.emit(key, (when, type(self.timers).__name__))


def test_a_rocksdb_job_keeps_its_timers_in_rocksdb_and_fires_them_in_order(tmp_path: Path) -> None:
    """5 000 keys, each with a timer: on RocksDB they fire as in memory (as the watermark passes them, by time,
    then in the order set), each once."""
    records = [sl.Record(f"k{n}", n, float(n % 50)) for n in range(5000)]

    def fired(backend: sl.RocksDBState | None) -> list[tuple[Any, Any]]:
        topology = sl.Topology("reminders")
        source = topology.add_source("in", records)
        node = topology.add_task("remind", RemindEachKey).set_input(source, partitioning=sl.SAME_KEY)
        topology.add_sink("out", sl.CollectSink()).set_input(node)
        return [(record.key, record.value) for record in sl.run(topology, state_backend=backend).sink("out")]

    in_memory, on_rocksdb = fired(None), fired(sl.RocksDBState(tmp_path, cache_entries=8))
    times = [(key, when) for key, (when, _) in on_rocksdb]
    assert times == [(key, when) for key, (when, _) in in_memory]  # the same firings, in the same order
    assert sorted(times) == sorted((record.key, record.ts + 10) for record in records)
    assert {kind for _, (_, kind) in in_memory} == {"Timers"}
    assert {kind for _, (_, kind) in on_rocksdb} == {"RocksTimers"}


def test_segments_handed_over_by_range_leave_exactly_the_kept_keys(tmp_path: Path) -> None:
    """Segments 0-63 stay, 64-95 go to instance 1, 96-127 to 2: each new owner gets exactly its segments' keys
    as stored, the database keeps exactly the others (a cached value of a moved key is not written back), and
    the importers' databases take them in beside their own."""
    backend = sl.RocksDBState(tmp_path, cache_entries=50)
    exporter = backend.open("job", "count", 0, 128)
    keys = [f"user-{n}" for n in range(2000)]
    for n, key in enumerate(keys):
        exporter.values[key] = n
    exporter.checkpoint_increment()  # a chain: the hand-over must start a new one
    owners = [0] * 64 + [1] * 32 + [2] * 32
    moved = exporter.hand_over_segments(owners, keeper=0)
    owner_of = {key: owners[segment_of(key, 128)] for key in keys}
    assert sorted(moved) == [1, 2]
    for owner in (1, 2):
        got = {exporter.values.key_of(raw): unpackb(packed) for raw, packed in moved[owner]}
        assert got == {key: n for n, key in enumerate(keys) if owner_of[key] == owner}
    assert dict(exporter.items()) == {key: n for n, key in enumerate(keys) if owner_of[key] == 0}
    assert len(exporter.checkpoint_increment().chain) == 1  # a full chunk, a new chain (else 2: an increment)
    importer = backend.open("job", "count", 1, 128)
    importer.values["user-own"] = -1
    importer.take_in(changelog([pack_chunk(moved[1])], 128))
    expected = {key: n for n, key in enumerate(keys) if owner_of[key] == 1}
    assert dict(importer.items()) == {**expected, "user-own": -1}
    backend.close()


async def test_a_live_rescale_of_rocksdb_state_moves_segments_by_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 -> 3 -> 1 instances of a RocksDB count: every exporter hands its segments over by range (none by a
    split snapshot), and every key's count is exact."""
    handed: list[int] = []
    by_range = RocksKeyedState.hand_over_segments

    def counted(state: RocksKeyedState, owners: Any, keeper: int) -> Any:
        handed.append(keeper)
        return by_range(state, owners, keeper)

    monkeypatch.setattr(RocksKeyedState, "hand_over_segments", counted)
    topology = sl.Topology("by-range")
    source = topology.add_source("in", sl.QueueSource())
    counts = topology.add_task("count", CountWords, parallelism=2).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(counts)
    sent: Counter[str] = Counter()
    async with sl.start(topology, state_backend=sl.RocksDBState(tmp_path, cache_entries=4)) as job:
        for rescale_to in (3, 1, None):
            for n in range(300):
                key = f"k{n % 37}"
                await job.send("in", key, 1)
                sent[key] += 1
            await job.settle()
            if rescale_to is not None:
                await job.rescale("count", rescale_to)
        await job.close_source("in")
        result = await job.wait()
    assert sorted(handed) == [0, 1, 1, 2]  # 2 -> 3: both lose segments; 3 -> 1: 1 and 2 retire, 0 keeps its own
    assert {record.key: record.value for record in result.sink("out")} == dict(sent)


def scattered(count: int, seed: int, disorder: float = 2.0) -> list[sl.Record]:
    """``count`` records over 200 keys, times rising with up to ``disorder`` seconds of disorder."""
    chooser, now, records = random.Random(seed), 0.0, []
    for _ in range(count):
        now += chooser.random() * 0.05
        ts = round(now - chooser.random() * disorder, 3)
        records.append(sl.Record(f"k{chooser.randrange(200)}", chooser.randrange(10), ts))
    return records


def window_sums(size: float, slide: float | None, lateness: float, how: Any, data: Any = None) -> sl.Topology:
    """A window_reduce of 2 instances over ``data`` (default: a queue)."""
    topology = sl.Topology("windows")
    source = topology.add_source("in", sl.QueueSource() if data is None else data)
    window = sl.TimeWindow(size, slide=slide, allowed_lateness=lateness, time="event")
    sums = topology.window_reduce("sums", how, window, parallelism=2)
    sums.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    return topology


def results(records: list[sl.Record]) -> Counter[tuple[Any, Any, Any]]:
    return Counter((record.key, record.value, record.ts) for record in records)


async def windowed_run(
    topology: sl.Topology, records: list[sl.Record], backend: sl.RocksDBState | None, rescale_at: int | None = None
) -> Counter[tuple[Any, Any, Any]]:
    """The results of ``records`` sent live (a live rescale 2 -> 3 -> 1 of the windows after ``rescale_at``)."""
    async with sl.start(topology, state_backend=backend) as job:
        for index, record in enumerate(records):
            await job.send("in", record.key, record.value, ts=record.ts)
            if index == rescale_at:
                await job.rescale("sums", 3)
                await job.rescale("sums", 1)
        await job.close_source("in")
        result = await job.wait()
    return results(result.sink("out"))


def windows_opened(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets an entry each time a window opens in RocksDB from now on."""
    opened: list[int] = []
    made_by = WindowStore.folded

    def counted(store: WindowStore) -> Any:
        opened.append(1)
        return made_by(store)

    monkeypatch.setattr(WindowStore, "folded", counted)
    return opened


@pytest.mark.parametrize(
    ("size", "slide", "lateness", "how"),
    [(1.0, None, 0.0, "sum"), (2.0, 0.5, 0.0, "count"), (1.0, None, 1.0, "max"), (1.5, 0.5, 0.5, "sum")],
)
def test_a_window_reduce_on_rocksdb_gives_what_it_gives_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: float, slide: float | None, lateness: float, how: str
) -> None:
    """Tumbling and sliding event-time windows over records up to 2 s out of order, with and without allowed
    lateness, their open windows' values in RocksDB (a cache of 8 values per window): the results in memory."""
    opened = windows_opened(monkeypatch)
    topology = window_sums(size, slide, lateness, how, scattered(3000, seed=7))
    in_memory = results(sl.run(topology).sink("out"))
    on_rocksdb = results(sl.run(topology, state_backend=sl.RocksDBState(tmp_path, cache_entries=8)).sink("out"))
    assert opened  # the open windows were in RocksDB
    assert on_rocksdb == in_memory
    assert sum(in_memory.values()) > 2000


async def test_a_live_rescale_of_windows_on_rocksdb_changes_no_result(tmp_path: Path) -> None:
    """Sliding windows of sums over in-order records, a live rescale 2 -> 3 -> 1 mid-stream (the open windows
    split by key and written into the new instances' databases): the results of a run in memory."""
    records = scattered(2000, seed=5, disorder=0.0)
    topology = window_sums(1.5, 0.5, 0.0, "sum")
    in_memory = await windowed_run(topology, records, None)
    rescaled = await windowed_run(topology, records, sl.RocksDBState(tmp_path, cache_entries=8), rescale_at=1000)
    assert rescaled == in_memory
    assert sum(in_memory.values()) > 2000


async def sent_checkpointed_and_crashed(
    topology: sl.Topology, records: list[sl.Record], checkpoints: Path, databases: Path
) -> None:
    """``records`` into a job on RocksDB, a checkpoint, then a crash."""
    backend = sl.RocksDBState(databases, cache_entries=8)
    async with sl.start(topology, checkpoint_dir=checkpoints, state_backend=backend) as job:
        for record in records:
            await job.send("in", record.key, record.value, ts=record.ts)
        await job.settle()
        await job.checkpoint()
        raise Crash


async def resumed_after_half(
    topology: sl.Topology, records: list[sl.Record], tmp_path: Path, opened: list[int]
) -> Counter[tuple[Any, Any, Any]]:
    """Half of ``records``, a checkpoint, a crash; then the rest into the job resumed on RocksDB from that
    checkpoint (the sink's results from before it kept by the checkpoint): what it gives. ``opened`` (the
    windows or session stores opened in RocksDB) is not empty before the resumed job takes any record."""
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(Crash):
        await sent_checkpointed_and_crashed(topology, records[:1000], checkpoints, tmp_path / "first")
    opened.clear()
    async with sl.start(
        topology, checkpoint_dir=checkpoints, state_backend=sl.RocksDBState(tmp_path / "second", cache_entries=8)
    ) as job:
        assert opened, "the restored windows are not in RocksDB"  # before any record: the restore's
        for record in records[1000:]:
            await job.send("in", record.key, record.value, ts=record.ts)
        await job.close_source("in")
        result = await job.wait()
    return results(result.sink("out"))


async def test_open_windows_on_rocksdb_come_back_from_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sliding windows resumed from a checkpoint (their open windows written back into RocksDB): what one run
    in memory gives."""
    records = scattered(2000, seed=3, disorder=0.0)
    topology = window_sums(1.0, 0.5, 0.0, "sum")
    whole = await windowed_run(topology, records, None)
    assert await resumed_after_half(topology, records, tmp_path, windows_opened(monkeypatch)) == whole


def session_sums(gap: float, lateness: float, how: Any, data: Any = None) -> sl.Topology:
    """A window_reduce over event-time sessions, 2 instances, over ``data`` (default: a queue)."""
    topology = sl.Topology("sessions")
    source = topology.add_source("in", sl.QueueSource() if data is None else data)
    window = sl.SessionWindow(gap, allowed_lateness=lateness, time="event")
    sums = topology.window_reduce("sums", how, window, parallelism=2)
    sums.set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(sums)
    return topology


def sessions_opened(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets an entry each time an instance opens a RocksDB session store from now on."""
    opened: list[int] = []
    made_by = sl.RocksDBState.open_sessions

    def counted(backend: sl.RocksDBState, *args: Any) -> Any:
        opened.append(1)
        return made_by(backend, *args)

    monkeypatch.setattr(sl.RocksDBState, "open_sessions", counted)
    return opened


@pytest.mark.parametrize(("gap", "lateness", "how"), [(4.0, 0.0, "sum"), (2.0, 1.0, "count"), (6.0, 3.0, "max")])
def test_session_windows_on_rocksdb_give_what_they_give_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gap: float, lateness: float, how: str
) -> None:
    """Event-time sessions over records up to 2 s out of order (sessions that merge, fire, take late records
    within the lateness and expire), their chains and agendas in RocksDB with a cache of 8 chains: the results
    in memory."""
    opened = sessions_opened(monkeypatch)
    topology = session_sums(gap, lateness, how, scattered(3000, seed=11))
    in_memory = results(sl.run(topology).sink("out"))
    on_rocksdb = results(sl.run(topology, state_backend=sl.RocksDBState(tmp_path, cache_entries=8)).sink("out"))
    assert len(opened) == 2  # both instances' sessions were in RocksDB
    assert on_rocksdb == in_memory
    assert sum(in_memory.values()) > 500


async def test_a_live_rescale_of_sessions_on_rocksdb_changes_no_result(tmp_path: Path) -> None:
    """Sessions of sums, a live rescale 2 -> 3 -> 1 mid-stream (the open sessions split by key and written into
    the new instances' databases): the results of a run in memory."""
    records = scattered(2000, seed=5, disorder=0.0)
    topology = session_sums(3.0, 0.0, "sum")
    in_memory = await windowed_run(topology, records, None)
    rescaled = await windowed_run(topology, records, sl.RocksDBState(tmp_path, cache_entries=8), rescale_at=1000)
    assert rescaled == in_memory
    assert sum(in_memory.values()) > 500


async def test_open_sessions_on_rocksdb_come_back_from_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions resumed from a checkpoint (the open sessions written back into both instances' stores): what
    one run in memory gives."""
    records = scattered(2000, seed=3, disorder=0.0)
    topology = session_sums(3.0, 1.0, "sum")
    whole = await windowed_run(topology, records, None)
    opened = sessions_opened(monkeypatch)
    assert await resumed_after_half(topology, records, tmp_path, opened) == whole
    assert len(opened) == 2
