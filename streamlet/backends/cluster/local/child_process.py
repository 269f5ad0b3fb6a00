"""Stopping a child process this process started: by its PID, never by name."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_child(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM the child, SIGKILL it if it has not ended after ``timeout``, and reap it."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
