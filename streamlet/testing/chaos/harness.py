"""The whole cluster under one seed: masters and workers as parties of a :class:`SimLoop`, and the faults.

:class:`ChaosCluster` starts each master as ``streamlet master`` runs it
(``campaign_and_lead``: campaign, lead, campaign again after a lost session)
and each worker as ``streamlet worker`` does (``assemble_worker`` and
``serve_worker``: its data server, heartbeat and job parts), every one on a
:class:`~streamlet.testing.chaos.sessions.SimSession` of one shared tree, its
own folder for files, and the in-memory network between them. Nothing of the
cluster's code is replaced: it runs on virtual time, draws its ids and nonces
from the seed (:class:`SimWorld`), and does its file work inline.

The fault methods are what a nemesis does to processes and links: kill
(callbacks dropped, the session expiring only after its timeout), pause and
resume, partitions between two parties or a party and the store, a slow
party, an expired session, a lost disk, a restart.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from streamlet.backends.cluster.local.run import campaign_and_lead
from streamlet.backends.cluster.tree.paths import WorkerInfo
from streamlet.backends.cluster.worker.serving import WorkerSeams, assemble_worker, serve_worker
from streamlet.core.model.world import RealWorld
from streamlet.testing.chaos.loop import SimLoop
from streamlet.testing.chaos.network import STORE, Network
from streamlet.testing.chaos.parties import Party
from streamlet.testing.chaos.sessions import SimSession, Trace, TracingTree
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient

EPOCH_BASE = 1_800_000_000.0  # the simulated wall clock starts here (2027-01-15): virtual time is added to it


@dataclass(frozen=True)
class ClusterShape:
    """How big the simulated cluster is and how its timers are set (seconds of virtual time)."""

    masters: int = 2
    workers: int = 3
    capacity: int = 4
    session_timeout: float = 4.0
    heartbeat: float = 1.0


class SimWorld(RealWorld):
    """The world of a simulation: the loop's virtual clock, bytes from the seed, blocking calls inline."""

    def __init__(self, loop: SimLoop, rng: random.Random) -> None:
        self.loop = loop
        self.rng = rng

    def wall_time(self) -> float:
        return EPOCH_BASE + self.loop.time()

    def monotonic(self) -> float:
        return self.loop.time()

    def loop_time(self) -> float:
        return self.loop.time()  # virtual time: no call holds it

    def watches_loop(self) -> bool:
        return False  # virtual time does not lag

    def cpu_time(self) -> float:
        return self.loop.time()  # virtual: a call takes none, however long this machine takes to run it

    def token_bytes(self, count: int) -> bytes:
        return self.rng.randbytes(count)

    async def blocking(self, call: Callable[..., Any], *args: Any) -> Any:
        return call(*args)


@dataclass
class _Process:
    """One master or worker: its party (replaced at a restart), its session, its disk."""

    name: str
    role: str  # "master" or "worker"
    number: int
    party: Party
    session: SimSession
    expiry: asyncio.TimerHandle | None = None


