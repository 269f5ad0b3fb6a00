"""Overload migration as a pure function: an OVERLOADED worker hands its hottest instance to the least loaded."""

from __future__ import annotations

from streamlet.adaptation.overload import hand_off

PLACED = {"parse.0": "w0", "parse.1": "w0", "score.0": "w0", "feed.0": "w0", "score.1": "w1"}
BUSY = {"parse.0": 0.2, "parse.1": 0.25, "score.0": 0.5, "feed.0": 0.9, "score.1": 0.3}
ROOM = {"w0": 4, "w1": 4, "w2": 4}


def movable(instance: str) -> bool:
    return not instance.startswith("feed")  # sources stay


def test_the_hottest_movable_instance_goes_to_the_least_loaded_worker() -> None:
    decision = hand_off({"w0": 0.97, "w1": 0.6, "w2": 0.1}, {"w0"}, PLACED, BUSY, ROOM, movable)
    assert decision is not None
    migration = decision.migration
    assert (migration.instance, migration.source, migration.target, migration.index) == ("score.0", "w0", "w2", 0)
    assert decision.reason == (
        "w0 is overloaded (CPU 97%, full queues): its hottest instance score.0 (busy 50%) goes to w2 (CPU 10%)"
    )


def test_nothing_moves_without_an_overloaded_worker() -> None:
    assert hand_off({"w0": 0.97, "w1": 0.1}, set(), PLACED, BUSY, ROOM, movable) is None


def test_a_target_must_have_room_be_allowed_and_stay_below_the_source() -> None:
    cpu = {"w0": 0.97, "w1": 0.3, "w2": 0.1}
    full = {"w0": 0, "w1": 4, "w2": 0}
    decision = hand_off(cpu, {"w0"}, PLACED, BUSY, full, movable)  # w2 has no room: w1
    assert decision is not None
    assert decision.migration.target == "w1"
    decision = hand_off(cpu, {"w0"}, PLACED, BUSY, ROOM, movable, lambda instance, worker: worker != "w2")
    assert decision is not None
    assert decision.migration.target == "w1"
    # w1 at 0.6 would reach 1.1 with score.0: the next hottest that fits, parse.1 (0.25 -> 0.85), goes there
    decision = hand_off({"w0": 0.97, "w1": 0.6}, {"w0"}, PLACED, BUSY, {"w1": 4}, movable)
    assert decision is not None
    assert decision.migration.instance == "parse.1"


def test_an_overloaded_worker_never_takes_and_nothing_fits_means_no_move() -> None:
    cpu = {"w0": 0.97, "w1": 0.95}
    assert hand_off(cpu, {"w0", "w1"}, PLACED, BUSY, ROOM, movable) is None
    assert hand_off({"w0": 0.97, "w1": 0.9}, {"w0"}, PLACED, BUSY, ROOM, movable) is None  # all would swap it
