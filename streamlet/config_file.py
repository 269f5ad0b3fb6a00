"""Settings of ``streamlet worker`` and ``streamlet master`` from a TOML file, so that a unit file stays short.

``--config FILE`` reads the file first; each key is a long option without its
dashes (``state-dir`` or ``state_dir``, ``label`` for ``--label`` with a list,
``no-tls = true`` for a flag). An option given on the command line wins over
the file; a key that names no option is refused, naming it and the known
ones. The cluster secret stays in its own file (``secret-file``), never in
this one.

Example (``/etc/streamlet/worker.toml``)::

    zk = "10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181"
    name = "prod"
    id = "worker-3"
    host = "0.0.0.0"
    advertise = "10.0.0.13"
    capacity = 16
    label = ["ssd"]
    state-dir = "/var/lib/streamlet"
    secret-file = "/etc/streamlet/secret"
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import click

CONFIG_HELP = "read settings from this TOML file (keys: the long options; an option given here wins)"


def option_keys(command: click.Command) -> dict[str, str]:
    """Each key a config file may use for ``command`` (a long option without ``--``) -> the parameter's name."""
    keys = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "config":
            for option in param.opts:
                if option.startswith("--"):
                    keys[option[2:]] = str(param.name)
    return keys


def read_settings(command: click.Command, path: Path) -> dict[str, Any]:
    """The parameters ``path`` sets for ``command`` (parameter name -> value); a ``click.BadParameter`` naming
    the file and what is wrong with it."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint="--config") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{path} is not valid TOML: {exc}", param_hint="--config") from None
    keys = option_keys(command)
    settings = {}
    for key, value in data.items():
        name = keys.get(key.replace("_", "-"))
        if name is None:
            known = ", ".join(sorted(keys))
            raise click.BadParameter(
                f"{path}: {key!r} is no setting of this command; known: {known}", param_hint="--config"
            )
        settings[name] = value
    return settings


def load_config(context: click.Context, _param: click.Parameter, path: Path | None) -> Path | None:
    """``--config``'s callback (an eager option): the file's settings become the command's defaults."""
    if path is not None:
        context.default_map = {**(context.default_map or {}), **read_settings(context.command, path)}
    return path


config_option = click.option(
    "--config", type=click.Path(dir_okay=False, path_type=Path), default=None, is_eager=True, expose_value=False,
    callback=load_config, help=CONFIG_HELP,
)  # fmt: skip
