"""Incremental checkpoints of RocksDB state: a checkpoint writes the keys written since the previous one (a chunk
of a changelog), the chain restores exactly on either backend, it is compacted so that a restore reads a bounded
chain, and the stores keep each chunk once, drop chunks no kept checkpoint names, and fall back to an older
checkpoint when a chunk is missing or damaged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.model.encoding import unpackb
from streamlet.core.state import changelog as cl
from streamlet.core.state.changelog import MAX_CHAIN
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.rocks_keyed import RocksKeyedState
from streamlet.core.state.rocks_timers import timer_list
from streamlet.core.state.store import DirectoryCheckpointStore, InMemoryCheckpointStore, decode, encode


@pytest.fixture
def state(tmp_path: Path) -> Any:
    backend = sl.RocksDBState(tmp_path / "rocks", cache_entries=16)
    yield backend.open("job", "count", 0, 128)
    backend.close()


def entries(increment: cl.Increment) -> dict[Any, Any]:
    """What a chunk holds, decoded: key -> value (``None``: deleted)."""
    return {
        unpackb(raw[cl.SEGMENT_BYTES :]): None if packed is None else unpackb(packed)
        for raw, packed in cl.chunk_entries(increment.chunk)
    }


def saved(store: InMemoryCheckpointStore, epoch: int, increment: cl.Increment) -> None:
    """``increment`` saved as checkpoint ``epoch``'s one task snapshot, as the coordinator saves it."""
    document: dict[str, Any] = {"epoch": epoch, "tasks": {"count": [{"state": increment}]}}
    cl.store_increments(document, store.save_chunk)
    store.save(epoch, encode(document))


def restored(store: InMemoryCheckpointStore) -> dict[Any, Any]:
    latest = store.latest()
    assert latest is not None
    fresh = KeyedState()
    fresh.restore(latest[1]["tasks"]["count"][0]["state"])
    return fresh.values


def test_a_checkpoint_after_the_first_holds_only_the_keys_written_since(state: RocksKeyedState) -> None:
    for n in range(1000):
        state.put(n, {"n": n})
    first = state.checkpoint_increment()
    assert len(first.chain) == 1
    assert len(entries(first)) == 1000
    state.put(5, {"n": -5})
    state.get(6)["n"] = -6  # changed in place, as operators do
    state.delete(7)
    state.put(("new", 1), (1, 2**70))
    second = state.checkpoint_increment()
    assert second.chain[:-1] == first.chain
    assert len(second.chain) == 2
    # the written keys, and the ones the write-back cache held (written back whole at every checkpoint)
    assert {5: {"n": -5}, 6: {"n": -6}, 7: None, ("new", 1): (1, 2**70)}.items() <= entries(second).items()
    assert len(entries(second)) <= 4 + 16
    assert len(second.chunk) < len(first.chunk) / 10


def test_the_chain_restores_exactly_on_either_backend_and_regroups_by_key(state: RocksKeyedState) -> None:
    store = InMemoryCheckpointStore()
    expected: dict[Any, Any] = {}
    for epoch in range(1, 6):
        for n in range(300) if epoch == 1 else range(epoch * 10, epoch * 10 + 10):
            state.put(f"k{n}", [epoch, n])
            expected[f"k{n}"] = [epoch, n]
        state.delete(f"k{epoch}")
        expected.pop(f"k{epoch}")
        saved(store, epoch, state.checkpoint_increment())
    assert restored(store) == expected
    latest = store.latest()
    assert latest is not None
    snapshot = latest[1]["tasks"]["count"][0]["state"]
    assert len(snapshot[cl.CHANGELOG]) == 5  # a chain, not one full chunk
    state.put("after", 1)
    state.restore(snapshot)  # back on RocksDB, in a fresh database
    assert dict(state.items()) == expected
    regrouped = KeyedState()
    regrouped.restore(KeyedState.merge(KeyedState.partition(snapshot, 3)))
    assert regrouped.values == expected


