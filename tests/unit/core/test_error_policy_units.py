"""The error policies on a unit (a wake-up or a window executed as one) that holds no record: the failure is
named by an empty element, never an index error."""

from __future__ import annotations

from typing import Any

import pytest

from streamlet.core.runtime.error_policy import POLICIES
from streamlet.errors import TaskError


class Host:
    """What a policy may do to its instance, noted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def dead_letter(self, element: Any, error: BaseException) -> None:
        self.calls.append(("dead_letter", element))

    def restart(self, element: Any, error: BaseException, *, what: str = "record with key") -> None:
        self.calls.append(("restart", element))

    def task_error(self, element: Any, error: BaseException, *, what: str = "", after: str = "") -> TaskError:
        self.calls.append(("task_error", element))
        return TaskError(f"failed on {what} {element[0]!r}", task="t", instance=0, key=element[0])


def test_fail_names_an_empty_unit_by_an_empty_element() -> None:
    host = Host()
    with pytest.raises(TaskError, match=r"^failed on a window None$"):
        POLICIES["fail"].failed_unit(host, [], ValueError("x"), "a window")
    assert host.calls == [("task_error", (None, None, None))]


def test_restart_names_an_empty_unit_by_an_empty_element_and_goes_again() -> None:
    host = Host()
    assert POLICIES["restart"].failed_unit(host, [], ValueError("x"), "a window") is True
    assert host.calls == [("restart", (None, None, None))]


def test_skip_sets_every_record_of_a_unit_aside_and_goes_on() -> None:
    host = Host()
    assert POLICIES["skip"].failed_unit(host, [("a", 1, 0.0), ("b", 2, 1.0)], ValueError("x"), "a window") is False
    assert host.calls == [("dead_letter", ("a", 1, 0.0)), ("dead_letter", ("b", 2, 1.0))]
