"""Tests that configure logging (as the ``streamlet`` command does) put it back as it was."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import structlog


@contextmanager
def restored_logging() -> Iterator[None]:
    """Within the block structlog and the root logger may be configured; afterwards they are as before."""
    configured, config = structlog.is_configured(), structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        if configured:
            structlog.configure(**config)
        else:
            structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)
