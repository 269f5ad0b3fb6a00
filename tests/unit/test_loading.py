"""How ``load_topology`` converts the text of a parameter for the function that builds a topology."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamlet.loading import call_factory, convert_param


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("42", 42), ("-7", -7), ("1_000", 1000), (" 3 ", 3),
        ("2.5", 2.5), ("1e3", 1000.0),
        ("true", True), ("False", False),
        ("null", None), ("[1, 2]", [1, 2]), ('{"a": 1}', {"a": 1}), ('"007"', "007"),
        ("hello world", "hello world"), ("", ""), ("nan", "nan"), ("inf", "inf"), ("NaN", "NaN"), ("[1,", "[1,"),
    ],
)  # fmt: skip
def test_without_annotation_int_float_bool_json_else_text(raw: str, expected: Any) -> None:
    """Tried in order: int, float (finite only), bool, JSON (without NaN/Infinity); else the text as it is."""
    value = convert_param(raw)
    assert (type(value), value) == (type(expected), expected)


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, "007"), (str | None, "007"),
        (Path, Path("007")), (Path | None, Path("007")), (Path | str, Path("007")),
        (int, 7), (int | str, 7), (Any, 7),
    ],
)  # fmt: skip
def test_a_str_annotation_keeps_the_text_and_a_path_annotation_makes_a_path(annotation: Any, expected: Any) -> None:
    """``007`` for a ``str`` parameter stays ``"007"``; for a Path it is a Path; any other annotation: the rule."""
    value = convert_param("007", annotation)
    assert (type(value), value) == (type(expected), expected)


def test_an_annotation_that_does_not_evaluate_leaves_only_that_parameter_unconverted() -> None:
    """A string annotation naming something imported only for type checking: that parameter follows the rule,
    the others still get their annotation's conversion."""

    def build(count: Any, where: Any) -> tuple[Any, Any]:
        return count, where

    build.__annotations__ = {"count": "NotImportedHere", "where": "Path"}
    assert call_factory(build, {"count": "5", "where": "5"}, "here.py") == (5, Path("5"))


def test_a_factory_with_var_keywords_takes_any_parameter() -> None:
    """``**options`` accepts every name."""

    def build(**options: Any) -> dict[str, Any]:
        return options

    assert call_factory(build, {"anything": "1", "else": "x"}, "here.py") == {"anything": 1, "else": "x"}
