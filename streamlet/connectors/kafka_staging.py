"""Local, durable staging of a transactional ``KafkaSink``'s records, one file per checkpoint epoch.

Files live in ``<staging_dir>/<transactional id>/``: ``inprogress`` collects
what is written since the last barrier; ``prepare(epoch)`` fsyncs it and
renames it to ``<epoch>.pending``. Each file is a stream of msgpack arrays
(one per batch) of ``[key, value, timestamp_ms, headers]`` with key and value
already serialized, so what is staged is exactly what will be produced.
Nothing here is pickled.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgpack

from streamlet.core.durable import fsync_directory, seal

StagedRecord = list[Any]  # [key bytes | None, value bytes | None, timestamp ms | None, [[name, bytes], ...]]


class Staging:
    """The staged epochs of one sink instance."""

    def __init__(self, root: Path, transactional_id: str) -> None:
        self.directory = root / re.sub(r"[^A-Za-z0-9._-]", "_", transactional_id)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.current = self.directory / "inprogress"
        self.file: IO[bytes] = open(self.current, "wb")  # noqa: SIM115 - closed in close()
        self.staged_bytes = 0  # written to ``inprogress`` since it was opened

    def path(self, epoch: int) -> Path:
        """Where epoch ``epoch``'s records wait for their transaction."""
        return self.directory / f"{epoch:08d}.pending"

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

    def epochs(self) -> list[int]:
        """Staged epochs, oldest first."""
        return sorted(int(path.stem) for path in self.directory.glob("*.pending"))

    def read(self, epoch: int) -> Iterator[StagedRecord]:
        """The records staged for ``epoch``, in order."""
        with open(self.path(epoch), "rb") as handle:
            for batch in msgpack.Unpacker(handle, raw=False, max_buffer_size=64 * 1024 * 1024):
                yield from batch

    def read_current(self) -> Iterator[StagedRecord]:
        """What ``inprogress`` holds (a job without checkpoints publishes it at the end)."""
        self.file.flush()
        with open(self.current, "rb") as handle:
            for batch in msgpack.Unpacker(handle, raw=False, max_buffer_size=64 * 1024 * 1024):
                yield from batch

    def remove(self, epochs: list[int]) -> None:
        """Forget epochs that are published (or discarded)."""
        for epoch in epochs:
            self.path(epoch).unlink(missing_ok=True)
        fsync_directory(self.directory)

    def close(self) -> None:
        """Close ``inprogress`` (what it holds was never part of a checkpoint: a restore drops it)."""
        self.file.close()
