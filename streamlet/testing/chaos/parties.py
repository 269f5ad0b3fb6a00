"""The parties of a simulation: each master and worker, whose callbacks the loop can drop or hold."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The party the running task or callback belongs to (``None``: the harness itself).
PARTY: contextvars.ContextVar[Party | None] = contextvars.ContextVar("streamlet_chaos_party", default=None)


@dataclass(eq=False)
class Party:
    """One process of the simulated cluster: its tasks and callbacks, which the loop can stop or hold."""

    name: str
    dead: bool = False
    paused: bool = False
    held: list[tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context]] = field(default_factory=list)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)  # kept: a dropped task must never be collected

    def __repr__(self) -> str:
        return f"Party({self.name!r}{', dead' if self.dead else ''}{', paused' if self.paused else ''})"

    def kill(self) -> None:
        """From now on none of the party's callbacks runs: its tasks stop where they stand, cleanup unrun.

        Its callbacks are parked, never run while the run goes on; :meth:`bury` runs them after the run, so
        its tasks can be cancelled and end like any other (a task whose wakeup was thrown away would wait
        for ever)."""
        self.dead = True

    def pause(self) -> None:
        """Hold the party's callbacks (timers that fall due included) until :meth:`resume`."""
        self.paused = True

    def resume(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run what was held, in the order it was held, then go on as before (a dead party stays so)."""
        self.paused = False
        if self.dead:
            return
        held, self.held = self.held, []
        for callback, args, context in held:
            loop.call_soon(callback, *args, context=context)

    def bury(self, loop: asyncio.AbstractEventLoop) -> None:
        """After the run: let the party run again, what it held first, so its tasks can be cancelled."""
        self.dead = self.paused = False
        self.resume(loop)
