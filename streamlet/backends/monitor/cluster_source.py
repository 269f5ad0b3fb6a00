"""Readings of the whole cluster, from ZooKeeper alone: what the leader's dashboard shows."""

from __future__ import annotations

import ssl
import time
from typing import Any

from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.outline import Outlines
from streamlet.backends.cluster.tree.quorum import refuse_without_quorum
from streamlet.backends.cluster.tree.registry import workers
from streamlet.backends.cluster.tree.signing import verify
from streamlet.backends.cluster.tree.status import read_status
from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.backends.monitor.views import Reading, graph_of
from streamlet.core.model import world
from streamlet.errors import StreamletError


class ClusterSource:
    """Readings of the whole cluster from ZooKeeper (every worker's heartbeat carries its statistics)."""

    def __init__(
        self,
        store: ClusterStore,
        secret: bytes,
        outlines: Outlines | None = None,
        zookeepers: str | None = None,
        zookeeper_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.store = store
        self.zookeepers = zookeepers  # the connect string: each member's mode is shown, and a lost quorum said
        self.zookeeper_tls = zookeeper_tls  # members reached on their TLS client ports are asked over TLS
        self.secret = secret
        self.outlines = Outlines(secret=secret) if outlines is None else outlines  # the leader's: each job built once
        self._graphs: dict[str, dict[str, Any]] = {}  # spec uid -> graph

    async def read(self) -> Reading:
        """The cluster now; :class:`~streamlet.errors.NoQuorum` when the ZooKeeper ensemble has none."""
        modes = None
        if self.zookeepers is not None:
            modes = await world.blocking(refuse_without_quorum, self.zookeepers, self.zookeeper_tls)
        status = await read_status(self.store)
        if modes is not None:
            status["zookeeper"] = [{"address": address, "mode": mode} for address, mode in modes]
        samples = [{"worker": view.worker_id, "load": view.load or {}} for view in await workers(self.store)]
        jobs = [await self._job(job) for job in status.pop("jobs")]
        return Reading(time.time(), status, samples, jobs)

    async def _job(self, status: dict[str, Any]) -> dict[str, Any]:
        name = status["name"]
        completed = await self.store.get(paths.completed(name))
        checkpoint = None if completed is None else {key: completed.data.get(key) for key in ("epoch", "attempt", "at")}
        return {**status, "graph": await self._graph(name), "checkpoint": checkpoint}

    async def _graph(self, job: str) -> dict[str, Any] | None:
        """The job's topology graph: its spec's signature checked before any of its code is imported."""
        found = await self.store.get(paths.spec(job))
        if found is None:
            return None
        uid = str(found.data.get("uid"))
        if uid not in self._graphs:
            try:
                shape = await self.outlines.build(verify(job, found.data, self.secret))  # never run here
            except StreamletError as exc:  # a bad signature: shown as such
                shape = f"{type(exc).__name__}: {exc}"
            if isinstance(shape, str):
                self._graphs[uid] = {"nodes": [], "edges": [], "error": shape}
            else:
                self._graphs[uid] = graph_of(shape)
        return self._graphs[uid]
