"""An event-time join's index of due keys (``EventTimeJoin.advance``), on a join task driven by hand: the keys due
at a rise are those whose time the watermark passed (not reached), a key emptied at one rise leaves the state at
the next unless a record of it came first, a key that left the state is dropped from the index without holding up
the others, and the end of the input may come after the watermark already reached +infinity.

Each test makes the task as the topology builds it, gives it keyed state and timers as the runtime does, feeds it
batches through ``execute`` and raises the watermark with ``advance`` (setting ``timers.watermark`` first, as the
runtime does); what it emits is collected per port.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import streamlet as sl
from streamlet.core.model.joins.base import EventTimeJoin
from streamlet.core.model.ports import Inputs
from streamlet.core.model.timers import Timers
from streamlet.core.state.keyed import KeyedState

Element = tuple[Any, Any, float]


class Emitted:
    """Outputs that keep what the join emits, as ``(port, element)`` in order."""

    ts: float | None = None

    def __init__(self) -> None:
        self.elements: list[tuple[int, Element]] = []

    def emit_elements(self, batch: list[Element], port: int = 0) -> None:
        self.elements.extend((port, element) for element in batch)

    def taken(self) -> list[tuple[int, Element]]:
        """What was emitted since the last call."""
        taken, self.elements = self.elements, []
        return taken


class Driven:
    """A join task 'j' as an instance runs it: its state, timers and watermark, fed by hand."""

    def __init__(self, add: Callable[[sl.Topology], Any]) -> None:
        topology = sl.Topology("index")
        add(topology)
        make_task = topology.nodes["j"].make_task
        assert make_task is not None
        task = make_task()
        assert isinstance(task, EventTimeJoin)
        task.state = KeyedState()
        task.timers = Timers()
        self.task = task
        self.inputs = Inputs(2, where="task 'j' instance 0")
        self.out = Emitted()

    def send(self, port: int, *elements: Element) -> list[tuple[int, Element]]:
        """One batch on ``port``; what the join emitted for it."""
        self.inputs.set_one(port, list(elements))
        self.task.execute(self.inputs, self.out)  # type: ignore[arg-type]
        return self.out.taken()

    def rise(self, watermark: float) -> list[tuple[int, Element]]:
        """The watermark rises to ``watermark``; what the join emitted."""
        self.task.timers.watermark = watermark
        self.task.advance(watermark, self.out)  # type: ignore[arg-type]
        return self.out.taken()

    def keys(self) -> list[Any]:
        """The keys the join has an entry for in its state."""
        return sorted(self.task.state.values)

    def held(self) -> int:
        return self.task.hooks.counters.held


def interval(lower: float, upper: float, how: str = "inner") -> Callable[[sl.Topology], Any]:
    return lambda topology: topology.interval_join("j", lower, upper, how=how)


def asof(grace: float) -> Callable[[sl.Topology], Any]:
    return lambda topology: topology.asof_join("j", grace=grace)


def test_a_key_emptied_at_a_rise_leaves_the_state_at_the_next_rise() -> None:
    """interval [0, 0.5]: the left at 1 closes once W passes 1.5; at W=2 its entry holds nothing, at W=3 it is gone
    while the key still holding a record stays."""
    join = Driven(interval(0.0, 0.5))
    join.send(sl.LEFT, ("k", "l", 1.0), ("y", "m", 10.0))
    assert join.rise(2.0) == []
    assert (join.keys(), join.held()) == (["k", "y"], 1)
    assert join.rise(3.0) == []
    assert (join.keys(), join.held()) == (["y"], 1)


def test_a_key_emptied_at_a_rise_keeps_a_record_that_came_before_the_next_rise() -> None:
    """The right at 2.5 of a key emptied at W=2 is held through the next rise (W=2.2) and pairs with a left at 2.3
    (2.3 <= 2.5 <= 2.8)."""
    join = Driven(interval(0.0, 0.5))
    join.send(sl.LEFT, ("k", "l1", 1.0))
    join.rise(2.0)
    assert join.send(sl.RIGHT, ("k", "r", 2.5)) == []
    assert join.rise(2.2) == []
    assert (join.keys(), join.held()) == (["k"], 1)
    assert join.send(sl.LEFT, ("k", "l2", 2.3)) == [(0, ("k", ("l2", "r"), 2.5))]


def test_a_key_that_left_the_state_is_dropped_from_the_index_and_the_keys_due_after_it_are_still_done() -> None:
    """Left outer join [0, 0.5]: 'gone' (due after 1.5) leaves the state as a rescale moving it away would; at W=2
    'stays' (due after 1.7) still comes out unpaired, and 'gone' is never looked at again."""
    join = Driven(interval(0.0, 0.5, "left"))
    join.send(sl.LEFT, ("gone", "g", 1.0), ("stays", "s", 1.2))
    del join.task.state.values["gone"]
    assert join.rise(2.0) == [(0, ("stays", ("s", None), 1.2))]
    assert join.rise(3.0) == []
    assert join.keys() == []


def test_the_input_may_end_after_the_watermark_reached_infinity() -> None:
    """W=+inf emits every unpaired left and holds nothing; the end of the input that follows (the runtime's
    ``advance(inf)`` once more) finds nothing left to do."""
    join = Driven(interval(0.0, 0.5, "left"))
    join.send(sl.LEFT, ("k", "l", 1.0))
    assert join.rise(math.inf) == [(0, ("k", ("l", None), 1.0))]
    assert join.rise(math.inf) == []
    assert (join.keys(), join.held()) == ([], 0)


def test_asof_a_key_is_not_looked_at_when_the_watermark_only_reaches_its_due_time() -> None:
    """grace=0.7: the version at 0 retires once W reaches 3 + 0.7 (3.7); the key is due once W passes the float
    just below 3.7, so at W=3.6999999999999997 (where W - 0.7 is 3.0 in floats) both versions are still held."""
    join = Driven(asof(0.7))
    join.send(sl.RIGHT, ("k", "v0", 0.0), ("k", "v1", 3.0))
    below = math.nextafter(3.7, -math.inf)
    assert (below, below - 0.7) == (3.6999999999999997, 3.0)
    assert join.rise(below) == []
    assert join.held() == 2
    assert join.rise(3.7) == []
    assert join.held() == 1
