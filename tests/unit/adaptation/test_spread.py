"""Spreading a CPU-bound task as a pure function: a cheap stage stays co-located, a CPU-bound one spreads."""

from __future__ import annotations

from streamlet.adaptation.settings import AdaptSettings, parse_policies, settings_of
from streamlet.adaptation.spread import CpuBound, cpu_bound, spread

# the parallel benchmark's job as dispatch packs it: everything with its upstream on w0, w1 idle
PACKED = {"numbers.0": "w0", "work.0": "w0", "work.1": "w0", "totals.0": "w0", "out.0": "w0"}
ROOM = {"w0": 3, "w1": 8}
IDLE = {"w0": 0.98, "w1": 0.02}


def movable(instance: str) -> bool:
    return instance.split(".")[0] in ("work", "totals")  # sources and sinks stay


def test_a_cpu_bound_task_has_an_instance_moved_to_the_idle_worker() -> None:
    """'work' x2 busy 90 % of the time, of 95 % for the worker's instances, on a process at 98 % of a core: they
    take 93 % of it, and work.1 goes to w1, with the reason."""
    busy = {"numbers.0": 0.03, "work.0": 0.45, "work.1": 0.45, "totals.0": 0.02, "out.0": 0.0}
    decision = spread(PACKED, busy, IDLE, ROOM, movable)
    assert decision is not None
    migration = decision.migration
    assert (migration.instance, migration.source, migration.target) == ("work.1", "w0", "w1")
    assert (decision.task, round(decision.cpu, 3)) == ("work", 0.928)
    assert decision.reason == (
        "work is CPU-bound on w0: its 2 instances there take 93% of a core (the process at 98%); "
        "work.1 goes to w1 (CPU 2%)"
    )


def test_a_cheap_stage_stays_co_located() -> None:
    """The same placement with 'work' a fifth of the busy time: 21 % of a core, nothing moves, however busy the
    process."""
    busy = {"numbers.0": 0.6, "work.0": 0.1, "work.1": 0.1, "totals.0": 0.1, "out.0": 0.05}
    assert spread(PACKED, busy, IDLE, ROOM, movable) is None


def test_busy_without_cpu_is_waiting_not_work() -> None:
    """'work' awaits a slow service (busy 190 % together) in a process at 30 % of a core: it stays."""
    busy = {"work.0": 0.95, "work.1": 0.95}
    assert spread(PACKED, busy, {"w0": 0.3, "w1": 0.02}, ROOM, movable) is None


def test_a_lone_instance_or_an_immovable_task_stays() -> None:
    """One instance of a task on a worker has its core already; a source's instances never move."""
    alone = {"feed.0": "w0", "feed.1": "w0", "work.0": "w0"}
    busy = {"feed.0": 0.4, "feed.1": 0.4, "work.0": 0.9}
    assert spread(alone, busy, IDLE, ROOM, lambda instance: instance.startswith("work")) is None


def test_the_target_needs_room_idle_cpu_and_leave_to_run_it() -> None:
    """No room, a busy target or a task not allowed there: no move."""
    busy = {"work.0": 0.45, "work.1": 0.45}
    assert spread(PACKED, busy, IDLE, {"w0": 3, "w1": 0}, movable) is None
    assert spread(PACKED, busy, {"w0": 0.98, "w1": 0.7}, ROOM, movable) is None  # 0.7 + 0.49 >= 0.98
    assert spread(PACKED, busy, IDLE, ROOM, movable, lambda instance, worker: worker == "w0") is None


def test_a_spread_task_stops_spreading_once_even() -> None:
    """Four instances on two workers: 3 and 1 moves one more to w1 (the fewest), 2 and 2 moves none."""
    uneven = {"work.0": "w0", "work.1": "w0", "work.2": "w0", "work.3": "w1"}
    busy = {"work.0": 0.32, "work.1": 0.32, "work.2": 0.32, "work.3": 0.33}
    decision = spread(uneven, busy, {"w0": 0.99, "w1": 0.35, "w2": 0.3}, {"w0": 4, "w1": 4}, movable)
    assert decision is not None
    assert (decision.migration.instance, decision.migration.target) == ("work.2", "w1")
    even = {"work.0": "w0", "work.1": "w0", "work.2": "w1", "work.3": "w1"}
    busy = {name: 0.48 for name in even}
    assert spread(even, busy, {"w0": 0.99, "w1": 0.98}, {"w0": 4, "w1": 4}, movable) is None


def test_a_job_naming_no_policy_spreads_and_none_names_none() -> None:
    """A spec without ``adapt`` runs under 'spread'; ``--adapt none`` is no policy; a list is exactly itself."""
    assert settings_of(None).policies == frozenset({"spread"})
    assert parse_policies("none") == frozenset()
    assert settings_of(AdaptSettings(parse_policies("none")).to_data()).policies == frozenset()
    assert settings_of(AdaptSettings(parse_policies("autoscale")).to_data()).policies == frozenset({"autoscale"})


def test_a_finding_comes_at_once_a_move_only_from_a_settled_worker() -> None:
    """'work' is found CPU-bound on w0 whatever its part's age; no instance leaves w0 before it is settled."""
    busy = {"work.0": 0.45, "work.1": 0.45}
    assert cpu_bound(PACKED, busy, IDLE, movable) == [CpuBound("work", "w0", ("work.0", "work.1"), 0.98)]
    assert spread(PACKED, busy, IDLE, ROOM, movable, settled=lambda worker: False) is None
