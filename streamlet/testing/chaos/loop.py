"""A deterministic event loop: virtual time, parties whose callbacks it can drop or hold, no real I/O.

:class:`SimLoop` is asyncio's selector loop with three changes:

- **Virtual time.** ``time()`` is a number the loop advances itself: when no
  callback is ready, it jumps straight to the next timer instead of waiting
  (a selector that never blocks). Every ``asyncio.sleep``, ``anyio.sleep``,
  timeout and ``call_later`` runs on it, so an hour of heartbeats takes as
  long as the work done in it. When nothing is ready and no timer is set,
  every task waits for something that will never come: :class:`SimulationStalled`.
- **Parties.** A task started with :meth:`SimLoop.start_party` belongs to a
  :class:`Party` (a master, a worker), and so does every task and callback
  it starts (a context variable). :meth:`Party.kill` drops the party's
  callbacks from then on, unrun: no ``finally``, no ``__aexit__``, as
  SIGKILL leaves a process. :meth:`Party.pause` holds them while time runs
  (a zombie), :meth:`Party.resume` runs them, in order.
- **No sockets.** ``create_server`` and ``create_connection`` (what
  ``asyncio.start_server`` and ``asyncio.open_connection`` call) give
  in-memory links of a :class:`~streamlet.testing.chaos.network.Network`;
  ``run_in_executor`` runs the call inline.

Everything else (the ready queue, timers, tasks, futures) is asyncio's own, so
the code under test is the code that runs in production. Same seed, same
schedule: nothing in the loop reads a clock or an unseeded random number.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from collections.abc import Callable, Coroutine
from typing import Any

from streamlet.errors import SimulationStalled
from streamlet.testing.chaos.network import Network
from streamlet.testing.chaos.parties import PARTY, Party

FROZEN_STEPS = 1_000_000  # loop turns at one virtual instant: beyond it, a livelock (callbacks forever)


def _guarded(party: Party, callback: Callable[..., Any], args: tuple[Any, ...], context: contextvars.Context) -> None:
    """Run a party's callback, unless the party is dead or paused: then it is held (see :meth:`Party.bury`)."""
    if party.dead or party.paused:
        party.held.append((callback, args, context))
        return
    callback(*args)


class _VirtualSelector(selectors.BaseSelector):
    """A selector with nothing to select: waiting ``timeout`` seconds moves virtual time on by that much."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        self._advance = advance
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationStalled("nothing is ready and no timer is set: every task waits forever")
        if timeout > 0:
            self._advance(timeout)
        return []

    def get_map(self) -> Any:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class SimLoop(asyncio.SelectorEventLoop):
    """asyncio's loop on virtual time, with parties and an in-memory network (see the module's docstring)."""

    def __init__(self, network: Network) -> None:
        self._now = 0.0
        super().__init__(_VirtualSelector(self._advance))
        self.network = network
        self.steps = 0
        self._steps_since = (0.0, 0)  # (virtual time, loop turns) when time last moved
        self.errors: list[str] = []  # what the loop's exception handler was given (a party's unhandled errors)
        self.set_exception_handler(self._record_error)
        network.attach(self)

    def time(self) -> float:
        """Virtual seconds since the loop was made."""
        return self._now

    def _advance(self, seconds: float) -> None:
        self._now += seconds

    def _record_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        self.errors.append(f"{context.get('message', '')}: {error!r}" if error else str(context.get("message")))

    # -- parties ------------------------------------------------------------------------------------

    def start_party(self, party: Party, main: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``main`` as the first task of ``party``: it and everything it starts belong to the party."""
        context = contextvars.copy_context()
        context.run(PARTY.set, party)
        task: asyncio.Task[Any] = self.create_task(main, name=party.name, context=context)
        return task

    def create_task(  # type: ignore[override]
        self, coro: Any, *, name: str | None = None, context: contextvars.Context | None = None
    ) -> Any:
        task = super().create_task(coro, name=name, context=context)
        party = context.get(PARTY) if context is not None else PARTY.get()
        if party is not None:
            party.tasks.add(task)
            task.add_done_callback(party.tasks.discard)
        return task

    def call_soon(  # type: ignore[override]
        self, callback: Any, *args: Any, context: contextvars.Context | None = None
    ) -> Any:
        party = context.get(PARTY) if context is not None else PARTY.get()
        if party is None:
            return super().call_soon(callback, *args, context=context)
        context = contextvars.copy_context() if context is None else context
        return super().call_soon(_guarded, party, callback, args, context, context=context)

    def call_at(  # type: ignore[override]
        self, when: float, callback: Any, *args: Any, context: contextvars.Context | None = None
    ) -> Any:
        party = context.get(PARTY) if context is not None else PARTY.get()
        if party is None:
            return super().call_at(when, callback, *args, context=context)
        context = contextvars.copy_context() if context is None else context
        return super().call_at(when, _guarded, party, callback, args, context, context=context)

    def _run_once(self) -> None:
        self.steps += 1
        if self._now != self._steps_since[0]:
            self._steps_since = (self._now, self.steps)
        elif self.steps - self._steps_since[1] > FROZEN_STEPS:
            ready = list(getattr(self, "_ready", ()))[:3]  # what keeps it turning, for the report
            raise SimulationStalled(
                f"{FROZEN_STEPS} loop turns without time moving at {self._now:.3f} s: a livelock ({ready})"
            )
        super()._run_once()  # type: ignore[misc]

    # -- no real I/O --------------------------------------------------------------------------------

    async def create_server(self, protocol_factory: Any, host: Any = None, port: Any = None, **_: Any) -> Any:
        return self.network.listen(protocol_factory, str(host or "127.0.0.1"), int(port or 0))

    async def create_connection(self, protocol_factory: Any, host: Any = None, port: Any = None, **_: Any) -> Any:
        return await self.network.connect(protocol_factory, str(host), int(port))

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self.create_future()
        try:
            future.set_result(func(*args))
        except Exception as exc:  # noqa: BLE001 - handed to whoever awaits it, as the executor would
            future.set_exception(exc)
        return future
