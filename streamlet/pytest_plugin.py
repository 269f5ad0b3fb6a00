"""pytest plugin shipped with streamlet: fixtures for testing topologies."""

from __future__ import annotations

import pytest

from streamlet.core.runtime.clock import ManualClock


@pytest.fixture
def manual_clock() -> ManualClock:
    """A :class:`~streamlet.testing.ManualClock` at time 0, advanced only by the test."""
    return ManualClock(start=0.0)
