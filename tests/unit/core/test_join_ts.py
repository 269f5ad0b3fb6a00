"""An event-time join takes a record's ts when it is a number of seconds (an int or a float) and refuses any
other with a TaskError naming the task, the instance, the port and the key (``JoinTask.check_ts``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.model.joins.base import JoinTask, _instance_of, _task_name
from streamlet.core.model.ports import Inputs

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB


def _check(ts: Any, where: str = "task 'j' instance 3") -> float:
    topology = sl.Topology("ts")
    topology.interval_join("j", -1.0, 1.0)  # any join: check_ts is theirs
    make_task = topology.nodes["j"].make_task
    assert make_task is not None
    task = make_task()
    assert isinstance(task, JoinTask)
    return task.check_ts(("k", "v", ts), 1, Inputs(2, where=where))


@pytest.mark.parametrize("ts", [0, 7, -2, 1.5, 0.0])
def test_ints_and_floats_are_seconds(ts: Any) -> None:
    assert _check(ts) == ts


@pytest.mark.parametrize(
    ("ts", "rule"), [(None, "has no ts"), ("9", "has ts '9'"), (True, "has ts True"), (math.nan, "has ts nan")]
)
def test_anything_else_is_refused_naming_task_instance_port_and_key(ts: Any, rule: str) -> None:
    with pytest.raises(sl.TaskError) as raised:
        _check(ts)
    assert str(raised.value) == (
        f"task 'j' instance 3 input port 1: the record with key 'k' {rule}; "
        "an event-time join needs ts in seconds (an int or a float)"
    )
    assert (raised.value.task, raised.value.instance, raised.value.key) == ("j", 3, "k")


def test_where_is_read_for_the_task_and_instance() -> None:
    assert (_task_name("task 'my join' instance 12"), _instance_of("task 'my join' instance 12")) == ("my join", 12)
    assert (_task_name("this task"), _instance_of("this task")) == ("this task", 0)
    assert _task_name("task 'a' b 'c'") == "a"
    assert _task_name("one ' quote") == "one ' quote"
    assert _instance_of("solo") == 0  # no space at all: no instance named
