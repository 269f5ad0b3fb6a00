"""Faults for PostgresSink's tests: staging commits whose answers are lost (:class:`LoseOneAnswer`, which
wraps the sinks' real connections) and a server crashed and started again (:class:`Restarter`).

A lost answer is made by the connection the sink uses: the chosen staging ``COMMIT`` is sent (or not, or
later) and the connection is cut, so the client sees exactly what a network failure at that moment shows it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import anyio

from streamlet.connectors.postgres import epochs
from streamlet.testing.postgres_server import PostgresServer

VICTIM = "streamlet sink 'appended' instance 0"
WENT_THROUGH, DID_NOT, LATE = "the commit went through", "the commit did not", "the commit lands late"
LOCK_WAITER = "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)"


def connection_gone() -> Exception:
    """What asyncpg raises for a connection gone mid-operation."""
    import asyncpg

    return asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")


class LosingTransaction:
    """A transaction of a sink connection. Started explicitly (``start()``: only staging does; moves and
    savepoints use ``async with``) while :class:`LoseOneAnswer` is armed, its ``commit`` loses its answer
    the way :attr:`LoseOneAnswer.mode` says:

    - ``WENT_THROUGH``: committed, then the connection is cut;
    - ``DID_NOT``: the connection is cut instead (the server rolls back);
    - ``LATE``: the client is told the connection is gone at once, while the transaction stays open on the
      server and commits only once the writer's lookup has run or waits for it (a commit still on its way,
      as one waiting for a synchronous standby is).
    """

    def __init__(self, owner: LoseOneAnswer) -> None:
        self.owner, self.real = owner, owner.real.transaction()
        self.losing = False

    async def start(self) -> None:
        rule = type(self.owner)
        if rule.armed and self.owner.name == VICTIM:
            rule.passed += 1
            self.losing = rule.passed > rule.PASS
            rule.armed = not self.losing
        await self.real.start()

    async def commit(self) -> None:
        if not self.losing:
            await self.real.commit()
            return
        rule = type(self.owner)
        rule.lost += 1
        if rule.mode == LATE:
            self.owner.cut = True  # to the writer it is gone; the real one commits later
            rule.late = asyncio.ensure_future(self._commit_late(rule))
            raise connection_gone()
        if rule.mode == WENT_THROUGH:
            await self.real.commit()
        self.owner.real.terminate()
        raise connection_gone()

    async def _commit_late(self, rule: type[LoseOneAnswer]) -> None:
        import asyncpg

        admin = await asyncpg.connect(rule.dsn)
        try:
            # a poll: nothing announces another session's lock wait
            while not (rule.looked_up.is_set() or await admin.fetchval(LOCK_WAITER)):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        finally:
            await admin.close()
        await self.real.commit()
        await self.owner.real.close()

    async def rollback(self) -> None:
        await self.real.rollback()

    async def __aenter__(self) -> Any:
        return await self.real.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self.real.__aexit__(*exc)


class LoseOneAnswer:
    """Wraps the sinks' connections: while ``armed``, the third staging transaction of ``appended`` instance 0
    (two checkpoints are in by then) loses its commit's answer (see :class:`LosingTransaction`); the first
    ``cut_lookups`` lookups after it are cut off too. Everything else is the real connection's."""

    PASS = 2  # staging transactions let through first
    dsn = ""
    passed = 0
    lost = 0
    armed = False
    mode = WENT_THROUGH
    cut_lookups = 0
    looked_up = threading.Event()
    late: asyncio.Future[None] | None = None

    def __init__(self, real: Any, name: str) -> None:
        self.real, self.name = real, name
        self.cut = False  # LATE: the writer was told this connection is gone

    @classmethod
    def arm(cls, dsn: str, mode: str, cut_lookups: int = 0) -> None:
        cls.dsn, cls.mode, cls.cut_lookups = dsn, mode, cut_lookups
        cls.passed, cls.lost, cls.armed, cls.late = 0, 0, True, None
        cls.looked_up.clear()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.real, attribute)

    def transaction(self) -> LosingTransaction:
        return LosingTransaction(self)

    def is_closed(self) -> bool:
        return self.cut or bool(self.real.is_closed())

    async def close(self, **options: Any) -> None:
        if not self.cut:
            await self.real.close(**options)

    def terminate(self) -> None:
        if not self.cut:
            self.real.terminate()

    async def execute(self, query: str, *args: Any, **options: Any) -> Any:
        if query == epochs.BATCH_LOCK and type(self).cut_lookups > 0:
            type(self).cut_lookups -= 1
            self.real.terminate()
            raise connection_gone()
        return await self.real.execute(query, *args, **options)

    async def fetchval(self, query: str, *args: Any, **options: Any) -> Any:
        found = await self.real.fetchval(query, *args, **options)
        if query == epochs.IS_RECORDED:
            type(self).looked_up.set()
        return found


class Restarter:
    """Crashes a server and starts it again from a thread of its own that lives until :meth:`close`: the
    server's process ends with the thread that started it (``setpriv --pdeathsig``), and a worker thread of
    anyio's may end any time."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.started, self.released = threading.Event(), threading.Event()
        self.keeper: threading.Thread | None = None
        self.failure: BaseException | None = None

    def crash_and_restart(self) -> None:
        """Crash the server, start it again in the keeper thread; return once it accepts connections."""
        self.server.crash()
        self.keeper = threading.Thread(target=self._keep, name="postgres-restarter")
        self.keeper.start()
        assert self.started.wait(timeout=120), "the server did not start again"
        if self.failure is not None:
            raise self.failure

    def _keep(self) -> None:
        try:
            self.server.start_again()
        except BaseException as exc:
            self.failure = exc
        finally:
            self.started.set()
        self.released.wait()

    def close(self) -> None:
        """Let the keeper thread end (the server is stopped by PID after this, by its own ``stop``)."""
        self.released.set()
        if self.keeper is not None:
            self.keeper.join(timeout=30)
            assert not self.keeper.is_alive(), "the restarter's thread did not end"
