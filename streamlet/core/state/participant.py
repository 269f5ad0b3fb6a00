"""What checkpoints and restores need of an instance. The runtime's instances implement it; the state layer
talks to them through it alone (it never asks which kind of instance it holds)."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from streamlet.core.model.sinks import RestorePoint
from streamlet.core.model.topology import Node

#: Where an instance's snapshot goes in a checkpoint document. Most sinks keep none (their output is staged
#: outside); a sink whose writer keeps its output (``keeps_output``, a ``CollectSink``'s) keeps it under "sinks".
Section = Literal["sources", "tasks", "sinks"]
#: Every section, in the order a document holds them.
SECTIONS: tuple[Section, ...] = ("sources", "tasks", "sinks")


class Participant(Protocol):
    """One instance of a job, as checkpoints see it."""

    node: Node
    index: int
    completed: bool
    #: ``"sources"``, ``"tasks"`` or ``"sinks"``: where its snapshot goes in a checkpoint document; ``None``: nowhere.
    section: Section | None

    def final_snapshot(self) -> Any:
        """Its checkpoint data once it has completed."""
        ...

    def request_barrier(self, epoch: int) -> None:
        """A source injects ``Barrier(epoch)``; the others receive barriers and ignore this."""
        ...

    def pause(self) -> None:
        """A source stops reading (a graceful stop); the others ignore this."""
        ...

    async def prepare_commit(self, epoch: int) -> None:
        """A sink stages what it wrote under ``epoch``; the others have nothing to stage."""
        ...

    async def publish(self, epoch: int) -> None:
        """Checkpoint ``epoch`` is complete: a sink publishes what it staged (before any source hears of it)."""
        ...

    async def acknowledge(self, epoch: int, snapshot: Any) -> None:
        """Checkpoint ``epoch`` is complete with ``snapshot``: a source tells its reader (after the sinks)."""
        ...

    async def close_output(self) -> None:
        """The job's output is final: a sink closes its writer."""
        ...

    async def restore_output(self, point: RestorePoint | None) -> None:
        """A sink learns which checkpoint the job resumes from (``None``: a fresh start)."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Continue from ``snapshot`` (this instance's entry of its section)."""
        ...
