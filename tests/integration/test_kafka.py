"""KafkaSource and the plain KafkaSink against a real Kafka-protocol broker process.

The broker is librdkafka's mock cluster (from the confluent-kafka wheel, see
``tests/support/kafka_mock.py``), reached by aiokafka over TCP. Its limits,
which shape these tests:

- no CreateTopics API: topics are created through the mock's own API
  (auto-created topics would get 4 partitions);
- consumer groups with two or more members fail, so nothing here tests
  rebalancing (the source assigns partitions by hand and never joins a group;
  the group only stores offsets);
- transaction markers are written with CRC 0, so every consumer reading a
  topic that holds transactions turns CRC checks off (``check_crcs=False``);
- no ``read_committed`` isolation: the mock serves records of open and aborted
  transactions to ``read_committed`` consumers too, and commits given with
  ``send_offsets_to_transaction`` are accepted but not stored (see
  ``test_kafka_exactly_once.py`` for what that means for the sink).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamlet as sl
from streamlet.core.runtime.clock import SystemClock
from tests.support.held_calls import until_true
from tests.support.kafka_io import Message, commit, committed, consume, produce
from tests.support.kafka_mock import MockBroker

# A hung test fails and its teardown stops the broker (tests/support/timeouts.py); should the run end without
# teardown, the broker exits by itself when its stdin closes, and the reaper kills it anyway.
pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000  # a fixed Kafka timestamp (ms)


def messages(count: int, partitions: int) -> list[Message]:
    """``count`` messages spread round-robin, key ``k<i % 5>``, value ``v<i>``, timestamps T0 + i."""
    return [Message(f"k{i % 5}".encode(), f"v{i}".encode(), i % partitions, T0 + i) for i in range(count)]


def source_to_collect(source: sl.Source, parallelism: int = 1) -> sl.Topology:
    topology = sl.Topology("kafka-in")
    node = topology.add_source("in", source, parallelism=parallelism)
    topology.add_sink("out", sl.CollectSink()).set_input(node)
    return topology


def triples(records: list[sl.Record]) -> list[tuple[object, object, object]]:
    return sorted((r.key, r.value, r.ts) for r in records)


def test_source_reads_every_record_with_key_value_and_timestamp(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """Two instances over three partitions read each record once: key, value, Kafka timestamp in seconds."""
    topic = new_topic(3)
    anyio.run(produce, kafka_broker.bootstrap, topic, messages(30, 3))
    source = sl.KafkaSource(topic, kafka_broker.bootstrap, None, stop_at_end=True)
    result = sl.run(source_to_collect(source, parallelism=2))
    assert triples(result.sink("out")) == sorted((f"k{i % 5}", f"v{i}", (T0 + i) / 1000) for i in range(30))


async def read_instance(source: sl.KafkaSource, index: int, parallelism: int) -> list[str]:
    """Everything instance ``index`` of ``parallelism`` reads, in order."""
    values: list[str] = []
    async with anyio.create_task_group() as group:
        reader = source.open(sl.SourceContext("in", index, parallelism, SystemClock(), group))
        try:
            while (batch := await reader.read(100)) is not None:
                values += [element[1] for element in batch]  # the runtime's tuples: (key, value, ts)
        finally:
            await reader.aclose()
    return values


async def test_partitions_are_assigned_by_position_in_the_sorted_list(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """Over [(a,0), (a,1), (b,0)] instance 0 of 2 reads (a,0) and (b,0), instance 1 reads (a,1)."""
    a, b = new_topic(2), new_topic(1)
    await produce(kafka_broker.bootstrap, a, [Message(None, f"a{p}".encode(), p) for p in (0, 1)])
    await produce(kafka_broker.bootstrap, b, [Message(None, b"b0", 0)])
    source = sl.KafkaSource([b, a], kafka_broker.bootstrap, None, stop_at_end=True)
    assert sorted(await read_instance(source, 0, 2)) == ["a0", "b0"]
    assert await read_instance(source, 1, 2) == ["a1"]


async def test_event_time_progress_is_the_slowest_partitions_newest_timestamp(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """Partition 0 is 10 s ahead of partition 1: the reader's event-time progress (what the source's
    watermark follows) is partition 1's newest timestamp, not the newest read overall."""
    topic = new_topic(2)
    ahead = [Message(None, f"a{i}".encode(), 0, T0 + 10_000 + i) for i in range(3)]
    behind = [Message(None, f"b{i}".encode(), 1, T0 + i) for i in range(3)]
    await produce(kafka_broker.bootstrap, topic, ahead + behind)
    source = sl.KafkaSource(topic, kafka_broker.bootstrap, None)  # no stop_at_end: both partitions stay open
    async with anyio.create_task_group() as group:
        reader = source.open(sl.SourceContext("in", 0, 1, SystemClock(), group))
        try:
            assert reader.event_time_progress() is None  # nothing read yet: nothing to say
            read = 0
            while read < 6:
                batch = await reader.read(100)
                assert batch is not None
                read += len(batch)
            assert reader.event_time_progress() == (T0 + 2) / 1000
        finally:
            await reader.aclose()


