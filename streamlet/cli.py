"""The ``streamlet`` command: ``streamlet run path/to/file.py[:name]``."""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from pathlib import Path
from typing import Any

import click
import structlog

from streamlet.backends.local import run as run_topology
from streamlet.core.statistics import JobStatistics
from streamlet.core.topology import Topology
from streamlet.errors import StreamletError


@click.group()
@click.version_option(package_name="streamlet")
def main() -> None:
    """streamlet: asyncio-native stream processing."""
    # The command is an application, so it may set up logging: warnings and errors, on stderr.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


@main.command("run")
@click.argument("target")
def run_command(target: str) -> None:
    """Run TARGET (path/to/file.py[:name]) in-process and print a summary.

    NAME may be a Topology object or a function returning one; without it the
    file's single module-level Topology is used, or else its function
    ``build_topology``.
    """
    try:
        topology = load_topology(target)
        result = run_topology(topology)
    except Exception as exc:  # noqa: BLE001 - user code too: one line and a non-zero exit, never a traceback
        _fail(exc)
    click.echo(format_summary(result.statistics))


def _fail(exc: BaseException) -> None:
    click.echo(f"error: {type(exc).__name__}: {exc}", err=True)
    sys.exit(1)


def load_topology(target: str) -> Topology:
    """The topology named by ``path/to/file.py[:name]``."""
    path_text, _, name = target.partition(":")
    path = Path(path_text)
    if not path.is_file():
        raise StreamletError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise StreamletError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    found = _pick(module, path, name)
    topology = found() if callable(found) and not isinstance(found, Topology) else found
    if not isinstance(topology, Topology):
        raise StreamletError(f"{target} is not a Topology or a function returning one (got {type(topology).__name__})")
    return topology


def _pick(module: Any, path: Path, name: str) -> Any:
    if name:
        if not hasattr(module, name):
            raise StreamletError(f"{path} has no attribute '{name}'")
        return getattr(module, name)
    topologies = [value for value in vars(module).values() if isinstance(value, Topology)]
    if len(topologies) == 1:
        return topologies[0]
    builder = getattr(module, "build_topology", None)
    if builder is not None and inspect.isfunction(builder):
        return builder
    raise StreamletError(f"{path}: name the topology, as {path}:NAME ({len(topologies)} Topology objects found)")


def format_summary(stats: JobStatistics) -> str:
    """A short table: records in and out per node, and the wall time."""
    width = max(len(name) for name in stats.nodes)
    lines = [f"job '{stats.job}' finished in {stats.wall_time:.3f} s"]
    lines.append(f"  {'node':<{width}}  {'kind':<6}  {'in':>10}  {'out':>10}")
    for node in stats.nodes.values():
        lines.append(f"  {node.name:<{width}}  {node.kind:<6}  {node.records_in:>10}  {node.records_out:>10}")
    extras = {"dropped": stats.dropped, "dead-lettered": stats.dead_lettered, "discarded": stats.discarded}
    lines.extend(f"  {label}: {count}" for label, count in extras.items() if count)
    return "\n".join(lines)
