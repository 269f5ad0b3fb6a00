"""Following a cluster's ZooKeeper nodes from a background thread, by watches: what a test or the nemesis
waits on ("the job is RUNNING", "a checkpoint completed") instead of sleeping.

Example:
    >>> with ZkWatch("127.0.0.1:2181", "default", secret) as zk:      # doctest: +SKIP
    ...     zk.wait_for("/jobs/counts/state", lambda s: s["state"] == "FINISHED")
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread

from streamlet.backends.cluster.tree import jobs
from streamlet.backends.cluster.tree.store import read_all, riding_out
from streamlet.backends.cluster.tree.zk import ZkStore
from streamlet.transport.tls import TlsSettings


class NodeHistory:
    """Every version of one node seen through its watch, with the time it was seen."""

    def __init__(self) -> None:
        self.entries: list[tuple[float, int | None, Any]] = []  # (seen at, version, data)
        self._changed = threading.Condition()

    def add(self, version: int | None, data: Any) -> None:
        with self._changed:
            self.entries.append((time.time(), version, data))
            self._changed.notify_all()

    def wait_for(self, wanted: Callable[[Any], bool], seconds: float = 60) -> Any:
        """The first data seen (in order) for which ``wanted`` holds, waiting for it if need be."""
        with self._changed:
            found = self._changed.wait_for(lambda: self._first(wanted) is not None, timeout=seconds)
            assert found, f"not seen within {seconds} s; seen: {[data for _, _, data in self.entries]}"
            return self._first(wanted)

    def wait_for_count(self, count: int, seconds: float = 60) -> None:
        """Wait until ``count`` versions have been seen in all."""
        with self._changed:
            found = self._changed.wait_for(lambda: len(self.entries) >= count, timeout=seconds)
            assert found, f"{len(self.entries)} versions seen within {seconds} s, not {count}"

    def seen_at(self, wanted: Callable[[Any], bool], seconds: float = 60) -> tuple[float, Any]:
        """When (``time.time()``) the first data for which ``wanted`` holds was seen, and that data."""
        self.wait_for(wanted, seconds)
        with self._changed:
            return next((at, data) for at, _, data in self.entries if data is not None and wanted(data))

    def _first(self, wanted: Callable[[Any], bool]) -> Any:
        return next((data for _, _, data in self.entries if data is not None and wanted(data)), None)

    def data(self) -> list[Any]:
        with self._changed:
            return [data for _, _, data in self.entries]

    def versions(self) -> list[int | None]:
        with self._changed:
            return [version for _, version, _ in self.entries]


class ZkWatch:
    """One ZooKeeper session in a background thread, for a test's waits and reads (no job data is written); with the
    cluster's ``secret``, as job data is readable with it only."""

    def __init__(self, hosts: str, cluster: str, secret: bytes, tls: TlsSettings | None = None) -> None:
        self.store = ZkStore(hosts, cluster, session_timeout=10.0, secret=secret, tls=tls)
        self._stack = contextlib.ExitStack()
        self._followers: list[Any] = []

    def __enter__(self) -> ZkWatch:
        self.portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())
        self.portal.call(self.store.start)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for future in self._followers:
            future.cancel()
        with contextlib.suppress(Exception):
            self.portal.call(self.store.aclose)
        with contextlib.suppress(Exception):  # a wait cut short (a test's timeout) must not hold the exit
            self.portal.call(self.portal.stop, True)
        self._stack.close()

    def get(self, path: str) -> tuple[Any, int] | None:
        """The node's data and version, or ``None`` when it does not exist."""
        found: tuple[Any, int] | None = self.portal.call(self._riding_out, self.store.get, path)
        return found

    def data(self, path: str) -> Any:
        found = self.get(path)
        assert found is not None, f"no node {path}"
        return found[0]

    def children(self, path: str) -> list[str]:
        return self.portal.call(self._riding_out, self.store.children, path)

    def status(self, job: str) -> dict[str, Any]:
        """What ``submit`` would report of ``job`` (state, reason, the workers' reports)."""
        found: dict[str, Any] = self.portal.call(self._riding_out, jobs.job_status, self.store, job)
        return found

    def tree(self, path: str) -> dict[str, tuple[Any, int]]:
        """Every node under ``path`` (itself included) with its data and version."""

        async def read(node: str, found: dict[str, tuple[Any, int]]) -> None:
            entry = await self.store.get(node)
            if entry is not None:
                found[node] = entry
            for child in await self.store.children(node):
                await read(f"{node}/{child}", found)

        found: dict[str, tuple[Any, int]] = {}
        self.portal.call(read, path, found)
        return found

    def follow(self, path: str) -> NodeHistory:
        """Record every version of ``path`` from now on (its current one first)."""
        history = NodeHistory()
        started = threading.Event()
        self._followers.append(self.portal.start_task_soon(self._follow, path, history, started))
        assert started.wait(30), f"could not watch {path}"
        return history

    def wait_for(self, path: str, wanted: Callable[[Any], bool], seconds: float = 60) -> Any:
        """Block until ``path`` holds data for which ``wanted`` holds (a watch; ``seconds`` is a safety net)."""
        history = NodeHistory()

        async def watch() -> None:
            with anyio.fail_after(seconds):
                await self._follow(path, history, threading.Event(), until=wanted)

        self.portal.call(watch)
        return history.wait_for(wanted, 0)

    def wait_for_children(
        self, path: str, wanted: Callable[[dict[str, Any]], bool], seconds: float = 60
    ) -> dict[str, Any]:
        """Block until the children of ``path`` (name -> data) satisfy ``wanted`` (a children watch)."""

        async def watch() -> dict[str, Any]:
            changed = await self.store.watch_children(path)
            with anyio.fail_after(seconds):
                while True:
                    changed.clear()
                    found = await read_all(self.store, path)
                    if wanted(found):
                        return found
                    await changed.wait()

        found: dict[str, Any] = self.portal.call(watch)
        return found

    async def _follow(
        self,
        path: str,
        history: NodeHistory,
        started: threading.Event,
        until: Callable[[Any], bool] | None = None,
    ) -> None:
        version: int | None = -2  # matches no version: the first read returns at once
        while True:  # riding out a server that is away (a fault test may have killed it)
            data, version = await riding_out(self.store.wait_changed, path, version)
            history.add(version, data)
            started.set()
            if until is not None and data is not None and until(data):
                return

    @staticmethod
    async def _riding_out(call: Callable[..., Any], *args: Any) -> Any:
        with anyio.fail_after(60):  # a safety net: the server may be away for a moment, not for good
            return await riding_out(call, *args)