def test_a_restore_into_other_segments_places_every_key_again(tmp_path: Path, state: RocksKeyedState) -> None:
    for n in range(300):
        state.put((n, "t"), n)
    other = sl.RocksDBState(tmp_path / "other").open("job", "count", 0, 7)
    other.restore(state.checkpoint())
    assert dict(other.items()) == {(n, "t"): n for n in range(300)}
    assert {other.values.key_of(raw) for raw in other.values.db.keys()} == {(n, "t") for n in range(300)}  # noqa: SIM118
    assert all(other.values.raw_key(other.values.key_of(raw)) == raw for raw in other.values.db.keys())  # noqa: SIM118
    other.close()


def test_the_chain_is_compacted_so_a_restore_reads_a_bounded_one(state: RocksKeyedState) -> None:
    for n in range(2000):
        state.put(n, n)
    lengths = []
    for round_ in range(3 * MAX_CHAIN):
        state.put(round_, -round_)  # one key a checkpoint: every chain is as long as it may be
        lengths.append(len(state.checkpoint_increment().chain))
    assert max(lengths) == MAX_CHAIN
    assert lengths[:MAX_CHAIN] == list(range(1, MAX_CHAIN + 1))
    assert lengths[MAX_CHAIN] == 1  # a full chunk starts the next chain
    # increments that outweigh their full chunk end the chain too: every key rewritten each time
    for n in range(2000):
        state.put(n, n)
    state.restore(state.checkpoint())
    chains = []
    for round_ in range(4):
        for n in range(2000):
            state.put(n, round_)
        chains.append(len(state.checkpoint_increment().chain))
    assert chains == [1, 2, 3, 1]


def test_more_written_than_the_changelog_may_hold_makes_the_next_checkpoint_full(tmp_path: Path) -> None:
    backend = sl.RocksDBState(tmp_path, cache_mb=1, cache_entries=4)
    state = backend.open("job", "count", 0, 128)
    state.put("a", 1)
    assert len(state.checkpoint_increment().chain) == 1
    for n in range(20_000):  # ~1.3 MB written: past the 1 MB the changelog keeps
        state.put(n, b"x" * 60)
    full = state.checkpoint_increment()
    assert len(full.chain) == 1
    assert len(entries(full)) == 20_001
    backend.close()


def test_the_directory_store_keeps_each_chunk_once_and_drops_what_no_kept_checkpoint_names(
    tmp_path: Path, state: RocksKeyedState
) -> None:
    store = DirectoryCheckpointStore(tmp_path / "checkpoints", keep=2)
    names: list[tuple[str, ...]] = []
    for epoch in range(1, MAX_CHAIN + 4):
        state.put(epoch, epoch)
        increment = state.checkpoint_increment()
        names.append(increment.chain)
        document: dict[str, Any] = {"epoch": epoch, "tasks": {"count": [[0, {"state": increment}]]}}
        cl.store_increments(document, store.save_chunk)
        store.save(epoch, encode(document))
        kept = set(names[-1]) | (set(names[-2]) if len(names) > 1 else set())
        assert {path.stem for path in (store.directory / "chunks").glob("*.chunk")} == kept
    latest = store.latest()
    assert latest is not None
    assert KeyedState().checkpoint() != latest[1]["tasks"]["count"][0][1]["state"]
    fresh = KeyedState()
    fresh.restore(latest[1]["tasks"]["count"][0][1]["state"])
    assert fresh.values == {n: n for n in range(1, MAX_CHAIN + 4)}


@pytest.mark.parametrize("damage", ["missing", "damaged"])
def test_a_checkpoint_whose_chunk_is_lost_is_skipped_for_the_one_before(
    tmp_path: Path, state: RocksKeyedState, damage: str
) -> None:
    store = DirectoryCheckpointStore(tmp_path / "checkpoints")
    for epoch in (1, 2):
        state.put(epoch, epoch)
        increment = state.checkpoint_increment()
        document: dict[str, Any] = {"epoch": epoch, "tasks": {"count": [{"state": increment}]}}
        cl.store_increments(document, store.save_chunk)
        store.save(epoch, encode(document))
    newest = store.chunk_path(increment.chain[-1])
    if damage == "missing":
        newest.unlink()
    else:
        newest.write_bytes(newest.read_bytes()[:-1] + b"\x00")
    latest = store.latest()
    assert latest is not None
    assert latest[0] == 1
    fresh = KeyedState()
    fresh.restore(latest[1]["tasks"]["count"][0]["state"])
    assert fresh.values == {1: 1}


