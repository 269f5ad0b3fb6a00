"""``streamlet worker --config FILE`` / ``master --config FILE``: settings from TOML, the command line winning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from streamlet import cli
from streamlet.config_file import read_settings

WORKER_TOML = """
zk = "198.18.0.2:2181,198.18.0.3:2181,198.18.0.4:2181"
name = "prod"
id = "worker-3"
host = "0.0.0.0"
advertise = "198.18.0.13"
capacity = 16
label = ["ssd", "gpu"]
state_dir = "{state}"
no-tls = true
"""


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """What the command would run: ``anyio.run``'s arguments, captured instead of running a worker."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(cli.anyio, "run", lambda function, *args, **_: calls.append((function, *args)))
    monkeypatch.setenv("STREAMLET_SECRET", "ab" * 32)
    return calls


def test_a_worker_takes_its_settings_from_the_file(tmp_path: Path, started: list[tuple[Any, ...]]) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(WORKER_TOML.format(state=tmp_path / "state"))
    result = CliRunner().invoke(cli.main, ["worker", "--config", str(config)])
    assert result.exit_code == 0, result.output
    [(run, zk, name, worker_id, host, _secret, capacity, labels)] = started
    assert (zk, name, worker_id, host, capacity, labels) == (
        "198.18.0.2:2181,198.18.0.3:2181,198.18.0.4:2181", "prod", "worker-3", "0.0.0.0", 16, ["gpu", "ssd"],
    )  # fmt: skip
    assert run.keywords["advertise"] == "198.18.0.13"
    assert run.keywords["tls"] is None  # no-tls = true
    assert run.keywords["state_dir"] == tmp_path / "state" / "worker-3"


def test_the_command_line_wins_over_the_file(tmp_path: Path, started: list[tuple[Any, ...]]) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(WORKER_TOML.format(state=tmp_path / "state"))
    result = CliRunner().invoke(cli.main, ["worker", "--config", str(config), "--capacity", "2", "--id", "w9"])
    assert result.exit_code == 0, result.output
    [(_run, _zk, _name, worker_id, _host, _secret, capacity, _labels)] = started
    assert (worker_id, capacity) == ("w9", 2)


def test_an_unknown_key_is_refused_naming_it(tmp_path: Path, started: list[tuple[Any, ...]]) -> None:
    config = tmp_path / "worker.toml"
    config.write_text('zk = "127.0.0.1:2181"\ncapacty = 4\n')
    result = CliRunner().invoke(cli.main, ["worker", "--config", str(config)])
    assert result.exit_code == 2
    assert f"{config}: 'capacty' is no setting of this command; known: advertise, bandwidth, capacity" in result.output
    assert started == []


def test_a_file_that_is_not_toml_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "master.toml"
    config.write_text("zk = \n")
    with pytest.raises(click.BadParameter, match=r"master.toml is not valid TOML: "):
        read_settings(cli.master_command, config)


def test_a_wildcard_host_needs_an_advertised_address(tmp_path: Path, started: list[tuple[Any, ...]]) -> None:
    args = ["worker", "--zk", "127.0.0.1:2181", "--host", "0.0.0.0", "--no-tls", "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2
    assert "0.0.0.0 listens on every address: say which one peers reach with --advertise" in result.output
    assert started == []


def test_a_master_takes_its_settings_from_the_file(tmp_path: Path, started: list[tuple[Any, ...]]) -> None:
    config = tmp_path / "master.toml"
    config.write_text(f'zk = "127.0.0.1:2181"\nid = "master-2"\nstate-dir = "{tmp_path}"\nno-dashboard = true\n')
    result = CliRunner().invoke(cli.main, ["master", "--config", str(config)])
    assert result.exit_code == 0, result.output
    [(run, zk, _name, master_id, _secret)] = started
    assert (zk, master_id, run.keywords["dashboard"]) == ("127.0.0.1:2181", "master-2", None)


def test_a_dashboard_or_metrics_on_any_address_get_the_state_dirs_token(
    tmp_path: Path, started: list[tuple[Any, ...]]
) -> None:
    master = ["master", "--zk", "127.0.0.1:2181", "--state-dir", str(tmp_path), "--dashboard-host", "0.0.0.0"]
    worker = ["worker", "--zk", "127.0.0.1:2181", "--state-dir", str(tmp_path), "--no-tls", "--host", "198.18.0.9"]
    loopback = ["master", "--zk", "127.0.0.1:2181", "--state-dir", str(tmp_path / "other")]
    for args in (master, [*worker, "--metrics-port", "0"], worker, loopback):
        result = CliRunner().invoke(cli.main, args, env={"STREAMLET_SECRET": "ab" * 32})  # each takes it away
        assert result.exit_code == 0, result.output
    token = (tmp_path / "monitor-token").read_text().strip()
    [(to_master, *_), (to_worker, *_), (plain_worker, *_), (local_master, *_)] = started
    assert to_master.keywords["dashboard"].token == token
    assert to_worker.keywords["metrics_token"] == token
    assert plain_worker.keywords["metrics_token"] is None  # no metrics served
    # on loopback too (any local user reaches it): a token of its own state dir, made on first use
    assert local_master.keywords["dashboard"].token == (tmp_path / "other" / "monitor-token").read_text().strip()