@dataclass
class ChaosCluster:
    """Masters and workers of one simulated run (see the module)."""

    seed: int
    shape: ClusterShape
    folder: Path
    loop: SimLoop
    network: Network
    trace: Trace
    tree: TracingTree
    rng: random.Random
    secret: bytes
    name: str
    processes: dict[str, _Process] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)  # killed and not restarted yet
    buried: list[Party] = field(default_factory=list)  # the parties of processes killed and started again
    harness: contextvars.Context | None = None  # the driver's context: the run's world, no party
    savepoints: list[asyncio.Future[bool]] = field(default_factory=list)  # those a client is taking

    @classmethod
    def make(cls, seed: int, shape: ClusterShape, folder: Path) -> ChaosCluster:
        """A cluster whose every choice follows from ``seed`` (nothing started yet)."""
        rng = random.Random(seed)
        network = Network(random.Random(rng.getrandbits(64)))
        loop = SimLoop(network)
        trace = Trace(loop.time, folder=str(folder.resolve()))
        network.note = trace.add
        tree = TracingTree(trace=trace)
        secret = rng.randbytes(32)
        return cls(seed, shape, folder, loop, network, trace, tree, rng, secret, f"chaos-{seed}")

    def world(self) -> SimWorld:
        """The world the run's code lives in (its own generator: the cluster's choices do not shift it)."""
        return SimWorld(self.loop, random.Random(self.rng.getrandbits(64)))

    @property
    def masters(self) -> list[str]:
        return [f"master-{n}" for n in range(self.shape.masters)]

    @property
    def workers(self) -> list[str]:
        return [f"worker-{n}" for n in range(self.shape.workers)]

    def client_session(self) -> SimSession:
        """A session for the harness's own reads and writes (submit, status): it is never cut."""
        return SimSession(self.tree, self.name, self.network, "client")

    # -- starting ---------------------------------------------------------------------------------

    def start_all(self) -> None:
        """Every master and worker, each on its own party (called by the run's driver, whose context the
        harness's own timers then run in)."""
        self.harness = contextvars.copy_context()
        for number, name in enumerate(self.masters):
            self._start(name, "master", number)
        for number, name in enumerate(self.workers):
            self._start(name, "worker", number)

    def add_worker(self) -> str:
        """A new worker joins the running cluster, named after the last; returns its name."""
        number = sum(1 for process in self.processes.values() if process.role == "worker")
        name = f"worker-{number}"
        self._start(name, "worker", number)
        return name

    def _start(self, name: str, role: str, number: int) -> None:
        party = Party(name)
        session = SimSession(self.tree, self.name, self.network, name)
        process = _Process(name, role, number, party, session)
        self.processes[name] = process
        self.trace.add(f"start {name}")
        main = self._master(process) if role == "master" else self._worker(process)
        self.loop.start_party(party, main)

    async def _master(self, process: _Process) -> None:
        identity = {"name": process.name, "pid": 1000 + process.number, "host": "sim"}
        await campaign_and_lead(process.session, self.name, process.name, self.secret, None, identity)

    async def _worker(self, process: _Process) -> None:
        pid = 2000 + process.number
        async with DataServer(self.secret) as server, TcpClient(self.secret, name=process.name) as client:
            info: WorkerInfo = {
                "host": server.host, "data_port": server.port, "capacity": self.shape.capacity, "labels": [],
                "pid": pid,
            }  # fmt: skip
            seams = WorkerSeams(  # virtual time: the heartbeat beats from the loop, as the rest of the party
                load_sample=lambda: {"cpu_seconds": 0.0, "rss_bytes": 50_000_000, "pid": pid}, heart_thread=False
            )
            worker = assemble_worker(
                process.session, process.name, info, server, client, self.secret, self.folder / process.name,
                self.shape.heartbeat, seams,
            )  # fmt: skip
            async with anyio.create_task_group() as group:
                await group.start(serve_worker, worker)
                await anyio.sleep_forever()

    # -- faults -----------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL: callbacks dropped, links closed by the "kernel", the session expiring after its timeout."""
        process = self.processes[name]
        self.trace.add(f"kill {name}")
        process.party.kill()
        self.network.cut_party(name)
        self._lose_store(process)
        self.down.add(name)

    def restart(self, name: str, *, lose_disk: bool = False) -> None:
        """Start a killed process again under its name (``lose_disk``: its folder is gone)."""
        process = self.processes[name]
        if name not in self.down:
            return
        self.down.discard(name)
        self.buried.append(process.party)
        if lose_disk:
            self.trace.add(f"disk lost {name}")
            shutil.rmtree(self.folder / name, ignore_errors=True)
        self._start(name, process.role, process.number)

    def pause(self, name: str) -> None:
        """SIGSTOP: nothing of it runs while time goes on; its session expires if the pause is long."""
        process = self.processes[name]
        self.trace.add(f"pause {name}")
        process.party.pause()
        self._lose_store(process)

    def resume(self, name: str) -> None:
        """SIGCONT: what it held runs, and it reaches the store again (learning of an expired session)."""
        process = self.processes[name]
        if process.party.dead:
            return
        self.trace.add(f"resume {name}")
        process.party.resume(self.loop)
        self._reach_store(process)

    def partition(self, one: str, other: str) -> None:
        """Nothing moves between the two (``STORE`` for a party and the store)."""
        self.trace.add(f"partition {one}|{other}")
        self.network.partition(one, other)
        for name in (one, other):
            if STORE in (one, other) and name in self.processes:
                self._lose_store(self.processes[name])

    def heal(self, one: str, other: str) -> None:
        """The partition between the two is over."""
        self.trace.add(f"heal {one}|{other}")
        self.network.heal(one, other)
        for name in (one, other):
            process = self.processes.get(name)
            if STORE not in (one, other) or process is None:
                continue
            if not process.party.dead and not process.party.paused:  # a killed one's session expires all the same
                self._reach_store(process)

    def slow(self, name: str, factor: float) -> None:
        """Every link of ``name`` takes ``factor`` times as long (1: normal again)."""
        self.trace.add(f"slow {name} x{factor:g}")
        self.network.set_slow(name, factor)

    def expire(self, name: str) -> None:
        """The store expires the party's session now (it hears "lost", then opens a new one)."""
        process = self.processes[name]
        if process.party.dead or process.party.paused or self.network.blocked(name, STORE):
            return
        self.trace.add(f"expire {name}")
        process.session.cut()
        process.session.expire_unseen()
        process.session.reconnect()

    def _lose_store(self, process: _Process) -> None:
        process.session.cut()
        if process.expiry is None:
            when = self.loop.time() + self.shape.session_timeout
            process.expiry = self.later(when, self._expired, process)

    def later(self, when: float, action: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        """Run ``action(*args)`` at virtual time ``when`` as the harness: never as the party whose doing
        brought it about (a kill at a crash point happens inside the victim's write; its restart must not
        die with it)."""
        handle: asyncio.TimerHandle = self.loop.call_at(when, action, *args, context=self.harness)
        return handle

    def _expired(self, process: _Process) -> None:
        process.expiry = None
        self.trace.add(f"session expired {process.name}")
        process.session.expire_unseen()

    def _reach_store(self, process: _Process) -> None:
        if process.expiry is not None:
            process.expiry.cancel()
            process.expiry = None
        process.session.reconnect()
