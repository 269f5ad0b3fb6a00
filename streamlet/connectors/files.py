"""Files: ``FileSource`` (lines, replayable by byte offset) and ``FileSink`` (exactly-once with checkpoints).

``FileSink`` writes JSON lines. With checkpoints it is transactional: what
an instance writes goes to a staging file; at ``prepare_commit(epoch)`` that
file is fsynced and set aside for the epoch; at ``commit(epoch)`` (the
checkpoint is complete) it is renamed to a visible
``part-<epoch>-<instance>.jsonl``. A restore commits what was staged for
completed epochs and discards the rest, so every record is visible exactly
once. Without checkpoints everything becomes ``part-00000000-<instance>.jsonl``
when the job ends.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

import anyio

from streamlet.core.durable import fsync_directory, seal
from streamlet.core.record import Batch, Record
from streamlet.core.sinks import Sink, SinkContext, SinkWriter
from streamlet.core.sources import Source, SourceContext, SourceReader

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
        lines = await anyio.to_thread.run_sync(self._read_lines, max_records)
        if not lines:
            return None
        ts = self._clock.now()
        return [Record(None, line, ts) for line in lines]

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

    def open(self, context: SinkContext) -> SinkWriter:
        """A writer for instance ``context.index``."""
        return _FileWriter(self.directory, context.index)


def part_name(epoch: int, index: int) -> str:
    """Name of the visible file of ``epoch`` written by instance ``index``."""
    return f"part-{epoch:08d}-{index:04d}.jsonl"


class _FileWriter(SinkWriter):
    def __init__(self, directory: Path, index: int) -> None:
        self.directory = directory
        self.index = index
        self.staging = directory / STAGING
        self.staging.mkdir(parents=True, exist_ok=True)
        self._current = self.staging / f"{index:04d}.inprogress"
        self._file: IO[str] = open(self._current, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def _staged(self, epoch: int) -> Path:
        return self.staging / f"{self.index:04d}-{epoch:08d}.pending"

    def write(self, batch: Batch) -> None:
        dumps = json.dumps
        self._file.write("".join(dumps([r.key, r.value, r.ts]) + "\n" for r in batch))

    async def prepare_commit(self, epoch: int) -> None:
        await anyio.to_thread.run_sync(self._stage, epoch)

    def _stage(self, epoch: int) -> None:
        seal(self._file, self._current, self._staged(epoch))
        self._file = open(self._current, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    async def commit(self, epoch: int) -> None:
        await anyio.to_thread.run_sync(self._publish, epoch)

    def _publish(self, epoch: int) -> None:
        staged = self._staged(epoch)
        if staged.stat().st_size == 0:
            staged.unlink()
        else:
            os.replace(staged, self.directory / part_name(epoch, self.index))
        fsync_directory(self.directory)

    def restore(self, epoch: int | None) -> None:
        for staged in self.staging.glob(f"{self.index:04d}-*.pending"):
            staged_epoch = int(staged.stem.split("-")[1])
            if epoch is not None and staged_epoch <= epoch:
                self._publish(staged_epoch)  # the checkpoint completed but the commit was cut short
            else:
                staged.unlink()

    def abort(self) -> None:
        self._file.close()  # what it holds is uncommitted: a restore discards it

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


def read_file_sink(directory: str | os.PathLike[str]) -> list[Record]:
    """Every visible record a ``FileSink`` wrote to ``directory``, in epoch then instance order."""
    records = []
    for path in sorted(Path(directory).glob("part-*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                key, value, ts = json.loads(line)
                records.append(Record(key, value, ts))
    return records
