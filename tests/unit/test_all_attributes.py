"""The public surface: ``streamlet.__all__``, and an import without side effects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import streamlet

IMPORT_PROBE = """
import asyncio, json, logging, sys
import structlog
handlers_before = list(logging.getLogger().handlers)
import streamlet
print(json.dumps({
    "structlog_configured": structlog.is_configured(),
    "default_policy": type(asyncio.get_event_loop_policy()) is asyncio.DefaultEventLoopPolicy,
    "root_handlers": logging.getLogger().handlers == handlers_before,
    "root_level": logging.getLogger().level,
    "uvloop_imported": "uvloop" in sys.modules,
}))
"""


@pytest.fixture(scope="module")
def fresh_import() -> dict[str, object]:
    """What a fresh interpreter looks like after ``import streamlet`` (probed once per module)."""
    output = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, check=True, text=True)
    report: dict[str, object] = json.loads(output.stdout)
    return report


def test_all_is_a_tuple() -> None:
    """__all__ is a tuple, so it cannot be changed by accident."""
    assert type(streamlet.__all__) is tuple


def test_all_has_no_duplicates() -> None:
    """Every name appears once in __all__."""
    assert len(set(streamlet.__all__)) == len(streamlet.__all__)


def test_every_name_in_all_exists() -> None:
    """Every name in __all__ is an attribute of the package."""
    missing = [name for name in streamlet.__all__ if not hasattr(streamlet, name)]
    assert missing == []


def test_import_does_not_configure_structlog(fresh_import: dict[str, object]) -> None:
    """Importing streamlet leaves structlog unconfigured."""
    assert fresh_import["structlog_configured"] is False


def test_import_does_not_set_an_event_loop_policy(fresh_import: dict[str, object]) -> None:
    """After importing streamlet the asyncio policy is still the default one (no uvloop policy)."""
    assert fresh_import["default_policy"] is True


def test_import_does_not_configure_stdlib_logging(fresh_import: dict[str, object]) -> None:
    """Importing streamlet adds no root logging handler and keeps the root level at WARNING."""
    assert (fresh_import["root_handlers"], fresh_import["root_level"]) == (True, 30)


def test_import_does_not_import_uvloop(fresh_import: dict[str, object]) -> None:
    """uvloop is chosen when a loop is created, not imported with the package."""
    assert fresh_import["uvloop_imported"] is False


def test_all_is_grouped_with_each_group_sorted() -> None:
    """__all__ reads as a table of contents: groups under a comment each, names sorted within a group."""
    source = (Path(streamlet.__file__)).read_text(encoding="utf-8")
    block = source[source.index("__all__ = (") : source.index(")\n", source.index("__all__ = ("))]
    groups: list[list[str]] = []
    for line in block.splitlines()[1:]:
        if line.strip().startswith("#"):
            groups.append([])
        elif line.strip():
            groups[-1].append(line.strip().strip('",'))
    assert len(groups) == 6
    assert all(names == sorted(names, key=str.lower) for names in groups)
    assert [name for names in groups for name in names] == list(streamlet.__all__)


@pytest.mark.parametrize(
    ("name", "owner"),
    [("stable_hash", "streamlet.core.model.partition"), ("SegmentTable", "streamlet.core.model.segments")],
)
def test_an_internal_once_exported_still_imports_with_a_warning_naming_its_module(name: str, owner: str) -> None:
    import importlib

    with pytest.warns(DeprecationWarning, match=f"streamlet.{name} is deprecated: import it from {owner}"):
        found = getattr(streamlet, name)
    assert found is getattr(importlib.import_module(owner), name)
    assert name not in streamlet.__all__
