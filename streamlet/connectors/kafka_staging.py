"""Local, durable staging of a transactional ``KafkaSink``'s records, one file per checkpoint epoch.

Files live in ``<staging_dir>/<transactional id>/<attempt>/``: each run of
the job (its attempt, see ``SinkContext``) stages apart, so a stale run still
writing never touches the files of the run that replaced it. ``inprogress``
collects what is written since the last barrier; ``prepare(epoch)`` fsyncs
it and renames it to ``<epoch>.pending``. Each file is a stream of msgpack
arrays (one per batch) of ``[key, value, timestamp_ms, headers]`` with key
and value already serialized, so what is staged is exactly what will be
produced. Nothing here is pickled.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgpack

from streamlet.core.state.durable import fsync_directory, seal

StagedRecord = list[Any]  # [key bytes | None, value bytes | None, timestamp ms | None, [[name, bytes], ...]]
INPROGRESS = "inprogress"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def attempt_directory(root: Path, transactional_id: str, attempt: str) -> Path:
    """Where run ``attempt`` of the instance with ``transactional_id`` stages."""
    return root / _safe(transactional_id) / _safe(attempt)


class StagedEpochs:
    """The sealed epochs in one attempt's staging directory (this run's, or the one a restore finishes)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, epoch: int) -> Path:
        """Where epoch ``epoch``'s records wait for their transaction."""
        return self.directory / f"{epoch:08d}.pending"

    def epochs(self) -> list[int]:
        """Staged epochs, oldest first."""
        return sorted(int(path.stem) for path in self.directory.glob("*.pending"))

    def read(self, epoch: int) -> Iterator[StagedRecord]:
        """The records staged for ``epoch``, in order."""
        yield from _records(self.path(epoch))

    def remove(self, epochs: list[int]) -> None:
        """Forget epochs that are published (or discarded)."""
        for epoch in epochs:
            self.path(epoch).unlink(missing_ok=True)
        if self.directory.exists():
            fsync_directory(self.directory)

    def discard_inprogress(self) -> None:
        """Drop what a finished run had in progress (it was never part of a checkpoint)."""
        (self.directory / INPROGRESS).unlink(missing_ok=True)

    def remove_if_empty(self) -> None:
        """Delete the directory once nothing is staged in it."""
        with contextlib.suppress(OSError):  # not empty (or gone): a run still stages there
            self.directory.rmdir()


def _records(path: Path) -> Iterator[StagedRecord]:
    with open(path, "rb") as handle:
        for batch in msgpack.Unpacker(handle, raw=False, max_buffer_size=64 * 1024 * 1024):
            yield from batch


class Staging(StagedEpochs):
    """This run's staging for one sink instance: ``inprogress`` and its sealed epochs."""

    def __init__(self, root: Path, transactional_id: str, attempt: str) -> None:
        super().__init__(attempt_directory(root, transactional_id, attempt))
        self.root, self.transactional_id = root, transactional_id
        self.directory.mkdir(parents=True, exist_ok=True)
        self.current = self.directory / INPROGRESS
        self.file: IO[bytes] = open(self.current, "wb")  # noqa: SIM115 - closed in close()
        self.staged_bytes = 0  # written to ``inprogress`` since it was opened

    def of_attempt(self, attempt: str) -> StagedEpochs:
        """The sealed epochs run ``attempt`` of this instance left (a restore finishes them)."""
        return StagedEpochs(attempt_directory(self.root, self.transactional_id, attempt))

    def append(self, records: list[StagedRecord]) -> None:
        """Stage one batch."""
        data = msgpack.packb(records, use_bin_type=True)
        self.file.write(data)
        self.staged_bytes += len(data)

    def prepare(self, epoch: int) -> None:
        """Make ``inprogress`` durable as epoch ``epoch`` and start a new one."""
        seal(self.file, self.current, self.path(epoch))
        self.file = open(self.current, "wb")  # noqa: SIM115 - closed in close()
        self.staged_bytes = 0

    def read_current(self) -> Iterator[StagedRecord]:
        """What ``inprogress`` holds (a job without checkpoints publishes it at the end)."""
        self.file.flush()
        yield from _records(self.current)

    def close(self) -> None:
        """Close ``inprogress`` (what it holds was never part of a checkpoint: nothing will produce it)."""
        self.file.close()
