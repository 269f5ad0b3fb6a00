"""Finding a topology by reference: ``path/to/file.py[:name]`` or ``package.module[:name]``.

Topologies travel between processes by reference, never pickled: every
process that runs a job loads it again from the same reference.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from streamlet.core.topology import Topology
from streamlet.errors import StreamletError


def load_topology(target: str, parallelism: dict[str, int] | None = None) -> Topology:
    """The topology ``target`` names, with ``parallelism`` overrides applied.

    ``name`` may be a Topology object or a function returning one; without it
    the module's single Topology is used, or else its ``build_topology``.
    """
    location, _, name = target.partition(":")
    module = _module_from_file(Path(location)) if location.endswith(".py") else _import(location)
    found = _pick(module, location, name)
    topology = found() if callable(found) and not isinstance(found, Topology) else found
    if not isinstance(topology, Topology):
        raise StreamletError(f"{target} is not a Topology or a function returning one (got {type(topology).__name__})")
    for node_name, count in (parallelism or {}).items():
        if node_name not in topology.nodes:
            raise StreamletError(f"{target} has no node called '{node_name}'")
        topology.nodes[node_name].parallelism = count
    return topology


def _module_from_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise StreamletError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise StreamletError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise StreamletError(f"cannot import {name}: {exc}") from exc


def _pick(module: ModuleType, location: str, name: str) -> Any:
    if name:
        if not hasattr(module, name):
            raise StreamletError(f"{location} has no attribute '{name}'")
        return getattr(module, name)
    topologies = [value for value in vars(module).values() if isinstance(value, Topology)]
    if len(topologies) == 1:
        return topologies[0]
    builder = getattr(module, "build_topology", None)
    if builder is not None and inspect.isfunction(builder):
        return builder
    raise StreamletError(
        f"{location}: name the topology, as {location}:NAME ({len(topologies)} Topology objects found)"
    )
