"""Where checkpoints are kept: the ``CheckpointStore`` seam and two stores.

A checkpoint is one msgpack document (never pickle), encoded with
:func:`~streamlet.core.model.encoding.packb` so that every value comes back
with its types (tuples stay tuples). The directory store writes it to a
temporary file, fsyncs, renames it into place and fsyncs the directory, and
frames it with a format version, a length and a CRC-32 so that a torn or
corrupted file is detected and skipped in favour of the previous checkpoint.
A write that fails (a full disk, say) leaves no temporary file and raises
:class:`~streamlet.errors.CheckpointError` naming the epoch and the file.

The frame::

    magic "STLTCKPT" (8) | format version (2) | CRC-32 of version and body (4) | body length (8) | body

Format versions: 2 is this one. 1 (magic ``STLTCKP1``, no version field,
written by streamlet before values round-tripped exactly) stored tuples as
lists, and nothing in it says which lists were tuples: reading it would
restore state whose types changed. So an intact checkpoint of format 1, or
of a version this code does not know, is refused with a ``CheckpointError``
naming the file and the version (not skipped: resuming from an older
checkpoint, or afresh, would silently redo or lose work). A torn or corrupt
file of any version is skipped, as it always was.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgpack
import structlog

from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.state.changelog import chunks_named, digest, resolve
from streamlet.core.state.durable import reason, write_file
from streamlet.errors import CheckpointError

FORMAT_VERSION = 2
"""The checkpoint format :func:`encode` writes and :func:`decode` reads (see the module docstring)."""

_MAGIC = b"STLTCKPT"
_HEADER = struct.Struct(">8sHIQ")  # magic, format version, crc32 of version and body, body length
_VERSION = struct.Struct(">H")
_LEGACY_MAGIC = b"STLTCKP1"  # format 1
_LEGACY_HEADER = struct.Struct(">8sIQ")  # magic, crc32 of the body, body length
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
        """The newest checkpoint that reads back intact, or ``None``; one of a format this
        streamlet does not read raises :class:`~streamlet.errors.CheckpointError`."""
        ...

    def epochs(self) -> list[int]:
        """Epochs stored, oldest first (intact or not)."""
        ...


class ChunkStore(Protocol):
    """A :class:`CheckpointStore` that also keeps the chunks of incremental checkpoints (RocksDB state's,
    ``core.state.changelog``): a chunk is saved once under its digest and shared by every checkpoint whose
    chain names it; ``latest`` puts the chunks' bytes back into the document it returns, and chunks no
    document kept names any more are removed. With ``incremental`` false, checkpoints are written whole."""

    incremental: bool

    def save_chunk(self, name: str, data: bytes) -> None:
        """Keep ``data`` under ``name`` (its digest), durably, before the document naming it is saved."""
        ...


def keeps_chunks(store: CheckpointStore) -> bool:
    """Whether ``store`` takes incremental checkpoints (a :class:`ChunkStore` with ``incremental`` on)."""
    return bool(getattr(store, "incremental", False)) and callable(getattr(store, "save_chunk", None))


def checked_chunk(name: str, data: bytes) -> bytes:
    """A chunk read back, refused (``ValueError``) unless its content is the digest it is named by."""
    if digest(data) != name:
        raise ValueError(f"changelog chunk {name} is damaged")
    return data


def encode(snapshot: dict[str, Any]) -> bytes:
    """A snapshot as framed bytes of format :data:`FORMAT_VERSION`.

    Raises ``TypeError``, ``ValueError`` or ``OverflowError`` for a value
    that cannot be encoded (the coordinator says whose it is).
    """
    body = packb(snapshot)
    version = _VERSION.pack(FORMAT_VERSION)
    return _HEADER.pack(_MAGIC, FORMAT_VERSION, zlib.crc32(body, zlib.crc32(version)), len(body)) + body


def decode(data: bytes, source: str = "checkpoint") -> dict[str, Any]:
    """Framed bytes back to a snapshot.

    ``ValueError`` when torn or corrupt (a store skips the file); a
    :class:`~streamlet.errors.CheckpointError` naming ``source`` (the file)
    when the frame is intact but of another format version.
    """
    if data[: len(_LEGACY_MAGIC)] == _LEGACY_MAGIC:
        _check_legacy(data)
        raise CheckpointError(
            f"{source} is a checkpoint of format version 1, from a streamlet that stored tuples as lists; "
            f"this streamlet reads format version {FORMAT_VERSION} only and will not guess which lists were tuples: "
            "finish the job with the streamlet that wrote it, or move the checkpoint directory away to start afresh"
        )
    if len(data) < _HEADER.size:
        raise ValueError(f"truncated header ({len(data)} bytes)")
    magic, version, crc, length = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != _MAGIC:
        raise ValueError("not a streamlet checkpoint")
    if len(body) != length:
        raise ValueError(f"torn: {len(body)} of {length} bytes")
    if zlib.crc32(body, zlib.crc32(_VERSION.pack(version))) != crc:
        raise ValueError("checksum mismatch")
    if version != FORMAT_VERSION:  # intact (the CRC covers the version), so written that way on purpose
        raise CheckpointError(
            f"{source} is a checkpoint of format version {version}; "
            f"this streamlet reads format version {FORMAT_VERSION} only"
        )
    snapshot = unpackb(body)
    if not isinstance(snapshot, dict):
        raise ValueError("not a checkpoint document")
    return snapshot


def _check_legacy(data: bytes) -> None:
    """A format 1 frame that is torn or corrupt is skipped like any other (``ValueError``); else return."""
    if len(data) < _LEGACY_HEADER.size:
        raise ValueError(f"truncated header ({len(data)} bytes)")
    _magic, crc, length = _LEGACY_HEADER.unpack_from(data)
    body = data[_LEGACY_HEADER.size :]
    if len(body) != length:
        raise ValueError(f"torn: {len(body)} of {length} bytes")
    if zlib.crc32(body) != crc:
        raise ValueError("checksum mismatch")


class InMemoryCheckpointStore:
    """Checkpoints in this process's memory (encoded, as a directory store would keep them), with the chunks
    of incremental checkpoints (:class:`ChunkStore`; ``incremental=False``: whole checkpoints only)."""

    def __init__(self, incremental: bool = True) -> None:
        self._data: dict[int, bytes] = {}
        self.chunks: dict[str, bytes] = {}
        self.incremental = incremental

    def save(self, epoch: int, data: bytes) -> None:
        """Keep the encoded checkpoint."""
        self._data[epoch] = data

    def save_chunk(self, name: str, data: bytes) -> None:
        """Keep a chunk of an incremental checkpoint."""
        self.chunks[name] = data

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest intact checkpoint (with its chunks)."""
        return _newest_intact(
            self.epochs(), lambda epoch: self._data[epoch], lambda epoch: f"checkpoint {epoch}", self._chunk
        )

    def _chunk(self, name: str) -> bytes:
        if name not in self.chunks:
            raise ValueError(f"changelog chunk {name} is missing")
        return checked_chunk(name, self.chunks[name])

    def epochs(self) -> list[int]:
        """Stored epochs, oldest first."""
        return sorted(self._data)

    def corrupt(self, epoch: int, data: bytes) -> None:
        """Replace a stored checkpoint's bytes (for tests of torn checkpoints)."""
        self._data[epoch] = data


