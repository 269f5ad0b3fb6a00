"""A sink says in its writer's type what ``write`` takes: records (``SinkWriter``) or elements (``ElementWriter``)."""

from __future__ import annotations

from typing import Any

import pytest

import streamlet as sl


class Kept(sl.Sink):
    """Opens ``writer`` (a class) and keeps every batch it was given."""

    def __init__(self, writer: type[Any]) -> None:
        self.writer = writer
        self.batches: list[list[Any]] = []

    def open(self, context: sl.SinkContext) -> Any:
        return self.writer(self.batches)


class Records(sl.SinkWriter):
    def __init__(self, batches: list[list[Any]]) -> None:
        self.batches = batches

    def write(self, batch: list[sl.Record]) -> None:
        self.batches.append(list(batch))


class Elements(sl.ElementWriter):
    def __init__(self, batches: list[list[Any]]) -> None:
        self.batches = batches

    def write(self, batch: list[tuple[Any, ...]]) -> None:
        self.batches.append(list(batch))


def run_into(writer: type[Any]) -> list[Any]:
    topology = sl.Topology("kinds")
    numbers = topology.add_source("numbers", [sl.Record("a", 1, 1.0), sl.Record("b", 2, 2.0)])
    sink = Kept(writer)
    topology.add_sink("out", sink).set_input(numbers)
    sl.run(topology)
    return [item for batch in sink.batches for item in batch]


def test_a_sink_writer_gets_records_and_an_element_writer_the_runtimes_tuples() -> None:
    assert run_into(Records) == [sl.Record("a", 1, 1.0), sl.Record("b", 2, 2.0)]
    assert [type(item) for item in run_into(Records)] == [sl.Record, sl.Record]
    assert run_into(Elements) == [("a", 1, 1.0), ("b", 2, 2.0)]
    assert [type(item) for item in run_into(Elements)] == [tuple, tuple]


def test_the_flag_of_earlier_versions_is_refused_with_what_to_do_instead() -> None:
    with pytest.raises(TypeError, match="Old: a writer taking elements derives from ElementWriter"):

        class Old(sl.SinkWriter):
            takes_elements = True

            def write(self, batch: Any) -> None: ...
