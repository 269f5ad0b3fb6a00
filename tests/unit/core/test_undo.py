"""CallUndo: a failed call's changes to keyed state, write times and timers are taken back exactly."""

from __future__ import annotations

from typing import Any

import pytest

from streamlet.core.model.timers import Timers
from streamlet.core.state.undo import CallUndo, JournaledValues, UndoableExpiringState, UndoableState


def undo_of(state: UndoableState | UndoableExpiringState) -> tuple[CallUndo, Timers]:
    timers = Timers(lambda: 0.0)
    return CallUndo(state, timers), timers


def test_every_dict_operation_is_taken_back() -> None:
    """set, del, pop, popitem, setdefault, update, |=, clear and in-place changes all come back."""
    state = UndoableState({"a": 1, "b": [1, 2], "c": {"x": (1, [2])}, "d": "keep"})
    undo, _ = undo_of(state)
    before = {"a": 1, "b": [1, 2], "c": {"x": (1, [2])}, "d": "keep"}
    undo.begin()
    values: Any = state.values
    values["a"] = 2
    values["new"] = 0
    values["b"].append(3)
    values.get("c")["x"][1].append(9)
    del values["d"]
    values.pop("new")
    values.setdefault("e", []).append(1)
    values.update(f=1)
    values |= {"g": 2}
    values.popitem()
    values.clear()
    undo.take_back()
    assert state.values == before
    assert type(state.values["c"]["x"]) is tuple  # through the codec: types come back exactly


def test_items_hands_out_values_that_are_taken_back() -> None:
    """A value reached through items() and changed in place is restored."""
    state = UndoableState({"a": [1]})
    undo, _ = undo_of(state)
    undo.begin()
    for _, value in state.items():
        value.append(2)
    undo.take_back()
    assert state.values == {"a": [1]}


def test_a_successful_call_stands_and_the_next_failure_undoes_only_itself() -> None:
    """forget() keeps the call's changes; a later failed call goes back to them, not further."""
    state = UndoableState()
    undo, _ = undo_of(state)
    undo.begin()
    state.put("a", [1])
    undo.forget()
    undo.begin()
    state.get("a").append(2)
    state.put("b", 1)
    undo.take_back()
    assert state.values == {"a": [1]}
    assert state.values.before is None  # nothing kept between calls


def test_unencodable_values_are_deep_copied() -> None:
    """A value the codec refuses (no checkpoint asked for it) is kept by a deep copy."""

    class Box:
        def __init__(self) -> None:
            self.items: list[int] = []

    state = UndoableState({"box": Box()})
    undo, _ = undo_of(state)
    undo.begin()
    state.get("box").items.append(1)
    undo.take_back()
    assert state.get("box").items == []


def test_a_restore_keeps_the_journal() -> None:
    """After restoring a checkpoint the values dict is still journaled."""
    state = UndoableState({"a": 1})
    snapshot = state.checkpoint()
    state.restore(snapshot)
    assert type(state.values) is JournaledValues
    undo, _ = undo_of(state)
    undo.begin()
    state.put("a", 5)
    undo.take_back()
    assert state.values == {"a": 1}


def test_write_times_under_a_ttl_are_taken_back() -> None:
    """A failed call's put does not renew the entry's life: it expires from its old write time."""
    now = [0.0]
    state = UndoableExpiringState(10.0, lambda: now[0])
    undo, _ = undo_of(state)
    state.put("a", 1)
    now[0] = 5.0
    undo.begin()
    state.put("a", 2)
    state.put("b", 1)
    undo.take_back()
    assert (state.get("a"), state.get("b", "absent")) == (1, "absent")
    now[0] = 10.0
    assert state.get("a", "expired") == "expired"


