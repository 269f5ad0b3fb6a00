"""Files: ``FileSource`` (lines, replayable by byte offset) and ``FileSink`` (exactly-once with checkpoints).

``FileSink`` writes JSON lines. With checkpoints it is transactional: each
run of the job (its *attempt*, see ``SinkContext``) stages in its own
directory ``<dir>/.staging/<attempt>/``: what an instance writes goes to
``<index>.inprogress``; at ``prepare_commit(epoch)`` that file is fsynced and
set aside as ``<index>-<epoch>.pending``; at ``commit(epoch)`` (the
checkpoint is complete) it is renamed to the visible
``part-<epoch>-<index>.jsonl``. Publishing is idempotent: the name is fixed
by epoch and instance, so a second publish of the same staged file (a stale
run that wakes up, or a restore after the commit happened) finds it gone and
changes nothing. A restore from a checkpoint publishes what *the attempt that
took it* staged for epochs up to its epoch and discards what that attempt
staged after; another attempt's staging is never published, so a stale run
still writing cannot add or take away records. Every record is visible
exactly once. Without checkpoints everything becomes
``part-00000000-<instance>.jsonl`` when the job ends.

Staging of an attempt that never completed a checkpoint stays in
``.staging/<attempt>/`` (it is never published); delete it once that run is
known to be over.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import IO, Any

from streamlet.core.model import world
from streamlet.core.model.record import Batch, Record
from streamlet.core.model.sinks import ElementWriter, RestorePoint, Sink, SinkContext
from streamlet.core.model.sources import Source, SourceContext, SourceReader
from streamlet.core.state.durable import fsync_directory, seal

STAGING = ".staging"


class FileSource(Source):
    """The lines of a text file, one record each (key ``None``, value the line without its newline).

    Parallel instances split the file into byte ranges (a line belongs to the
    instance whose range holds its first byte). The position kept in
    checkpoints is the byte offset of the next line, so a restore re-reads
    nothing that was read before the checkpoint and skips nothing after it.
    """

    def __init__(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> None:
        self.path = Path(path)
        self.encoding = encoding

    def open(self, context: SourceContext) -> SourceReader:
        """A reader over this instance's byte range."""
        size = self.path.stat().st_size
        start = size * context.index // context.parallelism
        end = size * (context.index + 1) // context.parallelism
        return _FileReader(self.path, self.encoding, start, end, context)


class _FileReader(SourceReader):
    gives_elements = True  # (None, line, ts) tuples

    def __init__(self, path: Path, encoding: str, start: int, end: int, context: SourceContext) -> None:
        self._file: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed in aclose()
        self._encoding = encoding
        self._end = end
        self._clock = context.clock
        self._offset = start
        if start > 0:  # the line that straddles our start belongs to the previous range
            self._file.seek(start - 1)
            if self._file.read(1) != b"\n":
                self._file.readline()
            self._offset = self._file.tell()

    def _read_lines(self, max_records: int) -> list[str]:
        lines: list[str] = []
        file, end = self._file, self._end
        while len(lines) < max_records and self._offset < end:
            raw = file.readline()
            if not raw:
                break
            self._offset += len(raw)
            lines.append(raw.rstrip(b"\r\n").decode(self._encoding))
        return lines

    async def read(self, max_records: int) -> Batch | None:
        lines = await world.blocking(self._read_lines, max_records)
        if not lines:
            return None
        ts = self._clock.now()
        return [(None, line, ts) for line in lines]

    def position(self) -> int:
        return self._offset

    async def seek(self, position: Any) -> None:
        self._file.seek(position)
        self._offset = position

    async def aclose(self) -> None:
        self._file.close()


class FileSink(Sink):
    """JSON lines in ``directory``; exactly-once when the job takes checkpoints."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def exactly_once_with_checkpoints(self) -> bool:
        """Staged per checkpoint, renamed into place when it completes."""
        return True

    def open(self, context: SinkContext) -> ElementWriter:
        """A writer for instance ``context.index``, staging under ``context.attempt``."""
        return _FileWriter(self.directory, context.index, context.attempt)


def part_name(epoch: int, index: int) -> str:
    """Name of the visible file of ``epoch`` written by instance ``index``."""
    return f"part-{epoch:08d}-{index:04d}.jsonl"


def pending_name(epoch: int, index: int) -> str:
    """Name of the staged file of ``epoch`` written by instance ``index`` (in its attempt's staging)."""
    return f"{index:04d}-{epoch:08d}.pending"


def publish(staged: Path, target: Path) -> None:
    """Make ``staged`` visible as ``target`` by an atomic rename; doing it again changes nothing.

    ``staged`` gone means it was published already (or was empty and
    dropped): that is not an error. An empty one is dropped, not published.
    """
    with contextlib.suppress(FileNotFoundError):
        if staged.stat().st_size == 0:
            staged.unlink()
        else:
            os.replace(staged, target)
    fsync_directory(target.parent)


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (or gone): someone still stages there
        directory.rmdir()


class _FileWriter(ElementWriter):
    def __init__(self, directory: Path, index: int, attempt: str) -> None:
        self.directory = directory
        self.index = index
        self.attempt = attempt
        self.staging = directory / STAGING / attempt
        self.staging.mkdir(parents=True, exist_ok=True)
        self._current = self.staging / f"{index:04d}.inprogress"
        self._file: IO[str] = open(self._current, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, batch: Batch) -> None:
        dumps = json.dumps
        self._file.write("".join(dumps([e[0], e[1], e[2]]) + "\n" for e in batch))

    async def prepare_commit(self, epoch: int) -> None:
        await world.blocking(self._stage, epoch)

    def _stage(self, epoch: int) -> None:
        seal(self._file, self._current, self.staging / pending_name(epoch, self.index))
        self._file = open(self._current, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    async def commit(self, epoch: int) -> None:
        await world.blocking(self._publish, self.staging, epoch)

    def _publish(self, staging: Path, epoch: int) -> None:
        publish(staging / pending_name(epoch, self.index), self.directory / part_name(epoch, self.index))

    def restore(self, point: RestorePoint | None) -> None:
        if point is None or point.attempt is None:
            return  # nothing staged belongs to a completed checkpoint
        restored = self.directory / STAGING / point.attempt
        for staged in restored.glob(f"{self.index:04d}-*.pending"):
            epoch = int(staged.stem.split("-")[1])
            if epoch <= point.epoch:
                self._publish(restored, epoch)  # the checkpoint completed but the commit was cut short
            else:
                staged.unlink(missing_ok=True)  # never completed: the sources replay it
        if point.attempt != self.attempt:  # that run is over: what it had in progress was never staged
            (restored / f"{self.index:04d}.inprogress").unlink(missing_ok=True)
            _remove_if_empty(restored)

    def abort(self) -> None:
        self._file.close()  # what it holds is in no checkpoint: nothing will publish it
        self._current.unlink(missing_ok=True)
        _remove_if_empty(self.staging)  # pending epochs stay: one may be complete, for a restore to publish

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self._current.stat().st_size > 0:  # no checkpoints: what was written becomes visible now
            os.replace(self._current, self.directory / part_name(0, self.index))
        else:
            self._current.unlink()
        _remove_if_empty(self.staging)


def read_file_sink(directory: str | os.PathLike[str]) -> list[Record]:
    """Every visible record a ``FileSink`` wrote to ``directory``, in epoch then instance order."""
    records = []
    for path in sorted(Path(directory).glob("part-*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                key, value, ts = json.loads(line)
                records.append(Record(key, value, ts))
    return records
