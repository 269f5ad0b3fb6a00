"""What a task instance does when user code fails: one object per ``on_error`` policy.

The instance finds what failed (a record, a timer, a whole wake-up or window) and has already taken back
what the failed call did (its outputs, and under a replaying policy its state and timers: ``state.undo``);
the policy decides what happens to it:

- ``fail``: the job fails with a ``TaskError`` naming the record's key (nothing to take back: the job ends);
- ``skip``: the record is dead-lettered and has no effect; the rest of its batch goes on;
- ``restart``: the instance gets a fresh task object (its state kept) and the same input again, up to
  ``max_failures`` times.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Protocol

from streamlet.core.model.record import Element
from streamlet.errors import TaskError


class FailureHost(Protocol):
    """What a policy may do to the instance it serves."""

    def dead_letter(self, element: Element, error: BaseException) -> None:
        """Set ``element`` aside with ``error`` (the job's dead letters)."""

    def restart(self, element: Element, error: BaseException, *, what: str = ...) -> None:
        """A fresh task object, or a ``TaskError`` past ``max_failures``."""

    def task_error(self, element: Element, error: BaseException, *, what: str = ..., after: str = ...) -> TaskError:
        """The ``TaskError`` naming ``element``'s key and ``error``."""


class ErrorPolicy(ABC):
    """One ``on_error`` policy."""

    name: ClassVar[str]
    #: The failed input is given to the task again (record by record, or whole): what the failed call did to
    #: outputs, state and timers must be taken back first, or the replay would apply it twice.
    replays: ClassVar[bool] = True
    #: A failed batch is retried whole (after a restart), not replayed record by record to find the culprit.
    retries_batches: ClassVar[bool] = False

    @abstractmethod
    def failed(self, host: FailureHost, element: Element, error: BaseException, what: str) -> bool:
        """``element`` (a record, or a timer as ``(key, None, when)``) failed: whether to give it again."""

    @abstractmethod
    def failed_unit(self, host: FailureHost, elements: Sequence[Element], error: BaseException, what: str) -> bool:
        """A wake-up or window of ``elements``, executed as one, failed: whether to execute it again."""


class Fail(ErrorPolicy):
    """The job fails, naming the record."""

    name = "fail"
    replays = False

    def failed(self, host: FailureHost, element: Element, error: BaseException, what: str) -> bool:
        raise host.task_error(element, error, what=what) from error

    def failed_unit(self, host: FailureHost, elements: Sequence[Element], error: BaseException, what: str) -> bool:
        raise host.task_error(_first(elements), error, what=what) from error


class Skip(ErrorPolicy):
    """The failing record is dead-lettered and has no effect."""

    name = "skip"

    def failed(self, host: FailureHost, element: Element, error: BaseException, what: str) -> bool:
        host.dead_letter(element, error)
        return False

    def failed_unit(self, host: FailureHost, elements: Sequence[Element], error: BaseException, what: str) -> bool:
        for element in elements:  # executed as one, they failed as one
            host.dead_letter(element, error)
        return False


class Restart(ErrorPolicy):
    """A fresh task object gets the same input again."""

    name = "restart"
    retries_batches = True

    def failed(self, host: FailureHost, element: Element, error: BaseException, what: str) -> bool:
        host.restart(element, error, what=what)
        return True

    def failed_unit(self, host: FailureHost, elements: Sequence[Element], error: BaseException, what: str) -> bool:
        host.restart(_first(elements), error, what=what)
        return True


def _first(elements: Sequence[Element]) -> Element:
    """The element a unit's failure is named by (a unit may hold none)."""
    return elements[0] if elements else (None, None, None)


POLICIES: dict[str, ErrorPolicy] = {policy.name: policy for policy in (Fail(), Skip(), Restart())}