def test_entries_swept_by_a_failed_call_come_back_with_their_write_times() -> None:
    """An entry the failed call swept as expired is back, still expired by its own time, never immortal."""
    now = [0.0]
    state = UndoableExpiringState(10.0, lambda: now[0])
    undo, _ = undo_of(state)
    state.put("old", 1)
    now[0] = 4.0
    state.put("young", 2)
    now[0] = 11.0
    undo.begin()
    state.put("x", 3)  # sweeps 'old'
    undo.take_back()
    assert dict(state.written) == {"old": 0.0, "young": 4.0}
    assert list(state.items()) == [("young", 2)]


def test_timers_set_and_cancelled_by_a_failed_call_are_taken_back() -> None:
    """Timers the call set are gone, those it cancelled are pending again in their old order."""
    state = UndoableState()
    undo, timers = undo_of(state)
    timers.at("a", 5.0)
    timers.at("b", 5.0)
    undo.begin()
    timers.cancel("a", 5.0)
    timers.at("c", 1.0)
    timers.at("a", 5.0)  # set again after the cancel: a new place in the order
    undo.take_back()
    assert timers.pending() == [("a", 5.0, "event"), ("b", 5.0, "event")]
    assert list(timers.due("event", 10.0)) == [("a", 5.0), ("b", 5.0)]


OPERATIONS: dict[str, Any] = {
    "set": lambda values: values.__setitem__("a", 2),
    "del": lambda values: values.__delitem__("d"),
    "pop": lambda values: values.pop("a"),
    "pop a missing key": lambda values: values.pop("zz", None),
    "popitem": lambda values: values.popitem(),
    "setdefault": lambda values: values.setdefault("e", []).append(1),
    "update from a dict": lambda values: values.update({"a": 5, "n": 1}),
    "update from keywords": lambda values: values.update(a=5, n=1),
    "update from both": lambda values: values.update([("a", 5)], n=1),
    "|=": lambda values: values.__ior__({"g": 2}),
    "clear": lambda values: values.clear(),
    "values() changed in place": lambda values: [value.append(9) for value in values.values() if type(value) is list],
    "items() changed in place": lambda values: [value.append(9) for _, value in values.items() if type(value) is list],
}


def test_each_dict_operation_alone_does_what_a_dict_does_and_is_taken_back() -> None:
    """One operation per call: the journal sees each by itself (no later clear() noting every key for it)."""
    for name, operation in OPERATIONS.items():
        plain = {"a": 1, "b": [1, 2], "d": "keep"}
        state = UndoableState({"a": 1, "b": [1, 2], "d": "keep"})
        undo, _ = undo_of(state)
        undo.begin()
        assert operation(state.values) == operation(plain), name
        assert dict(state.values) == plain, name
        undo.take_back()
        assert dict(state.values) == {"a": 1, "b": [1, 2], "d": "keep"}, name
        assert list(state.values) == ["a", "b", "d"], name  # the order of the keys too


def test_update_between_calls_is_a_plain_dict_update() -> None:
    """No call running (a rescale hands keys over): update takes a mapping and keywords, as a dict's does."""
    values = JournaledValues({"a": 0})
    values.update({"a": 1}, b=2)
    values.update([("c", 3)])
    assert dict(values) == {"a": 1, "b": 2, "c": 3}
    assert values.before is None


def expiring(written: dict[str, float], ttl: float = 10.0) -> tuple[UndoableExpiringState, list[float], CallUndo]:
    """An expiring state with ``written`` (key -> write time, in that order) and its clock."""
    now = [0.0]
    state = UndoableExpiringState(ttl, lambda: now[0])
    for key, stamp in written.items():
        now[0] = stamp
        state.put(key, stamp)
    undo, _ = undo_of(state)
    return state, now, undo


def test_an_entry_a_failed_call_swept_at_exactly_its_ttl_comes_back_with_its_write_time() -> None:
    """At now - written == ttl an entry has expired (the front sweep takes it): a failed call's sweep is
    taken back with the write time, so it stays expired by its own time."""
    state, now, undo = expiring({"old": 0.0, "young": 4.0})
    now[0] = 10.0
    undo.begin()
    state.put("x", 1)  # sweeps 'old', written exactly ttl ago
    assert "old" not in state.values
    undo.take_back()
    assert dict(state.written) == {"old": 0.0, "young": 4.0}


