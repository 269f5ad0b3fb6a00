"""Where checkpoints are kept: the ``CheckpointStore`` seam and two stores.

A checkpoint is one msgpack document (never pickle). The directory store
writes it to a temporary file, fsyncs, renames it into place and fsyncs the
directory, and frames it with a length and a CRC-32 so that a torn or
corrupted file is detected and skipped in favour of the previous checkpoint.
A write that fails (a full disk, say) leaves no temporary file and raises
:class:`~streamlet.errors.CheckpointError` naming the epoch and the file.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any, Protocol

import msgpack
import structlog

from streamlet.core.state.durable import reason, write_file
from streamlet.errors import CheckpointError

_MAGIC = b"STLTCKP1"
_HEADER = struct.Struct(">8sIQ")  # magic, crc32 of the body, body length
_PREFIX = "checkpoint-"

log = structlog.get_logger("streamlet")


class CheckpointStore(Protocol):
    """Keeps completed checkpoints by epoch.

    ``save`` gets the document already encoded (see :func:`encode`) and is
    called on the event loop: a plain method for fast local I/O (the
    directory store writes and fsyncs ~1 MB in about 2 ms), or ``async def``
    for slow or remote storage.
    """

    def save(self, epoch: int, data: bytes) -> Any:
        """Store the encoded checkpoint ``epoch`` durably (plain or ``async def``)."""
        ...

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint that reads back intact, or ``None``."""
        ...

    def epochs(self) -> list[int]:
        """Epochs stored, oldest first (intact or not)."""
        ...


def encode(snapshot: dict[str, Any]) -> bytes:
    """A snapshot as framed msgpack bytes."""
    body: bytes = msgpack.packb(snapshot, use_bin_type=True)
    return _HEADER.pack(_MAGIC, zlib.crc32(body), len(body)) + body


def decode(data: bytes) -> dict[str, Any]:
    """Framed bytes back to a snapshot; ``ValueError`` when torn or corrupt."""
    if len(data) < _HEADER.size:
        raise ValueError(f"truncated header ({len(data)} bytes)")
    magic, crc, length = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != _MAGIC:
        raise ValueError("not a streamlet checkpoint")
    if len(body) != length:
        raise ValueError(f"torn: {len(body)} of {length} bytes")
    if zlib.crc32(body) != crc:
        raise ValueError("checksum mismatch")
    snapshot = msgpack.unpackb(body, raw=False, strict_map_key=False, use_list=True)
    if not isinstance(snapshot, dict):
        raise ValueError("not a checkpoint document")
    return snapshot


class InMemoryCheckpointStore:
    """Checkpoints in this process's memory (encoded, as a directory store would keep them)."""

    def __init__(self) -> None:
        self._data: dict[int, bytes] = {}

    def save(self, epoch: int, data: bytes) -> None:
        """Keep the encoded checkpoint."""
        self._data[epoch] = data

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest intact checkpoint."""
        return _newest_intact(self.epochs(), lambda epoch: self._data[epoch])

    def epochs(self) -> list[int]:
        """Stored epochs, oldest first."""
        return sorted(self._data)

    def corrupt(self, epoch: int, data: bytes) -> None:
        """Replace a stored checkpoint's bytes (for tests of torn checkpoints)."""
        self._data[epoch] = data


class DirectoryCheckpointStore:
    """Checkpoints as files ``checkpoint-<epoch>.msgpack`` in ``directory``; keeps the newest ``keep``."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        self.directory = Path(directory)
        self.keep = keep
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, no permission: say which directory, at once
            raise CheckpointError(f"cannot use {self.directory} as the checkpoint directory: {exc}") from exc

    def path(self, epoch: int) -> Path:
        """The file of checkpoint ``epoch``."""
        return self.directory / f"{_PREFIX}{epoch:010d}.msgpack"

    def save(self, epoch: int, data: bytes) -> None:
        """Write, fsync, rename into place, fsync the directory; then drop old checkpoints.

        Raises :class:`~streamlet.errors.CheckpointError` (from the ``OSError``)
        when the file cannot be written; no temporary file is left.
        """
        final = self.path(epoch)
        try:
            write_file(final, data)
        except OSError as exc:
            raise CheckpointError(f"cannot save checkpoint {epoch} to {final}: {reason(exc)}") from exc
        for old in self.epochs()[: -self.keep]:
            os.unlink(self.path(old))

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint file that reads back intact."""
        return _newest_intact(self.epochs(), lambda epoch: self.path(epoch).read_bytes())

    def epochs(self) -> list[int]:
        """Epochs with a file, oldest first."""
        found = []
        for name in os.listdir(self.directory):
            digits = name.removeprefix(_PREFIX).removesuffix(".msgpack")
            if name.startswith(_PREFIX) and name.endswith(".msgpack") and digits.isdigit():
                found.append(int(digits))
        return sorted(found)


def _newest_intact(epochs: list[int], read: Any) -> tuple[int, dict[str, Any]] | None:
    for epoch in reversed(epochs):
        try:
            return epoch, decode(read(epoch))
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            log.warning("skipping unreadable checkpoint", epoch=epoch, reason=str(exc))
    return None