def test_source_gives_headers_with_the_value(kafka_broker: MockBroker, new_topic: Callable[[int], str]) -> None:
    """with_headers=True: the value is {"value": ..., "headers": [(name, bytes), ...]} in Kafka's order."""
    topic = new_topic(1)
    sent = [Message(b"k", b"v", 0, T0, (("trace", b"t1"), ("trace", b"t2"), ("kind", b"x")))]
    anyio.run(produce, kafka_broker.bootstrap, topic, sent)
    source = sl.KafkaSource(topic, kafka_broker.bootstrap, None, stop_at_end=True, with_headers=True)
    [record] = sl.run(source_to_collect(source)).sink("out")
    assert record.value == {"value": "v", "headers": [("trace", b"t1"), ("trace", b"t2"), ("kind", b"x")]}


def json_source(topic: str, bootstrap: str, on_error: str = "skip") -> sl.KafkaSource:
    return sl.KafkaSource(topic, bootstrap, None, stop_at_end=True, value_deserializer=json.loads, on_error=on_error)


def poisoned(bootstrap: str, topic: str) -> None:
    sent = [Message(None, json.dumps(i).encode()) for i in range(3)]
    sent.insert(1, Message(b"bad", b"{not json"))
    anyio.run(produce, bootstrap, topic, sent)


