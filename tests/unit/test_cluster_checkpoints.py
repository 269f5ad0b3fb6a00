"""Merging the workers' parts of a cluster checkpoint into one document."""

from __future__ import annotations

import pytest

from streamlet.backends.cluster.checkpoints import merge_parts
from streamlet.errors import JobError


def part(worker_sources: list[list[object]], worker_tasks: list[list[object]], finished: bool = False) -> dict:
    return {
        "epoch": 4,
        "job": "wc",
        "finished": finished,
        "sources": {"lines": worker_sources} if worker_sources else {},
        "tasks": {"count": worker_tasks} if worker_tasks else {},
    }


def test_parts_merge_into_instance_order_whichever_worker_held_which_instance() -> None:
    """Worker b held count.0 and lines.1, worker a the rest: the document lists each node by index."""
    a = part([[0, 100]], [[1, {"state": "s1"}], [2, {"state": "s2"}]])
    b = part([[1, 250]], [[0, {"state": "s0"}]])
    merged = merge_parts([a, b])
    assert merged == {
        "epoch": 4,
        "job": "wc",
        "finished": False,
        "sources": {"lines": [100, 250]},
        "tasks": {"count": [{"state": "s0"}, {"state": "s1"}, {"state": "s2"}]},
    }


def test_a_document_is_finished_only_when_every_part_is() -> None:
    """One worker's final snapshot does not make the whole checkpoint final."""
    assert merge_parts([part([[0, 1]], [], finished=True), part([], [[0, {}]])])["finished"] is False
    assert merge_parts([part([[0, 1]], [], finished=True), part([], [[0, {}]], finished=True)])["finished"] is True


def test_a_missing_instance_is_an_error_naming_the_node() -> None:
    """A part that never arrived must not restore a job with a hole in its state."""
    with pytest.raises(JobError, match="checkpoint 4: instances of 'count' are missing"):
        merge_parts([part([[0, 1]], [[0, {}], [2, {}]])])
