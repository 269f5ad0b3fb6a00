"""The keyed-state seam: what a task (``self.state``) and the checkpoints need of a store.

:class:`~streamlet.core.state.keyed.KeyedState` is the in-memory implementation the runtime gives every
task instance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol


class StateStore(Protocol):
    """A task instance's keyed values, and their snapshots for checkpoints."""

    #: The key -> value dict itself, for tight loops. Not timed under ``state_ttl``: a store whose ``ttl`` is
    #: set (see ``ReduceTask``) is read and written through get/put.
    values: dict[Any, Any]

    def get(self, key: Any, default: Any = None) -> Any:
        """The value stored for ``key``, or ``default``."""
        ...

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` for ``key``."""
        ...

    def delete(self, key: Any) -> None:
        """Forget ``key``; no error when it is absent."""
        ...

    def items(self) -> Iterator[tuple[Any, Any]]:
        """This instance's ``(key, value)`` pairs."""
        ...

    def checkpoint(self) -> Any:
        """A consistent, msgpack-able snapshot."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Replace the contents with a snapshot."""
        ...

    @staticmethod
    def partition(snapshot: Any, parts: int) -> list[Any]:
        """Split a snapshot by key into ``parts``."""
        ...

    @staticmethod
    def merge(parts: list[Any]) -> Any:
        """Join several snapshots into one."""
        ...


class StateBackend(Protocol):
    """Where a job's (or a task's) keyed state lives, when not in memory: ``streamlet.RocksDBState``."""

    def open(
        self,
        job: str,
        node: str,
        index: int,
        segments: int,
        ttl: float | None = None,
        now: Callable[[], float] | None = None,
    ) -> Any:
        """The (empty) keyed state of instance ``index`` of ``node`` (a ``KeyedState``), its keys in
        ``segments`` key segments; with ``ttl``, its entries expire ``ttl`` seconds of ``now()`` after their
        last write."""
        ...

    def close(self) -> None:
        """The job ended: close what was opened and remove what it made."""
        ...


def check_state_backend(where: str, backend: Any) -> None:
    """``backend`` is a state backend or ``None`` (else a ``TopologyError`` naming ``where``)."""
    usable = callable(getattr(backend, "open", None)) and callable(getattr(backend, "close", None))
    if backend is not None and not usable:
        from streamlet.errors import TopologyError

        raise TopologyError(f"{where}: state_backend must be a state backend (streamlet.RocksDBState), got {backend!r}")
