"""Partitioning: the stable key hash, its cache, and how each scheme spreads records over instances."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zlib
from collections import defaultdict
from typing import Any

import msgpack
import pytest

import streamlet as sl
from streamlet.core.model.partition import partition_of, stable_hash
from streamlet.core.model.segments import DEFAULT_SEGMENTS, SegmentTable, segment_of, spread
from streamlet.core.runtime.channel import Inbox, LocalChannel
from streamlet.core.runtime.routing import KeyedRoute
from tests.conftest import values

KEYS: list[Any] = ["user42", b"user42", 42, ("a", 1)]
KNOWN_HASHES = [1962550847, 905165963, 163128923, 3847662356]

HASHES_SCRIPT = """
import json
from streamlet.core.model.partition import partition_of, stable_hash
keys = ["user42", b"user42", 42, ("a", 1)]
print(json.dumps([hash("user42"), [[stable_hash(k), partition_of(k, 7)] for k in keys]]))
"""


class Indexed(sl.Sink):
    """Keeps, per sink instance index, the batches that instance was given."""

    def __init__(self) -> None:
        self.batches: dict[int, list[list[sl.Record]]] = defaultdict(list)

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        return _IndexedWriter(self.batches[context.index])

    def values(self) -> dict[int, list[Any]]:
        """Values received, per instance index."""
        return {index: [r.value for batch in batches for r in batch] for index, batches in self.batches.items()}


class _IndexedWriter(sl.SinkWriter):
    def __init__(self, batches: list[list[sl.Record]]) -> None:
        self.batches = batches

    def write(self, batch: list[sl.Record]) -> None:
        self.batches.append(list(batch))


class Tag(sl.Task):
    """Emits ``(key, id(self))``: which task object handled each record."""

    def execute(self, inputs: sl.Inputs, outputs: sl.Outputs) -> None:
        for record in inputs.get():
            outputs.emit(record.key, id(self))


def into_sink(items: list[Any], partitioning: Any, parallelism: int, **run: Any) -> dict[int, list[Any]]:
    """Run source 'in' -> ``Indexed`` sink 'out'; the values each sink instance got."""
    topology = sl.Topology("spread")
    sink = Indexed()
    source = topology.add_source("in", items)
    topology.add_sink("out", sink, parallelism=parallelism).set_input(source, partitioning=partitioning)
    sl.run(topology, **run)
    return sink.values()


def hashes_in_subprocess(seed: str) -> list[Any]:
    """``[hash("user42"), [[stable_hash, partition_of(.., 7)] per key]]`` from a fresh interpreter."""
    env = {**os.environ, "PYTHONHASHSEED": seed}
    output = subprocess.run([sys.executable, "-c", HASHES_SCRIPT], env=env, capture_output=True, check=True, text=True)
    result: list[Any] = json.loads(output.stdout)
    return result


def test_stable_hash_is_the_same_across_hash_seeds() -> None:
    """Processes with PYTHONHASHSEED 1 and 2 agree with this one on stable_hash and partition_of."""
    here = [[stable_hash(key), partition_of(key, 7)] for key in KEYS]
    seed_1, seed_2 = hashes_in_subprocess("1"), hashes_in_subprocess("2")
    assert seed_1[0] != seed_2[0]  # the seeds really change Python's own hash
    assert seed_1[1] == here
    assert seed_2[1] == here


@pytest.mark.parametrize(("key", "expected"), list(zip(KEYS, KNOWN_HASHES, strict=True)))
def test_stable_hash_known_values(key: Any, expected: int) -> None:
    """stable_hash is CRC-32 of the key's msgpack encoding, with fixed known values."""
    assert stable_hash(key) == expected
    assert stable_hash(key) == zlib.crc32(msgpack.packb(key, use_bin_type=True))


def test_partition_of_is_stable_hash_modulo_parts() -> None:
    """partition_of picks stable_hash(key) % parts."""
    assert [partition_of(key, 4) for key in KEYS] == [3, 3, 3, 0]
    assert [partition_of(key, 4) for key in KEYS] == [h % 4 for h in KNOWN_HASHES]


def owner_of(key: Any, instances: int) -> int:
    """The instance SAME_KEY gives ``key`` by default: its segment's owner in contiguous ranges."""
    return SegmentTable.contiguous(DEFAULT_SEGMENTS, instances).owner(key)


