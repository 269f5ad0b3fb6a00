"""Logging: the ``streamlet`` command's --log-level/--log-format, and nothing configured when embedded."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner

import streamlet as sl
from streamlet.cli import main
from streamlet.logs import LogSettings, configure_logging
from tests.support.logging_state import restored_logging

UNWIRED = """
import streamlet as sl

class Split(sl.Task):
    def declare_ports(self, ports):
        ports.set_outputs(2)

    def execute(self, inputs, outputs):
        for record in inputs.get():
            outputs.emit(record.key, record.value, port=record.value % 2)

topology = sl.Topology("unwired")
split = topology.add_task("split", Split).set_input(topology.add_source("in", [1, 2]))
topology.add_sink("even", sl.CollectSink()).set_input(split, out_port=0)
"""


@pytest.fixture(autouse=True)
def unconfigured() -> Iterator[None]:
    """Each test starts with structlog's defaults and gives logging back as it found it."""
    with restored_logging():
        structlog.reset_defaults()
        yield


def test_an_embedded_run_configures_no_logging() -> None:
    """sl.run leaves structlog unconfigured and the root logger's handlers and level as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    topology = sl.Topology("quiet")
    topology.add_sink("out", sl.CollectSink()).set_input(topology.add_source("in", [1, 2]))
    assert sl.run(topology).sink("out")[1].value == 2
    assert (structlog.is_configured(), root.handlers, root.level) == (False, handlers, level)


def test_importing_the_command_configures_nothing() -> None:
    """Importing streamlet and streamlet.cli sets up no logging: only running the command does."""
    probe = "import logging, structlog, streamlet.cli; print(structlog.is_configured(), logging.root.handlers)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout == "False []\n"


def test_json_format_lines_parse_with_their_bound_keys(tmp_path: Path) -> None:
    """`streamlet --log-format json run ...`: the warning is one JSON object carrying the job, node and port."""
    path = tmp_path / "log_unwired.py"
    path.write_text(UNWIRED, encoding="utf-8")
    result = CliRunner().invoke(main, ["--log-format", "json", "run", str(path)])
    assert result.exit_code == 0, result.output
    [line] = result.stderr.splitlines()
    entry = json.loads(line)
    assert sorted(entry) == ["effect", "event", "job", "level", "node", "port", "timestamp"]
    assert (entry["event"], entry["level"], entry["job"], entry["node"], entry["port"]) == (
        "output port has no consumer", "warning", "unwired", "split", 1,
    )  # fmt: skip


def test_the_level_comes_from_the_environment_too(tmp_path: Path) -> None:
    """STREAMLET_LOG_LEVEL=error silences the warning; the default level (warning) shows it, readable."""
    path = tmp_path / "log_unwired_env.py"
    path.write_text(UNWIRED, encoding="utf-8")
    quiet = CliRunner().invoke(main, ["run", str(path)], env={"STREAMLET_LOG_LEVEL": "error"})
    loud = CliRunner().invoke(main, ["run", str(path)], env={"STREAMLET_LOG_LEVEL": None})
    assert (quiet.exit_code, quiet.stderr) == (0, "")
    assert loud.stderr.count("output port has no consumer") == 1
    assert "[warning  ]" in loud.stderr


def test_standard_library_lines_share_the_format(capsys: pytest.CaptureFixture[str]) -> None:
    """kazoo's stdlib lines come out as JSON at the level set, with the logger's name; below it, nothing."""
    configure_logging(LogSettings("warning", "json"))
    configure_logging(LogSettings("info", "json"))  # again: it replaces the first setup, no second handler
    logging.getLogger("kazoo.client").info("connecting to %s", "127.0.0.1:2181")
    logging.getLogger("kazoo.client").debug("not shown")
    [line] = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert (entry["event"], entry["level"], entry["logger"]) == ("connecting to 127.0.0.1:2181", "info", "kazoo.client")


def test_unknown_settings_are_refused() -> None:
    """A level or format outside the choices is a ValueError naming them."""
    with pytest.raises(ValueError, match=r"^log level 'loud' is not one of debug, info, warning, error$"):
        LogSettings("loud")
    with pytest.raises(ValueError, match=r"^log format 'xml' is not one of console, json$"):
        LogSettings("info", "xml")


def test_a_librarys_repeated_line_is_shown_once_and_streamlets_own_lines_all(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """13 kazoo warnings for one member down (each try, another address or errno): one line; a different one
    passes; streamlet's own repeated lines are never held back."""
    configure_logging(LogSettings(level="warning", format="json"))  # the fixture gives logging back after
    kazoo = logging.getLogger("kazoo.client")
    refused = "Connection dropped: socket connection error: Connection refused (127.0.0.%d:%d)"
    for attempt in range(13):
        kazoo.warning(refused, 2 + attempt % 3, 2181 + attempt)
    kazoo.warning("Session expired")
    own = structlog.get_logger("streamlet.test")
    own.warning("data link down")
    own.warning("data link down")
    events = [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()]
    assert events == [
        "Connection dropped: socket connection error: Connection refused (127.0.0.2:2181)",
        "Session expired",
        "data link down",
        "data link down",
    ]
