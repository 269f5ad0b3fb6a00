"""What the joins refuse when the topology is built, each refusal's exact words, and the window a window join
runs on (``core.model.joins.checks``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.model.joins.checks import join_window


@pytest.mark.parametrize(
    ("lower", "upper", "message"),
    [
        ("x", 1.0, "task 'j': lower must be a number of seconds, got 'x'"),
        (True, 1.0, "task 'j': lower must be a number of seconds, got True"),
        (math.inf, 1.0, "task 'j': lower must be a number of seconds, got inf"),
        (0.0, None, "task 'j': upper must be a number of seconds, got None"),
        (0.0, False, "task 'j': upper must be a number of seconds, got False"),
        (0.0, math.nan, "task 'j': upper must be a number of seconds, got nan"),
        (2.0, 1.0, "task 'j': lower (2.0) must be at most upper (1.0)"),
    ],
    ids=["str", "bool", "inf", "none", "false", "nan", "reversed"],
)
def test_an_interval_join_refuses_bounds_that_are_not_seconds(lower: Any, upper: Any, message: str) -> None:
    with pytest.raises(sl.TopologyError) as raised:
        sl.Topology("checks").interval_join("j", lower, upper)
    assert str(raised.value) == message


def test_an_interval_join_takes_ints_floats_and_equal_bounds() -> None:
    topology = sl.Topology("checks")
    topology.interval_join("ints", -1, 2)
    topology.interval_join("equal", 1.5, 1.5)
    assert {"ints", "equal"} <= set(topology.nodes)


@pytest.mark.parametrize(
    "window",
    [sl.TimeWindow(10, time="event", early_firing=1), sl.TimeWindow(10, time="event", allowed_lateness=2)],
    ids=["early_firing", "allowed_lateness"],
)
def test_a_window_join_fires_each_window_once(window: sl.TimeWindow) -> None:
    with pytest.raises(sl.TopologyError) as raised:
        join_window("w", window)
    assert str(raised.value) == (
        "task 'w': window_join fires each window once (its pairs would come out again): no allowed_lateness or "
        "early_firing; late records go to the LATE port"
    )


def test_a_window_join_names_itself_in_the_windows_own_refusal() -> None:
    with pytest.raises(sl.TopologyError, match=r"^task 'w': "):
        join_window("w", sl.TimeWindow(0, time="event"))


def test_a_window_join_on_event_time_refuses_records_without_ts_and_on_processing_time_takes_them() -> None:
    """Event time: missing_ts='clock' becomes 'fail' (as every event-time join); processing time keeps 'clock'."""
    assert join_window("w", sl.TimeWindow(10, time="event")).missing_ts == "fail"
    assert join_window("w", sl.TimeWindow(10)).missing_ts == "clock"
    assert join_window("w", sl.SessionWindow(5, time="event")).missing_ts == "fail"
    kept = sl.TimeWindow(10, time="event", missing_ts="fail")
    assert join_window("w", kept) is kept
