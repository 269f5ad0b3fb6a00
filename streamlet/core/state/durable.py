"""Small helpers for writing files that survive a crash.

When a write fails (a full disk, a quota, an I/O error) they leave no
temporary file behind, and the ``OSError`` they raise names the file.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Any


def fsync_directory(directory: Path) -> None:
    """Make renames and new files in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        _name(exc, directory)
        raise
    finally:
        os.close(fd)


def seal(file: IO[Any], current: Path, target: Path) -> None:
    """Make what ``file`` (open on ``current``) holds durable as ``target``: flush, fsync, close, rename.

    If that fails, ``file`` is closed and ``current`` removed: what it held
    was never made durable, and a restore starts it again.
    """
    try:
        file.flush()
        os.fsync(file.fileno())
        file.close()
        os.replace(current, target)
    except OSError as exc:
        _name(exc, current)
        with contextlib.suppress(OSError):  # closing flushes again, which fails again; the descriptor is freed anyway
            file.close()
        with contextlib.suppress(OSError):
            current.unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)


def write_file(target: Path, data: bytes) -> None:
    """Write ``data`` durably as ``target``: into ``<target>.tmp``, fsync, rename, fsync the directory.

    On any failure the temporary file is removed and ``target`` is as it was.
    """
    temporary = target.with_suffix(".tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)


def reason(error: OSError) -> str:
    """``[Errno 28] No space left on device``: the OS error without the file names (the caller names the file)."""
    if error.errno is None or error.strerror is None:
        return str(error)
    return f"[Errno {error.errno}] {error.strerror}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _name(error: OSError, path: Path) -> None:
    # flush() and fsync() report errors without a file name: say which file it was
    if error.filename is None:
        error.filename = str(path)