def test_a_call_under_undo_sweeps_the_expired_front_before_a_live_entry() -> None:
    """The journal keeps the swept entries aside, but the sweep still happens: the call sees no expired entry."""
    state, now, undo = expiring({"old": 0.0, "young": 4.0})
    now[0] = 11.0
    undo.begin()
    state.put("x", 1)
    assert sorted(state.values) == ["x", "young"]
    undo.forget()
    assert dict(state.written) == {"young": 4.0, "x": 11.0}


@pytest.mark.parametrize("at", [10.0, 12.0])
def test_entries_a_failed_listing_swept_come_back_with_their_write_times(at: float) -> None:
    """items() sweeps every expired entry (at exactly the ttl too); a failed call's sweep is taken back."""
    state, now, undo = expiring({"old": 0.0, "young": 4.0})
    now[0] = at
    undo.begin()
    assert [key for key, _ in state.items()] == ["young"]
    undo.take_back()
    assert dict(state.written) == {"old": 0.0, "young": 4.0}
    assert dict(state.values) == {"old": 0.0, "young": 4.0}


def test_a_removal_between_calls_does_not_fix_the_order_a_later_call_goes_back_to() -> None:
    """Only a call's first removal notes the keys' order: one between calls (a rescale) leaves no stale order."""
    state = UndoableState({"a": 1, "b": 2})
    undo, _ = undo_of(state)
    values: Any = state.values
    values.pop("a")
    values["a"] = 1  # between calls: now b, a
    undo.begin()
    values["b"] = 3
    undo.take_back()
    assert list(state.values.items()) == [("b", 2), ("a", 1)]


def test_a_restored_expiring_state_is_still_journaled() -> None:
    """After a restore from a checkpoint, a failed call's changes are taken back as before."""
    state, _now, undo = expiring({"a": 0.0})
    snapshot = state.checkpoint()
    state.restore(snapshot)
    undo, _ = undo_of(state)
    undo.begin()
    state.values["a"] = 99
    undo.take_back()
    assert dict(state.values) == {"a": 0.0}


def test_a_failed_delete_keeps_the_write_time() -> None:
    """The entry comes back with its old write time, so it still expires when it would have."""
    state, now, undo = expiring({"a": 0.0, "b": 1.0})
    now[0] = 5.0
    undo.begin()
    state.delete("a")
    undo.take_back()
    assert list(state.written.items()) == [("a", 0.0), ("b", 1.0)]


def test_a_key_a_failed_call_wrote_then_deleted_leaves_no_write_time() -> None:
    state, now, undo = expiring({"a": 0.0})
    now[0] = 1.0
    undo.begin()
    state.put("new", 1)
    state.delete("new")
    undo.take_back()
    assert list(state.written.items()) == [("a", 0.0)]


def test_write_times_taken_back_are_in_time_order_not_key_order() -> None:
    """b written before a: a failed call's rewrite of b is taken back and b is the oldest again."""
    state, now, undo = expiring({"b": 0.0, "a": 1.0})
    now[0] = 2.0
    undo.begin()
    state.put("b", 5)
    undo.take_back()
    assert list(state.written.items()) == [("b", 0.0), ("a", 1.0)]


def test_writes_between_calls_after_a_successful_call_keep_no_journal() -> None:
    """After forget() nothing is kept: a write between calls (a restore, a rescale) is plain."""
    state, _now, undo = expiring({"a": 0.0})
    undo.begin()
    state.put("b", 1)
    undo.forget()
    state.put("c", 2)
    state.delete("a")
    assert state.stamps_before is None
    assert state.values.before is None
    assert dict(state.values) == {"b": 1, "c": 2}
