"""A worker's heartbeat from a thread of its own, so that user code holding the event loop cannot stop it.

A task's plain ``def execute`` runs on the worker's event loop (unless it asks for ``run_in``), and a call
that computes for seconds holds that loop for seconds. A heartbeat sent from the loop would wait behind it,
and the leader would count a healthy, busy worker as lost and restart its jobs: a restart storm with no
fault. So the beat is written by this thread, through the store's ``write_from_thread`` (kazoo's client is
thread-safe, and its own thread keeps the ZooKeeper session). What the loop computes for the heartbeat
(queues, instances, CPU: ``registration.last_load``) is taken as the loop last left it; the thread adds
the time, the loop's lag now and the call holding it (``loop_watch``), which is how the leader tells a
**busy** worker (fresh beats, a lagging loop: reported ``BUSY``, never restarted) from a **lost** one (no
beats: its process or its session is gone).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import structlog

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.registry import WorkerRegistration
from streamlet.core.model import world
from streamlet.core.runtime.loop_watch import HOLDER, LoopLag
from streamlet.errors import CoordinationError

log = structlog.get_logger("streamlet.worker")


class HeartThread:
    """Writes ``registration``'s heartbeat every ``period`` seconds from a daemon thread."""

    def __init__(self, registration: WorkerRegistration, period: float) -> None:
        self.registration = registration
        self.period = period
        self.lag = LoopLag()
        self.beats = 0
        self._at, self._held = time.perf_counter(), world.held_seconds()  # at the last beat: the time, the loop held
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin (on the loop: the lag is measured against it)."""
        self.lag.start()
        self._thread = threading.Thread(target=self._run, name=f"heart-{self.registration.worker_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (the thread ends within one period)."""
        self._stopped.set()
        self.lag.stop()

    def report(self) -> dict[str, Any]:
        """The heartbeat now: the loop's last load report, the time, the loop's lag, the share of the time since
        the last beat its calls of user code held the loop, and who holds it (or held it last)."""
        holding = HOLDER.now()
        now, held = time.perf_counter(), world.held_seconds() + (0.0 if holding is None else holding.seconds)
        share = (held - self._held) / (now - self._at) if now > self._at else 0.0
        self._at, self._held = now, held
        if holding is not None:
            who: dict[str, Any] | None = {
                "task": holding.task,
                "instance": holding.instance,
                "seconds": round(holding.seconds, 3),
            }
        else:
            who = None if HOLDER.last is None else {"task": HOLDER.last[0], "instance": HOLDER.last[1], "seconds": None}
        return {
            **self.registration.last_load,
            "ts": world.wall_time(),
            "beat": self.beats,
            "loop_lag": round(self.lag.seconds(), 3),
            "loop_held_share": round(min(1.0, max(0.0, share)), 3),
            "holding": who,
        }

    def beat(self) -> None:
        """Write one heartbeat (a store out of reach: the next beat tries again)."""
        try:
            self.registration.zk.write_from_thread(paths.load(self.registration.worker_id), self.report())
        except CoordinationError:
            return
        self.beats += 1

    def _run(self) -> None:
        while not self._stopped.wait(self.period):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - the heart must outlive a bad beat; the next one retries
                log.warning("heartbeat failed", error=f"{type(exc).__name__}: {exc}")
