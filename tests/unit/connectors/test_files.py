"""FileSource (byte ranges, replay by offset) and FileSink (staging, commit, restore)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

import streamlet as sl
from tests.conftest import values
from tests.support.exactly_once import Bomb, RunningCount, Throttle


def lines_file(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "lines.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_all(path: Path, parallelism: int, batch_size: int = 1000) -> list[str]:
    topology = sl.Topology("read")
    source = topology.add_source("in", sl.FileSource(path), parallelism=parallelism)
    topology.add_sink("out", sl.CollectSink()).set_input(source)
    return values(sl.run(topology, batch_size=batch_size).sink("out"))


@pytest.mark.parametrize("parallelism", [1, 2, 3, 7])
def test_file_source_reads_every_line_once_in_any_parallelism(tmp_path: Path, parallelism: int) -> None:
    """Byte ranges split at line starts: every line once, whatever the split."""
    lines = [f"line {index} " + "x" * (index % 13) for index in range(500)]
    assert sorted(read_all(lines_file(tmp_path, lines), parallelism, batch_size=17)) == sorted(lines)


def test_file_source_keeps_unicode_and_strips_newlines(tmp_path: Path) -> None:
    """Lines are decoded text without their line ending (LF or CRLF)."""
    path = tmp_path / "mixed.txt"
    path.write_bytes("héllo\r\nwörld\nlast".encode())
    assert read_all(path, 1) == ["héllo", "wörld", "last"]


def file_job(path: Path, output: Path) -> sl.Topology:
    """lines -> throttle -> bomb -> key by line -> running count (x2) -> FileSink."""
    topology = sl.Topology("file-exactly-once")
    source = topology.add_source("in", sl.FileSource(path))
    throttle = topology.add_task("throttle", Throttle).set_input(source)
    bomb = topology.add_task("bomb", Bomb).set_input(throttle)
    keyed = topology.key_by("key", lambda record: record.value).set_input(bomb)
    count = topology.add_task("count", RunningCount, parallelism=2).set_input(keyed, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.FileSink(output)).set_input(count)
    return topology


def test_file_source_resumes_from_its_checkpointed_offset(tmp_path: Path) -> None:
    """A crash after two checkpoints: the rerun reads on from the saved byte offset, and the output is exact."""
    lines = [f"k{index % 30}" for index in range(3000)]
    path, output, checkpoints = lines_file(tmp_path, lines), tmp_path / "out", tmp_path / "checkpoints"
    Bomb.armed, Bomb.checkpoints, Bomb.after = True, checkpoints, 150
    try:
        with pytest.raises(sl.TaskError, match=r"^task 'bomb' instance 0 failed on a batch"):
            sl.run(file_job(path, output), checkpoint_dir=checkpoints, checkpoint_interval=0.02, batch_size=10)
    finally:
        Bomb.armed, Bomb.checkpoints, Bomb.after = False, None, 200
    rerun = sl.run(file_job(path, output), checkpoint_dir=checkpoints, checkpoint_interval=0.02, batch_size=10)
    assert 0 < rerun.statistics.nodes["in"].records_out < len(lines)
    expected = sorted((key, n) for key, total in Counter(lines).items() for n in range(1, total + 1))
    assert sorted((r.key, r.value) for r in sl.read_file_sink(output)) == expected


def test_file_sink_without_checkpoints_publishes_one_part_per_instance(tmp_path: Path) -> None:
    """Without checkpoints, each instance's records become part-00000000-<i>.jsonl at the end."""
    topology = sl.Topology("plain")
    source = topology.add_source("in", [("a", 1), ("b", [1, 2]), ("c", {"x": 1})])
    topology.add_sink("out", sl.FileSink(tmp_path / "out"), parallelism=2).set_input(source)
    sl.run(topology, batch_size=1)
    parts = sorted(p.name for p in (tmp_path / "out").glob("part-*.jsonl"))
    assert parts == ["part-00000000-0000.jsonl", "part-00000000-0001.jsonl"]
    assert sorted((r.key, json.dumps(r.value)) for r in sl.read_file_sink(tmp_path / "out")) == [
        ("a", "1"), ("b", "[1, 2]"), ("c", '{"x": 1}'),
    ]  # fmt: skip


def test_file_sink_restore_publishes_completed_and_drops_later_epochs(tmp_path: Path) -> None:
    """Staged epochs up to the restored checkpoint are published; later ones are discarded."""
    sink = sl.FileSink(tmp_path / "out")
    writer = sink.open(sl.SinkContext("out", 0, 1))

    async def stage() -> None:
        for epoch in (1, 2, 3):
            writer.write([sl.Record("k", epoch, 0.0)])
            await writer.prepare_commit(epoch)
        await writer.commit(1)

    asyncio.run(stage())
    writer.abort()
    assert values(sl.read_file_sink(tmp_path / "out")) == [1]
    restarted = sink.open(sl.SinkContext("out", 0, 1))
    restarted.restore(2)  # checkpoint 2 completed but its commit was cut short; 3 never completed
    restarted.close()
    assert values(sl.read_file_sink(tmp_path / "out")) == [1, 2]
    assert list((tmp_path / "out" / ".staging").iterdir()) == []
