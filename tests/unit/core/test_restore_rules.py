"""``core.state.restore``'s rules on participants of its own (what each instance is handed, by identity): a
checkpoint without a node, a source resumed at another parallelism, a node added since a savepoint, a task's
snapshots kept as taken when the layout is the one they were taken with, a count window that cannot be
re-split, the restore point every participant is told, and the output a sink that keeps it gets back (its own, or
all of it on instance 0 when the sink's parallelism changed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

import streamlet as sl
from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.sinks import RestorePoint
from streamlet.core.state.restore import _sink_entries, layout_of, restore

pytestmark = pytest.mark.usefixtures("each_state_backend")  # keyed state in memory, then on RocksDB

MAX = 8  # key segments of every task here


@dataclass
class Fake:
    """A participant: what ``restore`` hands it, and when (``given`` stays empty when it is left alone), and the
    restore points it is told (``told``)."""

    name: str
    index: int
    section: str | None
    parallelism: int
    window: Any = None
    given: list[Any] = field(default_factory=list)
    told: list[Any] = field(default_factory=list)

    @property
    def node(self) -> Any:
        return SimpleNamespace(name=self.name, parallelism=self.parallelism, max_parallelism=MAX, window=self.window)

    def restore(self, snapshot: Any) -> None:
        self.given.append(snapshot)

    async def restore_output(self, point: Any) -> None:
        self.told.append(point)


def snapshot(window: Any = None, state: dict[Any, Any] | None = None) -> dict[str, Any]:
    return {"state": packb(state or {}), "window": window, "finished": False, "timers": None}


def document(**parts: Any) -> dict[str, Any]:
    return {"epoch": 3, "job": "j", "finished": False, "attempt": "a", "sources": {}, "tasks": {}, **parts}


def group(name: str, section: str | None, parallelism: int, window: Any = None) -> list[Any]:
    """The instances of node ``name``: Fakes, typed ``Any`` as they stand for ``Participant``s."""
    return [Fake(name, index, section, parallelism, window) for index in range(parallelism)]


async def test_a_checkpoint_with_nothing_for_a_node_is_refused_naming_it() -> None:
    with pytest.raises(sl.JobError) as raised:
        await restore({"count": group("count", "tasks", 1)}, document())
    assert str(raised.value) == "checkpoint 3 of job 'j' has nothing for 'count'"


async def test_a_source_resumes_only_at_the_parallelism_it_ran_with() -> None:
    with pytest.raises(sl.JobError) as raised:
        await restore({"src": group("src", "sources", 1)}, document(sources={"src": [5, 7]}))
    assert str(raised.value) == "'src' ran with parallelism 2 at checkpoint 3; it cannot resume with 1"


async def test_a_node_added_since_the_savepoint_starts_afresh_and_the_others_resume() -> None:
    """The new node comes first: the ones after it are still restored."""
    new, old = group("new", "tasks", 1), group("src", "sources", 1)
    await restore({"new": new, "src": old}, document(sources={"src": [5]}, savepoint=True))
    assert (new[0].given, old[0].given) == ([], [5])


async def test_a_node_missing_from_a_checkpoint_that_is_no_savepoint_is_refused() -> None:
    with pytest.raises(sl.JobError, match=r"^checkpoint 3 of job 'j' has nothing for 'new'$"):
        await restore({"new": group("new", "tasks", 1)}, document(savepoint=False))


async def test_snapshots_taken_with_the_layout_the_job_runs_with_are_handed_over_as_they_are() -> None:
    """The default layout (contiguous segments), recorded in the checkpoint: each instance gets its own object."""
    taken = [snapshot(), snapshot()]
    count = group("count", "tasks", 2)
    layout = {"count": SegmentTable.contiguous(MAX, 2).to_data()}
    await restore({"count": count}, document(tasks={"count": taken}, layout=layout))
    assert [instance.given[0] is part for instance, part in zip(count, taken, strict=True)] == [True, True]


async def test_snapshots_taken_with_another_layout_are_regrouped() -> None:
    """The same instances, segments owned otherwise than when taken: the state is regrouped (new objects)."""
    default = SegmentTable.contiguous(MAX, 2)
    keys = {key: default.owner(key) for key in range(40)}
    taken = [snapshot(state={k: v for k, v in keys.items() if v == i}) for i in range(2)]
    count = group("count", "tasks", 2)
    other = SegmentTable(tuple(1 - owner for owner in default.owners), 2)  # every segment to the other instance
    layout = {"count": SegmentTable.contiguous(MAX, 2).to_data()}
    await restore({"count": count}, document(tasks={"count": taken}, layout=layout), {"count": other})
    assert [instance.given[0] is part for instance, part in zip(count, taken, strict=True)] == [False, False]
    # each key's state went to the instance owning it now: the other one
    assert [sorted(unpackb(instance.given[0]["state"])) for instance in count] == [
        sorted(key for key, owner in keys.items() if owner == 1),
        sorted(key for key, owner in keys.items() if owner == 0),
    ]


async def test_a_count_window_over_all_records_stays_with_its_instance() -> None:
    """CountWindow(per_key=False) cannot be split by key: at the same parallelism its snapshots go back as taken,
    whatever layout is recorded (or none)."""
    taken = [snapshot(window=[1]), snapshot(window=[2])]
    count = group("count", "tasks", 2, sl.CountWindow(3))
    await restore({"count": count}, document(tasks={"count": taken}))
    assert [instance.given[0] is part for instance, part in zip(count, taken, strict=True)] == [True, True]


@pytest.mark.parametrize("second", [[2], None], ids=["both-hold", "one-holds"])
async def test_a_count_window_holding_records_cannot_change_parallelism(second: Any) -> None:
    taken = [snapshot(window=[1]), snapshot(window=second)]
    with pytest.raises(sl.JobError) as raised:
        await restore({"count": group("count", "tasks", 3, sl.CountWindow(3))}, document(tasks={"count": taken}))
    assert str(raised.value) == (
        "task 'count' cannot change parallelism (2 -> 3): a CountWindow(per_key=False) counts all of an "
        "instance's records, not a key's; use CountWindow(..., per_key=True) to rescale it"
    )


async def test_a_count_window_holding_nothing_may_change_parallelism() -> None:
    """No window holds a record: nothing is tied to an instance, so the state is regrouped for 3."""
    count = group("count", "tasks", 3, sl.CountWindow(3))
    await restore({"count": count}, document(tasks={"count": [snapshot(), snapshot()]}))
    assert [len(instance.given) for instance in count] == [1, 1, 1]


def test_a_recorded_layout_of_a_node_the_job_no_longer_has_is_passed_over_and_the_others_are_used() -> None:
    """'gone' (recorded first) is not a task of the job now; 'count' fits (2 instances, 8 segments): it resumes
    with the layout recorded for it, not the default."""
    default = SegmentTable.contiguous(MAX, 2)
    recorded = SegmentTable(tuple(1 - owner for owner in default.owners), 2)
    layout = {"gone": default.to_data(), "count": recorded.to_data()}
    assert layout_of(document(layout=layout), {"count": default}) == {"count": recorded}


# -- the restore point, a finished job, and what a sink that keeps its output gets back ------------------------------


async def test_every_participant_is_told_the_checkpoints_epoch_and_attempt_and_a_fresh_start_none() -> None:
    src, out = group("src", "sources", 1), group("out", None, 2)
    await restore({"src": src, "out": out}, document(sources={"src": [5]}))
    assert [instance.told for instance in (*src, *out)] == [[RestorePoint(3, "a")]] * 3
    fresh = group("out", None, 1)
    await restore({"out": fresh}, None)
    assert (fresh[0].told, fresh[0].given) == ([None], [])


async def test_a_checkpoint_that_records_no_attempt_is_told_with_attempt_none() -> None:
    """A checkpoint written before attempts were recorded: nothing staged can be matched to it."""
    out = group("out", None, 1)
    older = document()
    del older["attempt"]
    await restore({"out": out}, older)
    assert out[0].told == [RestorePoint(3, None)]


async def test_a_finished_job_is_told_its_point_and_nothing_is_restored() -> None:
    """Running a finished job again starts afresh: sinks still learn the point (to publish what it staged)."""
    src, kept = group("src", "sources", 1), group("kept", "sinks", 1)
    await restore({"src": src, "kept": kept}, document(finished=True, sources={"src": [5]}, sinks={"kept": [[1]]}))
    assert [(instance.told, instance.given) for instance in (*src, *kept)] == [([RestorePoint(3, "a")], [])] * 2


async def test_a_sink_at_the_parallelism_of_the_checkpoint_gets_back_each_instances_own_output() -> None:
    first, second = [("a", 1, 0.5)], [("b", 2, 1.5), ("c", 3, 2.5)]
    kept = group("kept", "sinks", 2)
    await restore({"kept": kept}, document(sinks={"kept": [first, second]}))
    assert [instance.given for instance in kept] == [[first], [second]]


@pytest.mark.parametrize("parallelism", [1, 3])
async def test_a_sink_at_another_parallelism_gets_all_of_the_output_on_instance_0_in_instance_order(
    parallelism: int,
) -> None:
    """Two instances at the checkpoint; now one or three: instance 0 holds every record, the others none."""
    kept = group("kept", "sinks", parallelism)
    await restore({"kept": kept}, document(sinks={"kept": [[("a", 1, 0.5)], [("b", 2, 1.5), ("c", 3, 2.5)]]}))
    assert [instance.given for instance in kept] == [
        [[("a", 1, 0.5), ("b", 2, 1.5), ("c", 3, 2.5)]],
        *[[[]]] * (parallelism - 1),
    ]


def test_a_sink_at_another_parallelism_has_one_entry_per_instance_now_and_instances_without_output_add_none() -> None:
    """Three instances at the checkpoint (the second with no entry), two now: the output of the first and third."""
    assert _sink_entries([[("a", 1, 0.5)], None, [("c", 3, 2.5)]], 2) == [[("a", 1, 0.5), ("c", 3, 2.5)], []]
    assert _sink_entries([[("a", 1, 0.5)], [("b", 2, 1.5)]], 4) == [[("a", 1, 0.5), ("b", 2, 1.5)], [], [], []]


async def test_a_sink_missing_from_a_checkpoint_taken_before_sinks_kept_output_starts_empty() -> None:
    """A checkpoint with no ``sinks`` section (an older streamlet), or without this sink: it is left alone."""
    before, without = group("kept", "sinks", 1), group("kept", "sinks", 1)
    await restore({"kept": before}, document())
    await restore({"kept": without}, document(sinks={"other": [[("a", 1, 0.5)]]}))
    assert (before[0].given, without[0].given) == ([], [])


async def test_a_sink_started_from_a_savepoint_collects_afresh_and_the_nodes_after_it_resume() -> None:
    """A savepoint carries no sink's output (no ``sinks`` section): the sink is left alone, the source resumes."""
    kept, src = group("kept", "sinks", 1), group("src", "sources", 1)
    await restore({"kept": kept, "src": src}, document(sources={"src": [5]}, savepoint=True))
    assert (kept[0].given, src[0].given) == ([], [5])
