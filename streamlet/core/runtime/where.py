"""Where a job's instances run: all of them in this process, or this process's part of a job placed across
processes (a cluster worker, ``processes=N``). The job asks this one object instead of checking in each
method whether it was given a placement."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from streamlet.core.model.segments import SegmentTable
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.plan import Placement, fitting
from streamlet.errors import JobError, ReconfigurationError


class WholeJob:
    """Every instance runs in this process: the job is watched and changed here."""

    placement: Placement | None = None
    hold_open: Callable[[], Awaitable[None]] | None = None

    def tables(self, topology: Topology) -> dict[str, SegmentTable]:
        """Segment tables that win over a checkpoint's: none (a checkpoint's layout stands)."""
        return {}

    def check_live_change(self, job: str) -> None:
        """A rescale or segment move asked of this process: it can carry it out."""

    def check_settle(self) -> None:
        """``settle()`` asked of this process: it sees every instance, so it can tell."""


class PartOfJob:
    """This process's part of a job placed across processes: the others change it and watch it with it."""

    def __init__(self, placement: Placement) -> None:
        self.placement: Placement | None = placement
        self.hold_open = placement.hold_open  # joining a running job: open until a live change gives it work
        self._tables = placement.tables

    def tables(self, topology: Topology) -> dict[str, SegmentTable]:
        """The tables live changes gave the job (they win over a checkpoint's: its state is regrouped)."""
        return fitting(self._tables, topology)

    def check_live_change(self, job: str) -> None:
        raise ReconfigurationError(f"job '{job}' runs on a cluster: 'streamlet rescale' changes it")

    def check_settle(self) -> None:
        raise JobError("settle() works for in-process jobs")


Where = WholeJob | PartOfJob


def where(placement: Placement | None) -> Where:
    """The strategy for a job given ``placement`` (``None``: the whole job runs here)."""
    return WholeJob() if placement is None else PartOfJob(placement)