class Count(sl.Task):
    def execute(self, inputs: Any, outputs: Any) -> None:
        for record in inputs.get():
            self.state.put(record.key, self.state.get(record.key, 0) + record.value)
            outputs.emit(record.key, self.state.get(record.key))


def counting() -> sl.Topology:
    topology = sl.Topology("counts")
    words = topology.add_source("words", sl.QueueSource())
    count = topology.add_task("count", Count, parallelism=2).set_input(words, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(count)
    return topology


class Crash(Exception):
    """Ends the first run the hard way."""


Sent = list[tuple[str, Any, float | None]]  # (key, value, ts) of records sent to a job's one source


def files_in(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


def chunks_in(folder: Path) -> set[Path]:
    return set((folder / "chunks").glob("*.chunk"))


async def checkpointed_rounds_then_crash(
    topology: sl.Topology,
    source: str,
    backend: sl.RocksDBState,
    checkpoints: Path,
    first: Sent,
    rounds: list[Sent],
    sizes: list[int],
    measured: Callable[[Path], set[Path]] = files_in,
) -> None:
    """``first`` into the job's ``source``, then a checkpoint before each round of ``rounds`` (sent after it):
    the bytes each checkpoint wrote (its files among ``measured(checkpoints)``) into ``sizes``; then a crash."""
    seen: set[Path] = set()
    async with sl.start(topology, checkpoint_dir=checkpoints, state_backend=backend) as job:
        for key, value, ts in first:
            await job.send(source, key, value, ts=ts)
        for sent in rounds:
            await job.settle()
            await job.checkpoint()
            new = measured(checkpoints) - seen
            sizes.append(sum(path.stat().st_size for path in new))
            seen |= new
            for key, value, ts in sent:
                await job.send(source, key, value, ts=ts)
        raise Crash


def again(prefix: str, rounds: int, ts: Callable[[int], float | None]) -> list[Sent]:
    """Per round, a record of 50 of the keys ``prefix0`` .. (keys 7 apart, starting at the round's number)."""
    return [[(f"{prefix}{n * 7 + round_}", 1, ts(round_)) for n in range(50)] for round_ in range(rounds)]


async def test_a_job_writes_what_changed_and_resumes_exactly_from_its_chain(tmp_path: Path) -> None:
    """5 000 keys, then checkpoints with 50 of them changed: each writes a small fraction of the first one's
    bytes; a crash and a restart (another database, in-memory this time) resume with the exact counts."""
    sizes: list[int] = []
    with pytest.raises(Crash):  # the sink's output goes into each document whole (a CollectSink keeps it): chunks
        await checkpointed_rounds_then_crash(
            counting(), "words", sl.RocksDBState(tmp_path / "one"), tmp_path / "checkpoints",
            [(f"w{n}", 1, None) for n in range(5000)], again("w", 4, lambda _: None), sizes, chunks_in,
        )  # fmt: skip
    assert sizes[0] > 5000 * 8
    assert all(0 < size < sizes[0] / 20 for size in sizes[1:]), sizes
    async with sl.start(counting(), checkpoint_dir=tmp_path / "checkpoints") as job:
        for n in range(5000):
            await job.send("words", f"w{n}", 1)
        await job.close_source("words")
        result = await job.wait()
    finals: dict[str, int] = {}
    for record in result.sink("out"):
        finals[record.key] = max(finals.get(record.key, 0), record.value)
    expected = {f"w{n}": 2 for n in range(5000)}
    for round_ in range(3):  # the fourth round's records came after the last checkpoint: lost with the crash
        for n in range(50):
            expected[f"w{n * 7 + round_}"] += 1
    assert finals == expected


async def test_a_savepoint_of_a_chain_stands_alone(tmp_path: Path) -> None:
    """A savepoint taken after incremental checkpoints holds the chunks' contents: a job started from it in
    another folder (no chunk there) continues with the exact counts."""
    async with sl.start(
        counting(), checkpoint_dir=tmp_path / "first", state_backend=sl.RocksDBState(tmp_path / "one")
    ) as job:
        for keys in (range(100), range(100, 110), range(110, 120)):
            for n in (0, *keys) if keys.start else keys:
                await job.send("words", f"w{n}", 1)
            await job.settle()
            await job.checkpoint()
        await job.savepoint(tmp_path / "savepoint")
        await job.close_source("words")
        await job.wait()
    store = DirectoryCheckpointStore(tmp_path / "first")
    newest = decode(store.path(store.epochs()[-1]).read_bytes())
    assert [len(entry["state"][cl.CHUNKS]) >= 3 for entry in newest["tasks"]["count"]] == [True, True]  # chains
    async with sl.start(
        counting(), checkpoint_dir=tmp_path / "second", from_savepoint=tmp_path / "savepoint",
        state_backend=sl.RocksDBState(tmp_path / "two"),
    ) as job:  # fmt: skip
        await job.send("words", "w0", 1)
        await job.close_source("words")
        result = await job.wait()
    assert [(record.key, record.value) for record in result.sink("out")] == [("w0", 4)]  # 3 before the savepoint


# -- timers ----------------------------------------------------------------------------------------------------


def test_timers_checkpoint_what_changed_and_their_chain_restores_on_either_backend(tmp_path: Path) -> None:
    """3 000 event-time timers (pairs due at one time) and 300 processing-time ones; then 10 set, 5 cancelled and
    those due by 2.0 fired: the second checkpoint writes a small fraction of the first's bytes, and the chain
    restores the pending timers, in their firing order, into RocksDB's timers and the in-memory ones."""
    backend = sl.RocksDBState(tmp_path / "rocks")
    timers = backend.open_timers("job", "t", 0, lambda: 0.0)
    for n in range(3000):
        timers.at(f"k{n}", (n // 2) * 0.5)
    for n in range(300):
        timers.at(("p", n), n * 1.5, "processing")
    first = timers.checkpoint_increment()
    for n in range(10):
        timers.at(f"new{n}", 7.25)
    for n in range(5):
        timers.cancel(f"k{100 + n}", ((100 + n) // 2) * 0.5)
    fired = list(timers.due("event", 2.0))
    second = timers.checkpoint_increment()
    assert (len(first.chain), second.chain[:-1], len(fired)) == (1, first.chain, 10)
    assert 0 < len(second.chunk) < len(first.chunk) / 20
    chain = cl.changelog([first.chunk, second.chunk], 0)
    in_memory = sl.Timers(lambda: 0.0)
    in_memory.restore(timer_list(chain))
    on_rocksdb = backend.open_timers("job", "t", 1, lambda: 0.0)
    on_rocksdb.restore(chain)
    expected = timers.pending()
    assert len(expected) == 3000 + 300 + 10 - 5 - 10
    assert in_memory.pending() == expected
    assert on_rocksdb.pending() == expected
    assert len(on_rocksdb.checkpoint_increment().chain) == 1  # after a restore: a full chunk, a new chain
    backend.close()


class Remind(sl.Task):
    """Sets an event-time timer per key at 1 000 + its count; a timer emits ``(key, when)``."""

    def execute(self, inputs: Any, outputs: Any) -> None:
        for record in inputs.get():
            count = self.state.get(record.key, 0) + 1
            self.state.put(record.key, count)
            self.timers.at(record.key, 1000.0 + count)

    def on_timer(self, key: Any, when: float, time: str, outputs: Any) -> None:
        outputs.emit(key, when)


def reminding() -> sl.Topology:
    topology = sl.Topology("reminders")
    words = topology.add_source("words", sl.QueueSource())
    remind = topology.add_task("remind", Remind, parallelism=2).set_input(words, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(remind)
    return topology


async def test_a_job_with_a_timer_per_key_writes_what_changed_and_resumes_exactly(tmp_path: Path) -> None:
    """5 000 keys each with a pending timer, then checkpoints with 50 keys given one more: each checkpoint after
    the first writes a small fraction of its bytes (chunks and document: keyed state and timers alike); resumed
    in memory after a crash, every timer set before the last checkpoint fires once."""
    sizes: list[int] = []
    with pytest.raises(Crash):
        await checkpointed_rounds_then_crash(
            reminding(), "words", sl.RocksDBState(tmp_path / "one"), tmp_path / "checkpoints",
            [(f"w{n}", 1, 0.0) for n in range(5000)], again("w", 3, lambda _: 0.0), sizes,
        )  # fmt: skip
    assert all(0 < size < sizes[0] / 20 for size in sizes[1:]), sizes
    async with sl.start(reminding(), checkpoint_dir=tmp_path / "checkpoints") as job:
        await job.close_source("words")
        result = await job.wait()
    counts = {f"w{n}": 1 for n in range(5000)}
    for round_ in range(2):  # the third round came after the last checkpoint: lost with the crash
        for n in range(50):
            counts[f"w{n * 7 + round_}"] += 1
    fired = sorted((record.key, record.value) for record in result.sink("out"))
    # a key given a second record set a second timer: both fire (a timer is per key and time)
    expected = sorted(
        [(key, 1001.0) for key in counts] + [(key, 1000.0 + count) for key, count in counts.items() if count > 1]
    )
    assert fired == expected


# -- sessions ----------------------------------------------------------------------------------------------------


def visits(parallelism: int = 2) -> sl.Topology:
    """Visits per user and session (a 1 h gap, event time), ``parallelism`` instances, into a CollectSink."""
    topology = sl.Topology("visits")
    clicks = topology.add_source("clicks", sl.QueueSource())
    window = sl.SessionWindow(3600.0, time="event")
    sessions = topology.window_reduce("sessions", "count", window, parallelism=parallelism)
    sessions.set_input(clicks, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(sessions)
    return topology


@pytest.mark.parametrize("resumed_by", [2, 3])
async def test_a_job_with_a_session_per_user_writes_what_changed_and_resumes_exactly(
    tmp_path: Path, resumed_by: int
) -> None:
    """5 000 open sessions on RocksDB, then checkpoints with 50 users visiting again: each checkpoint after the
    first writes a small fraction of its bytes (only the chains that changed); resumed in memory after a
    crash (by 2 instances, or 3: the chains split by key), every session closes with the visits counted before
    the last checkpoint."""
    sizes: list[int] = []
    with pytest.raises(Crash):
        await checkpointed_rounds_then_crash(
            visits(), "clicks", sl.RocksDBState(tmp_path / "one", cache_entries=100), tmp_path / "checkpoints",
            [(f"u{n}", 1, float(n % 60)) for n in range(5000)], again("u", 3, lambda round_: 100.0 + round_), sizes,
        )  # fmt: skip
    assert all(0 < size < sizes[0] / 20 for size in sizes[1:]), sizes
    async with sl.start(visits(resumed_by), checkpoint_dir=tmp_path / "checkpoints") as job:
        await job.close_source("clicks")
        result = await job.wait()
    counts = {f"u{n}": 1 for n in range(5000)}
    for round_ in range(2):  # the third round came after the last checkpoint: lost with the crash
        for n in range(50):
            counts[f"u{n * 7 + round_}"] += 1
    assert {record.key: record.value for record in result.sink("out")} == counts
    assert len(result.sink("out")) == 5000  # one session each


async def test_a_savepoint_after_incremental_checkpoints_of_sessions_stands_alone(tmp_path: Path) -> None:
    """Sessions checkpointed incrementally, then a savepoint: a job started from it in another folder (no chunk
    there), in memory, closes every session with every visit counted."""
    backend = sl.RocksDBState(tmp_path / "one", cache_entries=10)
    async with sl.start(visits(), checkpoint_dir=tmp_path / "first", state_backend=backend) as job:
        for round_ in range(3):
            for n in range(100):
                await job.send("clicks", f"u{n + round_}", 1, ts=float(round_))
            await job.settle()
            await job.checkpoint()
        await job.savepoint(tmp_path / "savepoint")
        await job.close_source("clicks")
        await job.wait()
    async with sl.start(visits(), checkpoint_dir=tmp_path / "second", from_savepoint=tmp_path / "savepoint") as job:
        await job.send("clicks", "u0", 1, ts=5.0)
        await job.close_source("clicks")
        result = await job.wait()
    counts = {f"u{n}": 3 for n in range(102)} | {"u0": 2, "u1": 2, "u100": 2, "u101": 1}
    assert {record.key: record.value for record in result.sink("out")} == counts
