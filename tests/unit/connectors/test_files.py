"""FileSource (byte ranges, replay by offset) and FileSink (staging, commit, restore)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import streamlet as sl
from tests.conftest import values
from tests.support.elements import el
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


Opener = Callable[[Path, str], sl.SinkWriter]


@pytest.fixture
def opener() -> Iterator[Opener]:
    """Opens FileSink writers of instance 0, one per ``(output, attempt)``; closes their files at the end."""
    opened: list[sl.SinkWriter] = []

    def open_writer(output: Path, attempt: str) -> sl.SinkWriter:
        opened.append(sl.FileSink(output).open(sl.SinkContext("out", 0, 1, attempt=attempt)))
        return opened[-1]

    yield open_writer
    for writer in opened:
        writer.abort()


async def stage(writer: sl.SinkWriter, epoch: int, *values: str) -> None:
    """Write ``values`` (key "k") and stage them as ``epoch``."""
    writer.write([el("k", value, 0.0) for value in values])
    await writer.prepare_commit(epoch)


def staged_files(output: Path) -> list[str]:
    """Every file left in the staging area, as ``<attempt>/<name>``."""
    return sorted(str(path.relative_to(output / ".staging")) for path in (output / ".staging").rglob("*.*"))


async def test_file_sink_restore_publishes_completed_and_drops_later_epochs(tmp_path: Path, opener: Opener) -> None:
    """Epochs the restored run staged up to the checkpoint are published; its later ones are discarded."""
    output = tmp_path / "out"
    crashed = opener(output, "run-a")
    for epoch in (1, 2, 3):
        await stage(crashed, epoch, f"a{epoch}")
    await crashed.commit(1)
    crashed.abort()
    assert values(sl.read_file_sink(output)) == ["a1"]
    restarted = opener(output, "run-b")
    restarted.restore(sl.RestorePoint(2, "run-a"))  # checkpoint 2 completed but its commit was cut short
    restarted.close()
    assert values(sl.read_file_sink(output)) == ["a1", "a2"]
    assert list((output / ".staging").iterdir()) == []


async def test_file_sink_restore_never_publishes_another_attempts_staging(tmp_path: Path, opener: Opener) -> None:
    """Restoring from run A's checkpoint 2 leaves run X's staged epochs 1 and 2 unpublished."""
    output = tmp_path / "out"
    run_a, run_x = opener(output, "run-a"), opener(output, "run-x")
    for epoch in (1, 2):
        await stage(run_a, epoch, f"a{epoch}")
        await stage(run_x, epoch, f"x{epoch}")
    run_a.abort()
    opener(output, "run-b").restore(sl.RestorePoint(2, "run-a"))
    assert values(sl.read_file_sink(output)) == ["a1", "a2"]
    assert staged_files(output) == [
        "run-b/0000.inprogress", "run-x/0000-00000001.pending", "run-x/0000-00000002.pending", "run-x/0000.inprogress",
    ]  # fmt: skip


async def test_file_sink_interleaved_attempts_publish_each_completed_epoch_once(tmp_path: Path, opener: Opener) -> None:
    """A stale run and its replacement write and stage the same instance in turn: each completed epoch once."""
    output = tmp_path / "out"
    zombie = opener(output, "run-a")
    await stage(zombie, 1, "a1")  # checkpoint 1 of run A completes; A stops before its commit
    replacement = opener(output, "run-b")
    replacement.restore(sl.RestorePoint(1, "run-a"))
    zombie.write([el("k", "a2", 0.0)])
    replacement.write([el("k", "b2", 0.0)])
    await replacement.prepare_commit(2)
    await zombie.commit(1)  # the stale run wakes up and publishes what the restore published already
    await replacement.commit(2)
    replacement.close()
    assert values(sl.read_file_sink(output)) == ["a1", "b2"]
    assert sorted(path.name for path in output.glob("part-*")) == [
        "part-00000001-0000.jsonl",
        "part-00000002-0000.jsonl",
    ]


async def test_file_sink_zombie_epoch_never_completed_is_never_published(tmp_path: Path, opener: Opener) -> None:
    """Run A staged epoch 2 but only checkpoint 1 completed: the restore drops A's epoch 2; B's epoch 2 is published."""
    output = tmp_path / "out"
    zombie = opener(output, "run-a")
    await stage(zombie, 1, "a1")
    await stage(zombie, 2, "a2")
    replacement = opener(output, "run-b")
    replacement.restore(sl.RestorePoint(1, "run-a"))
    await stage(replacement, 2, "b2")
    await replacement.commit(2)
    assert values(sl.read_file_sink(output)) == ["a1", "b2"]
    assert staged_files(output) == ["run-b/0000.inprogress"]


async def test_file_sink_stale_commit_after_the_restore_changes_nothing(tmp_path: Path, opener: Opener) -> None:
    """Two writers publish the same staged epoch (restore, then the stale run's commit): one file, same content."""
    output = tmp_path / "out"
    zombie = opener(output, "run-a")
    await stage(zombie, 1, "a1", "a1-bis")
    opener(output, "run-b").restore(sl.RestorePoint(1, "run-a"))
    published = (output / "part-00000001-0000.jsonl").read_bytes()
    await zombie.commit(1)
    assert [path.name for path in output.glob("part-*")] == ["part-00000001-0000.jsonl"]
    assert (output / "part-00000001-0000.jsonl").read_bytes() == published
    assert values(sl.read_file_sink(output)) == ["a1", "a1-bis"]


async def test_file_sink_restore_after_the_commit_changes_nothing(tmp_path: Path, opener: Opener) -> None:
    """The epoch was committed before the crash: restoring from it publishes nothing again."""
    output = tmp_path / "out"
    crashed = opener(output, "run-a")
    await stage(crashed, 1, "a1")
    await crashed.commit(1)
    published = (output / "part-00000001-0000.jsonl").read_bytes()
    opener(output, "run-b").restore(sl.RestorePoint(1, "run-a"))
    assert [path.name for path in output.glob("part-*")] == ["part-00000001-0000.jsonl"]
    assert (output / "part-00000001-0000.jsonl").read_bytes() == published


def test_file_sink_stages_apart_per_attempt(tmp_path: Path, opener: Opener) -> None:
    """Writers of the same instance in two runs keep their in-progress files apart."""
    output = tmp_path / "out"
    opener(output, "run-a").write([el("k", "a", 0.0)])
    opener(output, "run-b")
    assert staged_files(output) == ["run-a/0000.inprogress", "run-b/0000.inprogress"]