def test_undecodable_record_is_dead_lettered_and_counted(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """on_error="skip": the poison record goes to dead_letters with its raw bytes; the others flow on."""
    topic = new_topic(1)
    poisoned(kafka_broker.bootstrap, topic)
    result = sl.run(source_to_collect(json_source(topic, kafka_broker.bootstrap)))
    assert [record.value for record in result.sink("out")] == [0, 1, 2]
    assert result.statistics.dead_lettered == 1
    [letter] = result.dead_letters
    assert (letter.task, letter.instance, letter.record.key, letter.record.value) == ("in", 0, b"bad", b"{not json")
    assert letter.error.startswith(f"topic '{topic}' partition 0 offset 1: JSONDecodeError: ")


def test_undecodable_record_fails_the_job_under_fail(kafka_broker: MockBroker, new_topic: Callable[[int], str]) -> None:
    """on_error="fail": the job stops with a KafkaError naming topic, partition and offset."""
    topic = new_topic(1)
    poisoned(kafka_broker.bootstrap, topic)
    with pytest.raises(
        sl.KafkaError,
        match=rf"^source 'in' instance 0 cannot decode the record at topic '{topic}' partition 0 offset 1: "
        r"JSONDecodeError: ",
    ):
        sl.run(source_to_collect(json_source(topic, kafka_broker.bootstrap, on_error="fail")))


def test_unknown_topic_is_named(kafka_broker: MockBroker) -> None:
    """A topic that does not exist fails the job with its name (after the metadata wait)."""
    source = sl.KafkaSource("no-such-topic", kafka_broker.bootstrap, None, stop_at_end=True, metadata_timeout=0.5)
    with pytest.raises(
        sl.KafkaError, match=r"^source 'in' instance 0: topic 'no-such-topic' does not exist \(waited 0.5 s for it\)$"
    ):
        sl.run(source_to_collect(source))


async def wait_for_records(job: sl.Job, count: int) -> None:
    with anyio.fail_after(20):
        while job.statistics().nodes["out"].records_in < count:  # noqa: ASYNC110 - polling a counter
            await anyio.sleep(0.01)


async def test_group_offsets_are_committed_only_when_a_checkpoint_completes(
    kafka_broker: MockBroker, new_topic: Callable[[int], str], tmp_path: Path
) -> None:
    """Reading commits nothing; a completed checkpoint commits the offsets it holds; a new job resumes there."""
    topic, bootstrap, group = new_topic(2), kafka_broker.bootstrap, f"group-{new_topic(1)}"
    await produce(bootstrap, topic, messages(10, 2))
    source = sl.KafkaSource(topic, bootstrap, group, poll_timeout=0.05)  # unbounded
    async with sl.start(source_to_collect(source), checkpoint_dir=tmp_path) as job:
        await wait_for_records(job, 10)
        assert await committed(bootstrap, group, topic, 2) == [None, None]
        await job.checkpoint()
        assert await committed(bootstrap, group, topic, 2) == [5, 5]
        await produce(bootstrap, topic, messages(4, 2))
        await wait_for_records(job, 14)

    assert await committed(bootstrap, group, topic, 2) == [7, 7]  # stopping took a final checkpoint

    rest = [Message(None, f"new{i}".encode(), i % 2) for i in range(6)]
    await produce(bootstrap, topic, rest)
    again = sl.KafkaSource(topic, bootstrap, group, stop_at_end=True)  # no checkpoint store: the group decides
    async with sl.start(source_to_collect(again)) as resumed:
        outcome = await resumed.wait()
    assert sorted(record.value for record in outcome.sink("out")) == [f"new{i}" for i in range(6)]


def test_group_without_commits_starts_at_auto_offset_reset(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """A new group with auto_offset_reset="latest" and stop_at_end reads nothing of what is there."""
    topic = new_topic(1)
    anyio.run(produce, kafka_broker.bootstrap, topic, messages(3, 1))
    group = f"fresh-{topic}"
    source = sl.KafkaSource(topic, kafka_broker.bootstrap, group, stop_at_end=True, auto_offset_reset="latest")
    assert sl.run(source_to_collect(source)).sink("out") == []


def test_plain_sink_writes_each_record_once_with_timestamp_and_headers(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """The idempotent sink writes key and value serialized, ts as the Kafka timestamp, headers from the callable."""
    topic = new_topic(2)
    items = [sl.Record(f"k{i}", {"n": i} if i % 2 else f"text{i}", (T0 + i) / 1000) for i in range(20)]
    sink = sl.KafkaSink(topic, kafka_broker.bootstrap, headers=lambda r: [("src", b"test"), ("key", r.key.encode())])
    topology = sl.Topology("kafka-out")
    topology.add_sink("out", sink).set_input(topology.add_source("in", items))
    sl.run(topology)
    written = anyio.run(consume, kafka_broker.bootstrap, topic)
    assert sorted((m.key, m.value, m.timestamp_ms, m.headers) for m in written) == sorted(
        (
            f"k{i}".encode(),
            b'{"n":%d}' % i if i % 2 else f"text{i}".encode(),
            T0 + i,
            (("src", b"test"), ("key", f"k{i}".encode())),
        )
        for i in range(20)
    )


async def checkpoint_then_crash(topology: sl.Topology, checkpoints: Path, bootstrap: str, topic: str) -> None:
    """Read 10 records, checkpoint (offsets [5, 5]), read 4 more, then die without a final checkpoint."""
    async with sl.start(topology, checkpoint_dir=checkpoints) as job:
        await wait_for_records(job, 10)
        await job.checkpoint()
        await produce(bootstrap, topic, messages(4, 2))
        await wait_for_records(job, 14)
        raise RuntimeError("crash")


async def test_restore_seeks_to_the_checkpoint_not_the_group(
    kafka_broker: MockBroker, new_topic: Callable[[int], str], tmp_path: Path
) -> None:
    """A job that dies after a checkpoint resumes at the checkpoint's offsets, whatever the group holds since:
    its CollectSink gives back the 10 records it had at the checkpoint, and the source reads the 4 after it once
    (from the group's rewound offsets it would read all 14 again)."""
    topic, bootstrap, group = new_topic(2), kafka_broker.bootstrap, f"group-{new_topic(1)}"
    await produce(bootstrap, topic, messages(10, 2))
    source = sl.KafkaSource(topic, bootstrap, group, poll_timeout=0.05)
    with pytest.raises(RuntimeError, match=r"^crash$"):
        await checkpoint_then_crash(source_to_collect(source), tmp_path, bootstrap, topic)
    await commit(bootstrap, group, topic, [0, 0])  # someone rewinds the group meanwhile

    again = sl.KafkaSource(topic, bootstrap, group, stop_at_end=True)
    async with sl.start(source_to_collect(again), checkpoint_dir=tmp_path) as resumed:
        outcome = await resumed.wait()
    before, after = [f"v{i}" for i in range(10)], [f"v{i}" for i in range(4)]
    assert sorted(record.value for record in outcome.sink("out")) == sorted(before + after)


async def test_barriers_that_cancel_waiting_reads_lose_nothing(
    kafka_broker: MockBroker, new_topic: Callable[[int], str], tmp_path: Path
) -> None:
    """Checkpoints every 5 ms cancel reads that wait for data; records trickling in all arrive, once."""
    topic, bootstrap = new_topic(2), kafka_broker.bootstrap
    source = sl.KafkaSource(topic, bootstrap, None, poll_timeout=0.05)
    sent = [Message(None, f"r{i}".encode(), i % 2) for i in range(200)]
    async with sl.start(source_to_collect(source), checkpoint_dir=tmp_path, checkpoint_interval=0.005) as job:
        for burst in range(20):
            await produce(bootstrap, topic, sent[burst * 10 : burst * 10 + 10])
            await anyio.sleep(0.02)
        await wait_for_records(job, 200)
        assert job.statistics().checkpoints >= 10
    result = await job.wait()
    assert sorted(record.value for record in result.sink("out")) == sorted(f"r{i}" for i in range(200))


def pairs(batch: Any) -> list[tuple[Any, Any]]:
    """``(key, value)`` of each element of a batch the Kafka reader returned (``(key, value, ts)`` tuples)."""
    assert batch is not None
    return [(element[0], element[1]) for element in batch]


async def test_reader_is_caught_up_once_it_read_what_the_topic_held_at_start(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """Ten records over two partitions when the reader starts (its first read), read three at most at a time;
    six more are produced right after that first read. caught_up() is False until the read that returns the
    last of the ten on each partition (v8 on partition 0, v9 on partition 1), and True from that read on,
    while records produced after the start are still unread: the end offsets seen at start count, not the
    topic's current ones."""
    topic, bootstrap = new_topic(2), kafka_broker.bootstrap
    await produce(bootstrap, topic, messages(10, 2))
    source = sl.KafkaSource(topic, bootstrap, None, poll_timeout=0.05)  # following: never ends
    async with anyio.create_task_group() as group:
        reader = source.open(sl.SourceContext("in", 0, 1, SystemClock(), group))
        try:
            assert not reader.caught_up()
            batch = pairs(await reader.read(3))  # starts the consumer: the end offsets are [5, 5] now
            assert 0 < len(batch) <= 3
            read = [value for _, value in batch]
            assert not reader.caught_up()  # three records cannot hold both v8 and v9 (each its partition's 5th)
            await produce(bootstrap, topic, [Message(None, f"late{i}".encode(), i % 2) for i in range(6)])
            caught_with_unread = False
            while len(read) < 16:
                batch = pairs(await reader.read(3))
                assert 0 < len(batch) <= 3  # never an empty read: there was data
                read += [value for _, value in batch]
                assert reader.caught_up() == ({"v8", "v9"} <= set(read)), read
                caught_with_unread = caught_with_unread or (reader.caught_up() and len(read) < 16)
            assert sorted(read) == sorted([f"v{i}" for i in range(10)] + [f"late{i}" for i in range(6)])
            assert caught_with_unread  # the late records did not delay it
        finally:
            await reader.aclose()


async def test_reader_of_an_empty_topic_says_it_caught_up_with_an_empty_read(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """Nothing at start: the first read returns [] (not a wait for the first record), after which caught_up()
    is True; the reader goes on following the topic."""
    topic, bootstrap = new_topic(2), kafka_broker.bootstrap
    source = sl.KafkaSource(topic, bootstrap, None, poll_timeout=0.05)
    async with anyio.create_task_group() as group:
        reader = source.open(sl.SourceContext("in", 0, 1, SystemClock(), group))
        try:
            assert not reader.caught_up()
            assert await reader.read(10) == []
            assert reader.caught_up()
            await produce(bootstrap, topic, [Message(b"k", b"later", 1)])
            assert pairs(await reader.read(10)) == [("k", "later")]
            assert reader.caught_up()
        finally:
            await reader.aclose()


USERS = [(f"u{i}", f"name{i}") for i in range(20)]
CLICKS = [(f"u{i % 20}", i) for i in range(200)] + [("nobody", 200)]  # 'nobody' has no row


class Gated(sl.Source):
    """``source``, whose readers read nothing until ``gate`` is set: the job cannot read the table yet."""

    def __init__(self, source: sl.Source, gate: anyio.Event) -> None:
        self.source = source
        self.gate = gate

    def open(self, context: sl.SourceContext) -> sl.SourceReader:
        return GatedReader(self.source.open(context), self.gate)


class GatedReader(sl.SourceReader):
    gives_elements = True  # the Kafka reader's (key, value, ts) tuples

    def __init__(self, reader: sl.SourceReader, gate: anyio.Event) -> None:
        self.reader = reader
        self.gate = gate

    async def read(self, max_records: int) -> Any:
        await self.gate.wait()
        return await self.reader.read(max_records)

    def caught_up(self) -> bool:
        return self.reader.caught_up()  # the Kafka reader's say

    async def aclose(self) -> None:
        await self.reader.aclose()


def test_a_bootstrapping_table_join_enriches_every_click_sent_before_the_kafka_table_was_read(
    kafka_broker: MockBroker, new_topic: Callable[[int], str]
) -> None:
    """A left table join whose RIGHT is a following KafkaSource (two instances over two partitions) holding the
    users, whose LEFT is a queue of clicks; every click is in the join before the source may read the topic
    (its readers wait on a gate the test opens then). Without bootstrap no click meets its row; with
    ``bootstrap=True`` every click waits (held), and once both readers reached the end offsets they saw at
    start (the source goes on following) each click meets its row."""
    topic, bootstrap = new_topic(2), kafka_broker.bootstrap
    rows = [Message(key.encode(), name.encode(), i % 2) for i, (key, name) in enumerate(USERS)]
    anyio.run(produce, bootstrap, topic, rows)
    names = dict(USERS)
    assert sorted(anyio.run(enrich_clicks, bootstrap, topic, False)) == sorted(
        (key, (click, None)) for key, click in CLICKS
    )
    assert sorted(anyio.run(enrich_clicks, bootstrap, topic, True)) == sorted(
        (key, (click, names.get(key))) for key, click in CLICKS
    )


async def enrich_clicks(bootstrap: str, topic: str, bootstrap_join: bool) -> list[tuple[Any, Any]]:
    """Send every click; once the join has taken them all, let the Kafka source read; once every click came
    out, stop."""
    enriched: list[tuple[Any, Any]] = []
    done, gate = anyio.Event(), anyio.Event()

    def collect(record: sl.Record) -> None:
        enriched.append((record.key, tuple(record.value)))
        if len(enriched) == len(CLICKS):
            done.set()

    topology = sl.Topology("clicks")
    users = Gated(sl.KafkaSource(topic, bootstrap, None, poll_timeout=0.05), gate)
    join = topology.table_join("j", how="left", bootstrap=bootstrap_join, parallelism=2)
    join.set_input(topology.add_source("clicks", sl.QueueSource()), in_port=sl.LEFT, partitioning=sl.SAME_KEY)
    join.set_input(topology.add_source("users", users, parallelism=2), in_port=sl.RIGHT, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CallbackSink(collect)).set_input(join)
    async with sl.start(topology) as job:
        for key, click in CLICKS:
            await job.send("clicks", key, click, 0.0)
        await until_true(lambda: job.statistics().nodes["j"].records_in == len(CLICKS))  # no row can be in yet
        assert job.statistics().nodes["j"].held == (len(CLICKS) if bootstrap_join else 0)
        gate.set()
        with anyio.fail_after(30):  # a reader that never says it caught up keeps the clicks waiting
            await done.wait()
        await job.stop()
        await job.wait()
    return enriched


def docs_kafka_example() -> str:
    """The first python block of docs/kafka.md."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "kafka.md").read_text(encoding="utf-8")
    block = re.search(r"```python(?: no-run)?\n(.*?)```", page, re.DOTALL)  # no-run: it needs a broker
    assert block is not None
    return block.group(1)


def test_docs_kafka_example_counts_clicks_per_page_and_minute(kafka_broker: MockBroker, tmp_path: Path) -> None:
    """The example of docs/kafka.md, pointed at the mock broker, writes one exact count per page and minute."""
    kafka_broker.create_topic("clicks", 2)
    kafka_broker.create_topic("clicks-per-page", 1)
    minute = 1_700_000_040  # a multiple of 60: event-time windows start on whole minutes
    clicks = [("home", 0), ("cart", 5), ("home", 10), ("home", 70)]
    sent = [
        Message(None, json.dumps({"page": page}).encode(), i % 2, (minute + s) * 1000)
        for i, (page, s) in enumerate(clicks)
    ]
    anyio.run(produce, kafka_broker.bootstrap, "clicks", sent)
    code = (
        docs_kafka_example()
        .replace("localhost:9092", kafka_broker.bootstrap)
        .replace('"ckpt/"', repr(str(tmp_path / "ckpt")))
        .replace('"kafka-staging"', repr(str(tmp_path / "staging")))
    )
    exec(compile(code, "docs/kafka.md", "exec"), {"__name__": "docs_kafka"})
    written = anyio.run(consume, kafka_broker.bootstrap, "clicks-per-page")
    assert sorted((m.key, m.value, m.timestamp_ms) for m in written) == [
        (b"cart", b"1", (minute + 60) * 1000 - 1),  # each count carries its minute's last millisecond
        (b"home", b"1", (minute + 120) * 1000 - 1),
        (b"home", b"2", (minute + 60) * 1000 - 1),
    ]


def test_unreachable_broker_is_a_kafka_error_naming_the_source() -> None:
    """aiokafka's connection error reaches the caller as a KafkaError naming source and instance, chained."""
    source = sl.KafkaSource("t", "127.0.0.1:1", None, stop_at_end=True)
    with pytest.raises(
        sl.KafkaError, match=r"^source 'in' instance 0: KafkaConnectionError: Unable to bootstrap"
    ) as info:
        sl.run(source_to_collect(source))
    assert type(info.value.__cause__).__name__ == "KafkaConnectionError"


def test_unreachable_broker_is_a_kafka_error_naming_the_sink() -> None:
    """The plain sink's connection error names the sink and its instance."""
    topology = sl.Topology("kafka-out")
    topology.add_sink("out", sl.KafkaSink("t", "127.0.0.1:1")).set_input(topology.add_source("in", [1]))
    with pytest.raises(sl.KafkaError, match=r"^sink 'out' instance 0: KafkaConnectionError: Unable to bootstrap"):
        sl.run(topology)
