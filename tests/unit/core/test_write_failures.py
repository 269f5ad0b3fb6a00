"""A full disk (or a quota, or an I/O error) while writing: a clear error naming the file, and no leftovers."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

import streamlet as sl
from streamlet.core.state.durable import seal
from streamlet.core.state.store import encode
from streamlet.errors import CheckpointError

DOCUMENT: dict[str, Any] = {"epoch": 1, "job": "wc", "finished": False, "sources": {}, "tasks": {}}


def failing(code: int) -> Callable[..., Any]:
    """A stand-in for ``os.write``/``os.fsync``/``os.replace`` that fails with ``code``."""

    def fail(*args: Any) -> Any:
        raise OSError(code, os.strerror(code))

    return fail


def exactly(message: str) -> str:
    """A pattern matching ``message`` and nothing else."""
    return f"^{re.escape(message)}$"


def full_disk(directory: Path, epoch: int) -> str:
    """The message of a failed save of checkpoint ``epoch`` into ``directory`` on a full disk."""
    path = directory / f"checkpoint-{epoch:010d}.msgpack"
    return f"cannot save checkpoint {epoch} to {path}: [Errno 28] No space left on device"


def names(directory: Path) -> list[str]:
    """Names in ``directory``, sorted."""
    return sorted(path.name for path in directory.iterdir())


def test_full_disk_names_the_checkpoint_and_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while writing: CheckpointError naming epoch, file and OS error, caused by the OSError."""
    store = sl.DirectoryCheckpointStore(tmp_path)
    monkeypatch.setattr(os, "write", failing(errno.ENOSPC))
    with pytest.raises(CheckpointError, match=exactly(full_disk(tmp_path, 7))) as caught:
        store.save(7, encode(DOCUMENT))
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC


