"""A task's plain ``def execute`` run off the event loop (``run_in="thread"`` or ``"process"``, see
:mod:`streamlet.core.model.run_in`).

In a thread: ``anyio.to_thread.run_sync`` with the instance's own task object, inputs and outputs (the
instance waits for the call, so nothing else touches them meanwhile; emitting only buffers).

In a process: a job's :class:`ProcessPool` forks its processes from the process that runs the job, after
every task run so has registered its factory, so each process makes its own task objects (one per task,
``prepare``d with the task's config) without anything being pickled but the call's bytes. A call sends
the batch packed with the state codec and gets back what ``execute`` emitted, in order, or the error it
raised (its type's name, message and traceback), which the instance raises as a :class:`RemoteError` of
the same name, so the task's error policy applies as on the loop.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import anyio.to_thread

from streamlet.core.model.encoding import packb, unpackb
from streamlet.core.model.ports import Inputs
from streamlet.core.model.task import RecordFailure, Task
from streamlet.core.runtime.outputs import RoutedOutputs
from streamlet.errors import RemoteError, TopologyError

Factory = tuple[Callable[[], Task], dict[str, Any], int, int, bool]  # make_task, config, inputs, outputs, late


_ERRORS: dict[str, type[RemoteError]] = {}


def remote_error(name: str, message: str, trace: str) -> RemoteError:
    """The error to raise here for one of type ``name`` raised there (named alike, so messages read the same)."""
    kind = _ERRORS.get(name)
    if kind is None:
        kind = _ERRORS[name] = type(name, (RemoteError,), {"__module__": "streamlet.remote"})
    error = kind(message)
    error.remote_traceback = trace
    return error


def in_thread(execute: Callable[[Inputs, RoutedOutputs], Any]) -> Callable[[Inputs, RoutedOutputs], Any]:
    """``execute`` as an awaitable call that runs it in a thread."""

    async def call(inputs: Inputs, outputs: RoutedOutputs) -> None:
        await anyio.to_thread.run_sync(execute, inputs, outputs)

    return call


# -- in a process ------------------------------------------------------------------------------------------

#: Task factories by key (``job/task``), registered before a pool forks: its processes inherit them.
_FACTORIES: dict[str, Factory] = {}
#: In a process of a pool: the task objects made so far, by key.
_MADE: dict[str, tuple[Task, Inputs, RoutedOutputs, list[tuple[int, list[Any]]]]] = {}


class _Collect:
    """A route that keeps what is emitted on one port, for the reply (in the pool's process)."""

    def __init__(self, port: int, emitted: list[tuple[int, list[Any]]]) -> None:
        self.port = port
        self.emitted = emitted

    def add(self, element: Any) -> None:
        emitted = self.emitted
        if emitted and emitted[-1][0] == self.port:
            emitted[-1][1].append(element)
        else:
            emitted.append((self.port, [element]))

    def add_batch(self, batch: list[Any]) -> None:
        for element in batch:
            self.add(element)


def _made(key: str) -> tuple[Task, Inputs, RoutedOutputs, list[tuple[int, list[Any]]]]:
    found = _MADE.get(key)
    if found is None:
        make_task, config, inputs, outputs, late = _FACTORIES[key]
        task = make_task()
        name = key.rsplit("/", 1)[-1]
        task.state = _NoState(name)  # type: ignore[assignment]
        task.prepare(dict(config))
        emitted: list[tuple[int, list[Any]]] = []
        numbers = [*range(outputs), *([-1] if late else [])]
        routes = [[_Collect(number, emitted)] for number in numbers]
        collecting = RoutedOutputs(routes, [route[0].add for route in routes], late=late)  # type: ignore[arg-type]
        found = _MADE[key] = (task, Inputs(inputs, where=f"task '{name}'"), collecting, emitted)
    return found


def run_batch(key: str, packed: bytes) -> bytes:
    """In a process of the pool: one call of ``execute``; the reply packed (``ok`` and what was emitted by
    port in order, or ``error`` with the type's name, message and traceback)."""
    try:
        task, inputs, outputs, emitted = _made(key)
        port, batches, ts = unpackb(packed)
        if port is None:
            inputs.set_all(batches)
        else:
            inputs.set_one(port, batches[port])
        outputs.ts = ts
        emitted.clear()
        task.execute(inputs, outputs)
        return packb(("ok", emitted))
    except RecordFailure as failure:  # a shortcut names the record that failed, having emitted those before it
        cause = failure.__cause__ or failure
        return packb(("record", emitted, failure.index, type(cause).__name__, str(cause), traceback.format_exc()))
    except Exception as exc:  # noqa: BLE001 - the reply carries it to the instance, whose policy applies
        wiring = isinstance(exc, TopologyError)
        return packb(("wiring" if wiring else "error", type(exc).__name__, str(exc), traceback.format_exc()))


class _NoState:
    """``self.state`` in a process of the pool: there is none (stateless tasks only)."""

    def __init__(self, task: str) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        raise TopologyError(
            f"task '{self._task}': run_in='process' runs execute in another process, which has no self.state "
            "(stateless tasks only): use run_in='thread', or keep the state in a task of its own"
        )


class ProcessPool:
    """The processes one job's ``run_in="process"`` tasks run in (made at the first call, after every such
    task registered; shut down with the job)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._executor: ProcessPoolExecutor | None = None

    def register(self, key: str, factory: Factory) -> None:
        """Make the task ``key`` known to the processes forked from now on (before the first call)."""
        if self._executor is not None and key not in _FACTORIES:
            raise TopologyError(f"task '{key}': registered for run_in='process' after the pool started")
        _FACTORIES[key] = factory

    def caller(self, key: str) -> Callable[[Inputs, RoutedOutputs], Any]:
        """An awaitable ``execute(inputs, outputs)`` that runs ``key``'s task in a process of the pool."""

        async def call(inputs: Inputs, outputs: RoutedOutputs) -> None:
            port = inputs.port
            batches = [inputs.elements(number) for number in range(inputs.port_count)]
            packed = packb((port, batches, outputs.ts))
            reply = unpackb(await asyncio.get_running_loop().run_in_executor(self._pool(), run_batch, key, packed))
            if reply[0] in ("ok", "record"):
                for number, elements in reply[1]:
                    outputs.emit_elements(elements, number)
                if reply[0] == "ok":
                    return
                _, _, index, name, message, trace = reply
                raise RecordFailure(index) from remote_error(name, message, trace)
            kind, name, message, trace = reply
            if kind == "wiring":
                raise TopologyError(message)
            raise remote_error(name, message, trace)

        return call

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # forked, so the processes inherit the factories (a spawned one would have to import them)
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
        return self._executor

    def shutdown(self) -> None:
        """Stop the processes (calls in flight are abandoned: the job has ended)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def process_pool_for(topology: Any, job_id: str) -> ProcessPool | None:
    """The pool for ``topology``'s ``run_in="process"`` tasks, each registered (``None``: it has none)."""
    nodes = [node for node in topology.nodes.values() if node.run_in == "process"]
    if not nodes:
        return None
    pool = ProcessPool()
    for node in nodes:
        assert node.make_task is not None
        pool.register(f"{job_id}/{node.name}", (node.make_task, dict(node.config), node.inputs, node.outputs, True))
    return pool
