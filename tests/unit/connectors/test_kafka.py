"""The Kafka connectors without a broker: importing without aiokafka, and configuration errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

import streamlet as sl

WITHOUT_AIOKAFKA = """
import sys
sys.modules["aiokafka"] = None          # as if it were not installed
import streamlet as sl
source = sl.KafkaSource("t", "localhost:9092", None)
topology = sl.Topology("t")
topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", source))
try:
    sl.run(topology)
except sl.KafkaError as exc:
    print(exc)
"""


def test_without_aiokafka_import_works_and_opening_names_the_extra() -> None:
    """`import streamlet` needs no aiokafka; opening a Kafka source without it names the extra to install."""
    output = subprocess.run([sys.executable, "-c", WITHOUT_AIOKAFKA], capture_output=True, check=True, text=True)
    assert output.stdout == "the Kafka connectors need aiokafka: pip install 'streamlet[kafka]'\n"


def test_source_refuses_an_unknown_error_policy() -> None:
    """on_error is 'skip' or 'fail' (retrying a deserializer gives the same answer, so no 'restart')."""
    with pytest.raises(sl.KafkaError, match=r"^KafkaSource on_error must be 'skip' or 'fail', not 'restart'$"):
        sl.KafkaSource("t", "localhost:9092", None, on_error="restart")


def test_transactional_sink_needs_a_staging_dir() -> None:
    """transactional=True without staging_dir is refused, naming the topic."""
    with pytest.raises(sl.KafkaError, match=r"^KafkaSink for topic 'out': transactional=True needs a staging_dir$"):
        sl.KafkaSink("out", "localhost:9092", transactional=True)