@pytest.mark.parametrize("call", ["write", "fsync", "replace"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_failed_save_leaves_no_temporary_file(
    call: str, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever step fails with whichever error, the .tmp file is gone and the message gives the error."""
    store = sl.DirectoryCheckpointStore(tmp_path)
    monkeypatch.setattr(os, call, failing(code))
    message = f"cannot save checkpoint 2 to {store.path(2)}: [Errno {code}] {os.strerror(code)}"
    with pytest.raises(CheckpointError, match=exactly(message)):
        store.save(2, encode(DOCUMENT))
    monkeypatch.undo()
    assert names(tmp_path) == []


def test_failed_save_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoint 1 saved, checkpoint 2 hits a full disk: checkpoint 1 is still the latest, alone in the directory."""
    store = sl.DirectoryCheckpointStore(tmp_path)
    store.save(1, encode(DOCUMENT))
    monkeypatch.setattr(os, "fsync", failing(errno.ENOSPC))
    with pytest.raises(CheckpointError):
        store.save(2, encode({**DOCUMENT, "epoch": 2}))
    monkeypatch.undo()
    assert (names(tmp_path), store.latest()) == (["checkpoint-0000000001.msgpack"], (1, DOCUMENT))


def test_failed_seal_closes_and_removes_the_file_and_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """seal() on a full disk: the OSError names the file, which is closed and removed; the target never appears."""
    current, target = tmp_path / "inprogress", tmp_path / "00000001.pending"
    file = open(current, "w", encoding="utf-8")  # noqa: SIM115 - seal closes it
    file.write("staged\n")
    monkeypatch.setattr(os, "fsync", failing(errno.ENOSPC))
    with pytest.raises(OSError, match=exactly(f"[Errno 28] No space left on device: '{current}'")):
        seal(file, current, target)
    assert (file.closed, names(tmp_path)) == (True, [])


def word_topology() -> sl.Topology:
    """Three words from a list into a collecting sink."""
    topology = sl.Topology("wc")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("words", ["a", "b", "c"]))
    return topology


def test_run_reports_the_full_disk_not_an_exception_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sl.run with checkpoints on a full disk raises the CheckpointError itself and leaves no .tmp file."""
    monkeypatch.setattr(os, "fsync", failing(errno.ENOSPC))
    with pytest.raises(CheckpointError, match=exactly(full_disk(tmp_path, 1))):
        sl.run(word_topology(), checkpoint_dir=tmp_path)
    assert names(tmp_path) == []


async def checkpoint_on_a_full_disk(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Start a job fed by a queue, fill the disk, ask for a checkpoint (what it raises leaves the job's block)."""
    topology = sl.Topology("wc")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("words", sl.QueueSource()))
    async with sl.start(topology, checkpoint_dir=directory) as job:
        monkeypatch.setattr(os, "fsync", failing(errno.ENOSPC))
        await job.checkpoint()


async def test_job_checkpoint_raises_why_it_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Job.checkpoint() on a full disk raises the CheckpointError, not 'the job ended first'."""
    with pytest.raises(CheckpointError, match=exactly(full_disk(tmp_path, 1))):
        await checkpoint_on_a_full_disk(tmp_path, monkeypatch)


class StagingFails(sl.Sink):
    """A sink whose staging of a checkpoint fails as a full disk would."""

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        return _StagingFailsWriter()


class _StagingFailsWriter(sl.SinkWriter):
    def write(self, batch: list[sl.Record]) -> None:
        pass

    def prepare_commit(self, epoch: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"/staging/{epoch}")


STAGING_FAILED = (
    "sink '{}' instance 0 failed to stage checkpoint 1: OSError: [Errno 28] No space left on device: '/staging/1'"
)


def test_failed_staging_of_the_final_checkpoint_is_raised_as_itself(tmp_path: Path) -> None:
    """A sink that cannot stage the final checkpoint: run() raises a SinkError naming it, caused by the OSError
    (not an exception group)."""
    topology = sl.Topology("wc")
    topology.add_sink("out", StagingFails()).set_input(topology.add_source("words", ["a", "b"]))
    with pytest.raises(sl.SinkError, match=exactly(STAGING_FAILED.format("out"))) as failed:
        sl.run(topology, checkpoint_dir=tmp_path)
    assert isinstance(failed.value.__cause__, OSError)


async def timed_checkpoint_after_a_sink_completed(directory: Path) -> None:
    """A sink that cannot stage completes; another branch waits for input; then the interval triggers a checkpoint."""
    clock = sl.ManualClock()
    topology = sl.Topology("wc")
    topology.add_sink("done", StagingFails()).set_input(topology.add_source("words", ["a"]))
    topology.add_sink("open", sl.CollectSink()).set_input(topology.add_source("more", sl.QueueSource()))
    async with sl.start(topology, clock=clock, checkpoint_dir=directory, checkpoint_interval=1.0) as job:
        await anyio.wait_all_tasks_blocked()  # 'done' has completed; 'open' waits for input
        clock.advance(1.0)
        await job.wait()


async def test_failed_staging_on_a_timed_checkpoint_is_raised_as_itself(tmp_path: Path) -> None:
    """A completed sink failing to stage a checkpoint the interval triggered: a SinkError caused by that OSError,
    not an exception group."""
    with pytest.raises(sl.SinkError, match=exactly(STAGING_FAILED.format("done"))):
        await timed_checkpoint_after_a_sink_completed(tmp_path)


class AbortFails(sl.Sink):
    """A collecting sink whose ``abort`` raises."""

    def open(self, context: sl.SinkContext) -> sl.SinkWriter:
        return _AbortFailsWriter()


class _AbortFailsWriter(sl.SinkWriter):
    def write(self, batch: list[sl.Record]) -> None:
        pass

    def abort(self) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), "/sink/file")


def test_failing_abort_does_not_hide_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sink that fails to abort after a full disk: run() still raises the CheckpointError; the abort is logged."""
    topology = sl.Topology("wc")
    topology.add_sink("out", AbortFails()).set_input(topology.add_source("words", ["a"]))
    monkeypatch.setattr(os, "fsync", failing(errno.ENOSPC))
    with capture_logs() as logs, pytest.raises(CheckpointError):
        sl.run(topology, checkpoint_dir=tmp_path)
    [warning] = [entry for entry in logs if entry["event"] == "sink abort failed"]
    assert (warning["sink"], warning["instance"], warning["error"]) == ("out", 0, "OSError(5, 'Input/output error')")
