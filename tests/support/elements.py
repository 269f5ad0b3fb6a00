"""Batches as the runtime carries them, for tests that drive its parts (windows, channels, codecs) directly."""

from __future__ import annotations

from typing import Any

from streamlet.core.model.record import Element


def el(key: Any, value: Any, ts: float | None = None) -> Element:
    """The element of a record ``(key, value, ts)``, as the runtime carries it."""
    return (key, value, ts)
