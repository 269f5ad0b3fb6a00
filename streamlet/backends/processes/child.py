"""One worker process: its share of the job's instances, wired to the others over authenticated TCP.

A forked child runs :func:`run_child` and never returns into the caller's
code: whatever happens it ends with ``os._exit``. It serves a
:class:`~streamlet.transport.tcp.DataServer` on 127.0.0.1 (the job's secret
was drawn before the fork), says on which port (``ready``), waits for every
process's port (``start``), then runs a :class:`~streamlet.core.runtime.job.Job`
with a :class:`~streamlet.core.runtime.plan.Placement` that keeps its own
instances and reaches the others through a
:class:`~streamlet.transport.tcp_client.TcpClient`: the cluster worker's
wiring, with the placement computed instead of read from ZooKeeper.

When its part has ended it waits until the other processes have
acknowledged everything it sent, closes its links, reports (``records``,
``dead_letters``, then ``done``; or ``failed`` with the error; or
``stopped`` when the parent stopped it) and keeps its data server up until
the parent says ``exit``: by then no process has a link left to close under
it. A parent that goes away (its end of the socket closes) stops the part
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, NoReturn

import anyio
import structlog

from streamlet.backends.processes.failures import described
from streamlet.backends.processes.loops import LoopAnswers
from streamlet.backends.processes.part_agreement import PartAgreement, RestorePoint
from streamlet.backends.processes.placement import Where
from streamlet.backends.processes.wire import CHUNK, Control, record_chunks
from streamlet.core.model.topology import Topology
from streamlet.core.runtime.channel import LocalChannel
from streamlet.core.runtime.clock import SystemClock
from streamlet.core.runtime.job import Job, JobResult
from streamlet.core.runtime.plan import Placement
from streamlet.core.state.checkpoints import Coordinator
from streamlet.errors import EncodingError, JobError
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpChannel, TcpClient

log = structlog.get_logger("streamlet")
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Launch:
    """What every process of the job knows from before the fork (inherited, never sent)."""

    topology: Topology
    processes: int
    where: Where  # (node, index) -> the process running it
    secret: bytes  # the data plane's, drawn for this run
    attempt: str  # the run token every process's Job shares (sinks stage under it; channel names carry it)
    options: dict[str, Any]  # the Job's other keyword arguments (clock, batch_size, channel_capacity, cpu_turns)
    backend_options: dict[str, Any]  # anyio's: uvloop or not
    loops: bool = False  # the topology has loops: the parent detects when they end (``loops``)
    checkpointed: bool = False  # the job takes checkpoints, the parent leading (``checkpoints``) ...
    restore: RestorePoint = None  # ... and resumes from this one (read by the parent before the fork)


def run_child(launch: Launch, index: int, sock: socket.socket) -> NoReturn:
    """The whole life of worker process ``index``: its part of the job, then ``os._exit`` (never a return
    into the code that forked it)."""
    code = 1
    try:
        structlog.contextvars.bind_contextvars(process=index)
        anyio.run(partial(_serve, launch, index, sock), backend="asyncio", backend_options=launch.backend_options)
        code = 0
    except KeyboardInterrupt:
        pass  # Ctrl-C reached the whole process group: the parent reports it
    except BaseException as exc:  # noqa: BLE001 - this process ends here whatever it was; the parent says so
        log.error("worker process failed", process=index, error=f"{type(exc).__name__}: {exc}")
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream must not stop the exit
                stream.flush()
        os._exit(code)


async def _serve(launch: Launch, index: int, sock: socket.socket) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    control = Control(reader, writer)
    try:
        await _Part(launch, index, control).run()
    finally:
        control.close()  # the parent sees this process end here


class _Part:
    """This process's part of the job, driven by the parent's messages."""

    def __init__(self, launch: Launch, index: int, control: Control) -> None:
        self.launch = launch
        self.index = index
        self.control = control
        self.ports: list[int] | None = None
        self.decided = anyio.Event()  # start, stop, or the parent is gone
        self.exit = anyio.Event()
        self.scope = anyio.CancelScope()  # the job's: cancelled by stop
        self.channels: list[TcpChannel] = []
        self.loops = LoopAnswers(control.send) if launch.loops else None
        self.checkpoints = PartAgreement(control.send, launch.restore) if launch.checkpointed else None

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._listen)
            async with DataServer(self.launch.secret, host=HOST) as server:
                await self.control.send({"kind": "ready", "port": server.port})
                await self.decided.wait()
                outcome: tuple[str, Any] = ("stopped", None)
                if self.ports is not None and not self.scope.cancel_called:
                    async with TcpClient(self.launch.secret) as client:
                        outcome = await self._run_job(server, client)
                await self._report(*outcome)
                await self.exit.wait()
            group.cancel_scope.cancel()

    async def _listen(self) -> None:
        while (message := await self.control.receive()) is not None:
            kind = message["kind"]
            if kind == "start":
                self.ports = [int(port) for port in message["ports"]]
            elif kind == "stop":
                self.scope.cancel()
            elif kind == "exit":
                self.scope.cancel()
                self.exit.set()
            elif kind == "round" and self.loops is not None:
                await self.loops.ask(int(message["round"]))
            elif kind == "quiet" and self.loops is not None:
                self.loops.close([str(name) for name in message["loops"]])
            elif kind in ("checkpoint", "committed") and self.checkpoints is not None:
                self.checkpoints.deliver(message)
            self.decided.set()
        self.scope.cancel()  # the parent is gone: stop, and end without waiting for anyone
        self.decided.set()
        self.exit.set()

    async def _run_job(self, server: DataServer, client: TcpClient) -> tuple[str, Any]:
        launch, me, ports = self.launch, self.index, self.ports
        assert ports is not None

        def remote(name: str, node: str, index: int) -> TcpChannel:
            channel = client.channel((HOST, ports[launch.where[node, index]]), name)
            self.channels.append(channel)
            return channel

        placement = Placement(
            job=f"{launch.topology.name}.{launch.attempt}",
            local=lambda node, index: launch.where[node, index] == me,
            remote=remote,
            expose=server.register,
        )
        with self.scope:
            try:
                job = Job(
                    launch.topology, channel_factory=LocalChannel, placement=placement, attempt=launch.attempt,
                    quiescence=self.loops, coordinator=self._coordinator(), **launch.options,
                )  # fmt: skip
                result = await job.run()
                for channel in self.channels:  # the receivers have it all before this process lets go
                    await channel.wait_acknowledged()
            except Exception as exc:  # noqa: BLE001 - the job's error: the parent raises it
                return "failed", exc
            return "done", result
        return "stopped", None

    def _coordinator(self) -> Coordinator | None:
        if self.checkpoints is None:
            return None
        clock = self.launch.options.get("clock") or SystemClock()
        return self.checkpoints.coordinator(self.launch.topology.name, clock)

    async def _report(self, kind: str, value: Any) -> None:
        messages: list[dict[str, Any]] = [{"kind": "stopped"}]
        if kind == "done":
            try:
                messages = result_messages(value)
            except EncodingError as exc:  # a collected record msgpack cannot carry to the parent
                kind, value = "failed", exc
        if kind == "failed":
            messages = [{"kind": "failed", "error": described(value)}]
        try:
            for message in messages:
                await self.control.send(message)
        except JobError as exc:  # a message over the control cap (a record too big): the parent learns why
            with contextlib.suppress(OSError):
                await self.control.send({"kind": "failed", "error": described(exc)})
        except OSError:
            pass  # the parent is gone: nobody to tell


def result_messages(result: JobResult) -> list[dict[str, Any]]:
    """What a finished part reports: its collected records and dead letters in chunks, then ``done``."""
    messages: list[dict[str, Any]] = []
    collected = result.collected()
    for name, records in collected.items():
        where = f"to the parent process for sink '{name}'"  # the codec says "channel <where>: the record ..."
        messages += [{"kind": "records", "sink": name, "body": body} for body in record_chunks(records, where)]
    letters = result.dead_letters
    for start in range(0, len(letters), CHUNK):
        chunk = letters[start : start + CHUNK]
        messages.append({
            "kind": "dead_letters",
            "letters": [[d.task, d.instance, d.error, described(d.exception, with_traceback=False)] for d in chunk],
            "records": record_chunks([d.record for d in chunk], "to the parent process for the dead letters"),
        })  # fmt: skip
    sinks = {name: len(records) for name, records in collected.items()}
    messages.append({"kind": "done", "statistics": asdict(result.statistics), "sinks": sinks})
    return messages
