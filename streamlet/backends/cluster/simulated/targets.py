"""Topologies handed to a simulated cluster in its own process, reachable by an ordinary reference.

A real cluster loads every job by reference (``module:name`` or
``file.py:name``) in every process. A function the cluster could not import
by name (defined in ``__main__``, inside another function, or a lambda) or a
``Topology`` object can still run on a :class:`~streamlet.backends.cluster.simulated.cluster.SimulatedCluster`,
because there every "process" is this one: the harness registers it here and
submits ``streamlet.backends.cluster.simulated.targets:<token>``, which the
leader and the workers load, sign and verify like any other reference.

Example:
    >>> import streamlet as sl
    >>> from streamlet.loading import load_topology
    >>> reference = register(lambda: sl.Topology("handed-over"))
    >>> load_topology(reference).name
    'handed-over'
    >>> forget(reference)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

_TARGETS: dict[str, Callable[[], Any]] = {}


def register(factory: Callable[[], Any], token: str | None = None) -> str:
    """A reference that loads ``factory`` (a function returning a Topology) in this process (``token``: the
    name it goes by, a new one by default)."""
    token = token or f"target_{uuid.uuid4().hex[:12]}"
    _TARGETS[token] = factory
    return f"{__name__}:{token}"


def forget(reference: str) -> None:
    """Drop a registered target (a reference not made by :func:`register` is ignored)."""
    _TARGETS.pop(reference.partition(":")[2], None)


def __getattr__(name: str) -> Callable[[], Any]:
    """The factory registered under ``name`` (how ``load_topology`` finds it)."""
    try:
        return _TARGETS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