class DirectoryCheckpointStore:
    """Checkpoints as files ``checkpoint-<epoch>.msgpack`` in ``directory``; keeps the newest ``keep``.

    The chunks of incremental checkpoints (:class:`ChunkStore`) are files ``chunks/<digest>.chunk``, removed
    once no checkpoint kept names them; ``incremental=False`` writes every checkpoint whole.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3, incremental: bool = True) -> None:
        self.directory = Path(directory)
        self.keep = keep
        self.incremental = incremental
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
        dropped = self.epochs()[: -self.keep]
        for old in dropped:
            os.unlink(self.path(old))
        if dropped:
            self.drop_unnamed_chunks()

    def chunk_path(self, name: str) -> Path:
        """The file of chunk ``name``."""
        return self.directory / "chunks" / f"{name}.chunk"

    def save_chunk(self, name: str, data: bytes) -> None:
        """Write a chunk (once: a chunk's name is its content's digest) and fsync it."""
        path = self.chunk_path(name)
        if path.exists():
            return
        try:
            path.parent.mkdir(exist_ok=True)
            write_file(path, data)
        except OSError as exc:
            raise CheckpointError(f"cannot save changelog chunk {path}: {reason(exc)}") from exc

    def has_chunk(self, name: str) -> bool:
        """Whether chunk ``name`` is here (intact or not)."""
        return self.chunk_path(name).exists()

    def read_chunk(self, name: str) -> bytes:
        """Chunk ``name``'s bytes; ``ValueError`` when it is missing or damaged."""
        return self._chunk(name)

    def read(self, epoch: int) -> dict[str, Any]:
        """Checkpoint ``epoch`` with its chunks' bytes in (whole snapshots); ``ValueError`` / ``OSError`` when
        it, or a chunk it names, is missing, torn or corrupt."""
        path = self.path(epoch)
        return resolve(decode(path.read_bytes(), str(path)), self._chunk)

    def drop_unnamed_chunks(self) -> None:
        """Remove the chunks no checkpoint kept names (an unreadable checkpoint keeps every chunk: it may be
        read again)."""
        folder = self.directory / "chunks"
        if not folder.is_dir():
            return
        named: set[str] = set()
        for epoch in self.epochs():
            try:
                named |= chunks_named(decode(self.path(epoch).read_bytes(), str(self.path(epoch))))
            except (OSError, ValueError, CheckpointError, msgpack.UnpackException):
                return
        for path in folder.glob("*.chunk"):
            if path.stem not in named:
                path.unlink(missing_ok=True)

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint file that reads back intact (with every chunk it names).

        Raises :class:`~streamlet.errors.CheckpointError` when that file is of
        another format version (see the module docstring).
        """
        return _newest_intact(
            self.epochs(), lambda epoch: self.path(epoch).read_bytes(), lambda e: str(self.path(e)), self._chunk
        )

    def _chunk(self, name: str) -> bytes:
        try:
            data = self.chunk_path(name).read_bytes()
        except OSError as exc:
            raise ValueError(f"changelog chunk {name}: {reason(exc)}") from exc
        return checked_chunk(name, data)

    def epochs(self) -> list[int]:
        """Epochs with a file, oldest first."""
        found = []
        for name in os.listdir(self.directory):
            digits = name.removeprefix(_PREFIX).removesuffix(".msgpack")
            if name.startswith(_PREFIX) and name.endswith(".msgpack") and digits.isdigit():
                found.append(int(digits))
        return sorted(found)


def _newest_intact(
    epochs: list[int], read: Callable[[int], bytes], name: Callable[[int], str], chunk: Callable[[str], bytes]
) -> tuple[int, dict[str, Any]] | None:
    """Newest first: torn or corrupt checkpoints (or chunks) are skipped; one of another format version raises."""
    for epoch in reversed(epochs):
        try:
            return epoch, resolve(decode(read(epoch), name(epoch)), chunk)
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            log.warning("skipping unreadable checkpoint", epoch=epoch, reason=str(exc))
    return None
