"""Small helpers for writing files that survive a crash."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any


def fsync_directory(directory: Path) -> None:
    """Make renames and new files in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(file: IO[Any], current: Path, target: Path) -> None:
    """Make what ``file`` (open on ``current``) holds durable as ``target``: flush, fsync, close, rename."""
    file.flush()
    os.fsync(file.fileno())
    file.close()
    os.replace(current, target)
    fsync_directory(target.parent)