def test_default_owner_is_the_segment_of_the_mixed_hash_in_contiguous_ranges() -> None:
    """Key -> segment (the mixed stable_hash scaled to 128) -> instance segment * n // 128: equal ranges."""
    assert [owner_of(key, 4) for key in KEYS] == [spread(h, 128) * 4 // 128 for h in KNOWN_HASHES]
    assert [spread(h, 128) for h in KNOWN_HASHES] == [segment_of(key, 128) for key in KEYS]
    table = SegmentTable.contiguous(128, 3)
    assert [len(table.segments_of(i)) for i in range(3)] == [43, 43, 42]


def test_keys_that_differ_in_one_character_spread_over_the_instances() -> None:
    """s0..s7 and user0..user99 reach every instance (CRC-32 alone left s0..s7 all on instance 0 of 2)."""
    assert {owner_of(f"s{i}", 2) for i in range(8)} == {0, 1}
    spread_over = [sum(owner_of(f"user{i}", 4) == owner for i in range(100)) for owner in range(4)]
    assert min(spread_over) >= 15, spread_over


def test_keyed_route_caches_and_clears_at_its_limit() -> None:
    """A keyed route caches each key's instance; a new key at a full cache empties it first."""
    inbox = Inbox(10)
    channels: list[Any] = [LocalChannel(inbox, inbox.add_channel(0)) for _ in range(4)]
    route = KeyedRoute(channels, SegmentTable.contiguous(DEFAULT_SEGMENTS, 4), cache_limit=2)
    for key in ["a", "b", "a", "c"]:
        route.add((key, 1, None))
    assert route._cache == {"c": owner_of("c", 4)}
    assert [len(b) for b in route.buffers] == [sum(owner_of(k, 4) == i for k in "abac") for i in range(4)]


def test_same_key_answer_does_not_depend_on_earlier_keys() -> None:
    """Key 1.0 gets the same instance whether or not the equal-comparing key 1 was seen first."""
    inbox = Inbox(10)
    fresh, warmed = (
        KeyedRoute([LocalChannel(inbox, inbox.add_channel(0)) for _ in range(3)], SegmentTable.contiguous(128, 3))
        for _ in range(2)
    )
    warmed.add((1, None, None))
    warmed.add((1.0, None, None))
    fresh.add((1.0, None, None))
    assert [len(b) for b in fresh.buffers] == [len(b) // 2 for b in warmed.buffers]


def test_same_key_sends_a_key_to_the_owner_of_its_segment() -> None:
    """SAME_KEY into a parallelism-4 sink delivers every record of a key to the owner of its segment."""
    items = [(f"k{i % 20}", i) for i in range(200)]
    by_instance = into_sink(items, sl.SAME_KEY, 4)
    expected: dict[int, list[Any]] = {index: [] for index in range(4)}
    for key, value in items:
        expected[owner_of(key, 4)].append(value)
    assert by_instance == expected


def test_same_key_groups_keys_per_task_instance() -> None:
    """SAME_KEY into a parallelism-4 task: each key meets one task object, grouped by segment owner."""
    topology = sl.Topology("keyed")
    source = topology.add_source("in", [(f"k{i % 20}", i) for i in range(200)])
    tag = topology.add_task("tag", Tag, parallelism=4).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(tag)
    handled_by: dict[Any, set[int]] = defaultdict(set)
    for record in sl.run(topology).sink("out"):
        handled_by[record.key].add(record.value)
    assert all(len(objects) == 1 for objects in handled_by.values())
    groups: dict[Any, set[str]] = defaultdict(set)
    expected: dict[int, set[str]] = defaultdict(set)
    for key, (task_id,) in handled_by.items():
        groups[task_id].add(key)
        expected[owner_of(key, 4)].add(key)
    assert sorted(map(sorted, groups.values())) == sorted(map(sorted, expected.values()))


def test_same_key_routing_of_a_key_does_not_depend_on_earlier_keys() -> None:
    """In a job, key 1.0 reaches the same sink instance whether or not key 1 came before it."""
    alone = into_sink([(1.0, "x")], sl.SAME_KEY, 3)
    after_one = into_sink([(1, "y"), (1.0, "x")], sl.SAME_KEY, 3)
    assert [index for index, got in after_one.items() if "x" in got] == [
        index for index, got in alone.items() if "x" in got
    ]


def test_custom_partition_function_is_honoured() -> None:
    """A function (record, n) -> index sends each record to the instance it names."""
    by_instance = into_sink(list(range(30)), lambda record, n: record.value % n, 3)
    assert by_instance == {i: [v for v in range(30) if v % 3 == i] for i in range(3)}


def test_records_a_partition_function_keeps_stay_as_it_saw_them() -> None:
    """The function sees one record refilled element after element; those it keeps are never refilled."""
    kept: list[sl.Record] = []

    def keep_every_seventh(record: sl.Record, n: int) -> int:
        if record.value % 7 == 0:
            kept.append(record)
        return int(record.value % n)

    by_instance = into_sink(list(range(50)), keep_every_seventh, 3)
    assert by_instance == {i: [v for v in range(50) if v % 3 == i] for i in range(3)}
    assert [record.value for record in kept] == list(range(0, 50, 7))


def test_out_of_range_partition_from_source_fails_job_naming_the_edge() -> None:
    """An index outside 0..n-1 from a source's edge fails the job with a TopologyError naming the edge."""
    message = "edge 'in' -> 'out' input port 0: the partition function returned 3, expected 0..2"
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        into_sink(list(range(5)), lambda record, n: n, 3)


def test_out_of_range_partition_from_task_is_not_blamed_on_the_task() -> None:
    """A bad index on a task's output edge is a wiring error: TopologyError, even under on_error='skip'."""
    topology = sl.Topology("t")
    source = topology.add_source("in", list(range(5)))
    task = topology.map("m", lambda r: (r.key, r.value), on_error="skip").set_input(source)
    topology.add_sink("out", sl.CollectSink(), parallelism=3).set_input(task, partitioning=lambda r, n: n)
    message = "edge 'm' -> 'out' input port 0: the partition function returned 3, expected 0..2"
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        sl.run(topology)


def test_partition_function_that_raises_names_the_edge() -> None:
    """An exception inside the partition function becomes a TopologyError naming the edge."""
    message = "edge 'in' -> 'out' input port 0: the partition function raised KeyError: 'region'"
    with pytest.raises(sl.TopologyError, match=f"^{re.escape(message)}$"):
        into_sink(list(range(5)), lambda record, n: {}["region"], 3)


def test_broadcast_counts_every_record_once_per_instance() -> None:
    """BROADCAST into a parallelism-3 task: the task takes in 3 x 10 records, the source sends 10."""
    topology = sl.Topology("fan")
    source = topology.add_source("in", list(range(10)))
    each = topology.map("each", lambda r: (r.key, r.value), parallelism=3).set_input(source, partitioning=sl.BROADCAST)
    topology.add_sink("out", sl.CollectSink()).set_input(each)
    result = sl.run(topology)
    nodes = result.statistics.nodes
    assert (nodes["in"].records_out, nodes["each"].records_in, nodes["out"].records_in) == (10, 30, 30)
    assert sorted(values(result.sink("out"))) == sorted(list(range(10)) * 3)


def test_broadcast_gives_every_instance_every_record() -> None:
    """BROADCAST into a parallelism-3 sink: each instance receives all 10 records, in order."""
    assert into_sink(list(range(10)), sl.BROADCAST, 3) == {i: list(range(10)) for i in range(3)}


def test_round_robin_spreads_whole_batches() -> None:
    """ROUND_ROBIN with batch_size 10: 90 records reach 3 instances as 3 whole batches of 10 each, in turn."""
    topology = sl.Topology("rr")
    sink = Indexed()
    source = topology.add_source("in", list(range(90)))
    topology.add_sink("out", sink, parallelism=3).set_input(source, partitioning=sl.ROUND_ROBIN)
    sl.run(topology, batch_size=10)
    got = {index: [[r.value for r in batch] for batch in batches] for index, batches in sink.batches.items()}
    assert got == {i: [list(range(start, start + 10)) for start in range(10 * i, 90, 30)] for i in range(3)}


@pytest.mark.parametrize(
    ("key", "hashed_as"),
    [(1e20, 1e20), (-1e300, -1e300), (2.0**64, 2.0**64), (("k", 1e20), ["k", 1e20]), (2.0**63, 2**63)],
)
def test_stable_hash_of_a_whole_float_beyond_64_bits_is_its_float_encoding(key: Any, hashed_as: Any) -> None:
    """A whole float too big for a 64-bit int hashes as the float it is (it used to fail: the int does not encode)."""
    assert stable_hash(key) == zlib.crc32(msgpack.packb(hashed_as, use_bin_type=True))
