"""A worker's part of the cluster's jobs: watch assignments, run the local instances, report."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from streamlet.backends.cluster.checkpoints import AttemptInfo, ClusterCheckpoints
from streamlet.backends.cluster.coordinator import CoordinationError, NodeExists, ZkCoordinator
from streamlet.backends.cluster.election import EpochFence
from streamlet.backends.cluster.jobs import JOBS, instance_id, spec_of, topology_of
from streamlet.backends.cluster.registry import WorkerRegistration, workers
from streamlet.core.clock import SystemClock
from streamlet.core.plan import Placement
from streamlet.core.runtime import Job, JobResult
from streamlet.core.topology import Topology
from streamlet.errors import TaskError
from streamlet.transport.local import LocalChannel
from streamlet.transport.tcp import DataServer
from streamlet.transport.tcp_client import TcpClient

log = structlog.get_logger("streamlet")
POLL = 0.2


class WorkerJobs:
    """Starts this worker's share of every assigned job, once, and reports how it ended."""

    def __init__(
        self,
        zk: ZkCoordinator,
        registration: WorkerRegistration,
        server: DataServer,
        client: TcpClient,
    ) -> None:
        self.zk = zk
        self.registration = registration
        self.me = registration.worker_id
        self.server = server
        self.client = client
        self.fence = EpochFence()
        self.seen: dict[str, int] = {}  # job -> the attempt last looked at
        self.running: dict[tuple[str, int], anyio.CancelScope] = {}
        self.jobs: dict[tuple[str, int], Job] = {}
        self.killed: set[str] = set()
        self.failed: set[str] = set()  # the leader gave up on these: stop, report nothing more

    async def run(self) -> None:
        """Poll for assignments and kill requests until cancelled."""
        async with anyio.create_task_group() as group:
            while True:
                try:
                    await self._poll(group)
                except CoordinationError as exc:  # suspended or expired: kazoo reconnects, the next poll retries
                    log.debug("job poll skipped", worker=self.me, reason=str(exc))
                await anyio.sleep(POLL)

    async def _poll(self, group: anyio.abc.TaskGroup) -> None:
        for job in await self.zk.children(JOBS):
            found = await self.zk.get(f"{JOBS}/{job}/assignment")
            if found is None:
                continue
            assignment, version = found
            attempt = int(assignment.get("attempt", 1))
            self._stop_outdated(job, attempt)
            new_attempt = self.seen.get(job) != attempt
            # only jobs this worker runs, or may start now, are worth asking about (finished ones are not)
            if (new_attempt or any(running == job for running, _ in self.running)) and await self._ended(job):
                self._cancel(job)
                continue
            if not new_attempt:
                continue
            self.seen[job] = attempt
            if not self.fence.accept(int(assignment["epoch"])):
                log.warning("ignoring an assignment from a deposed leader", job=job, epoch=assignment["epoch"])
                continue
            instances: dict[str, str] = assignment["instances"]
            if self.me in instances.values():
                group.start_soon(self._run_job, job, attempt, version, instances)

    async def _ended(self, job: str) -> bool:
        """Someone killed the job, or the leader gave up on it; both are final, so remembered."""
        if job in self.killed or job in self.failed:
            return True
        if await self.zk.get(f"{JOBS}/{job}/kill") is not None:
            self.killed.add(job)
            return True
        if await self.zk.get(f"{JOBS}/{job}/failed") is not None:
            self.failed.add(job)
            return True
        return False

    def _cancel(self, job: str) -> None:
        for (running_job, _), scope in self.running.items():
            if running_job == job:
                scope.cancel()

    def queue_depths(self) -> dict[str, tuple[int, bool]]:
        """Every local receiving instance's queue: ``"job/node.index"`` -> (items queued, inbox full)."""
        depths = {}
        for (job, _), running in self.jobs.items():
            for (node, index), depth in running.queue_depths().items():
                depths[f"{job}/{instance_id(node, index)}"] = depth
        return depths

    def _stop_outdated(self, job: str, attempt: int) -> None:
        # a newer attempt replaces this one (a worker was lost): drop it without reporting
        for (running_job, running_attempt), scope in self.running.items():
            if running_job == job and running_attempt < attempt:
                scope.cancel()

    async def _run_job(self, job: str, attempt: int, version: int, instances: dict[str, str]) -> None:
        scope = self.running[job, attempt] = anyio.CancelScope()
        payload: dict[str, Any] | None = None
        try:
            with scope:
                await self.registration.set_state("LIVE", "running")
                tcp_before = self.server.counts["records"]
                result, restored_from = await self._execute(job, attempt, version, instances)
                payload = {
                    "restored_from": restored_from,
                    "sinks": _records(result),
                    "statistics": _plain(asdict(result.statistics)),
                    "tcp_records_in": self.server.counts["records"] - tcp_before,
                }
            if scope.cancelled_caught and job in self.killed:
                payload = {"error": "killed"}
        except TaskError as exc:  # an instance crashed: the leader may restart it elsewhere
            payload = {"error": f"TaskError: {exc}", "instance": instance_id(exc.task, exc.instance)}
            payload["retry"] = await self._restartable(job, exc.task)
        except Exception as exc:  # noqa: BLE001 - whatever stopped the job is reported to the submitter
            payload = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            del self.running[job, attempt]
            self.jobs.pop((job, attempt), None)
        if job in self.failed:
            payload = None  # the leader has given up on the job already
        if payload is not None:  # None: superseded by a newer attempt
            await self._report(f"{JOBS}/{job}/done/{attempt}", payload, (f"{JOBS}/{job}/assignment", version))
        if not self.running:
            await self.registration.set_state("STANDBY", "waiting")

    async def _report(self, directory: str, payload: dict[str, Any], fence: tuple[str, int]) -> None:
        """Report the attempt's outcome, fenced: only while the assignment is still the one this ran."""
        # retry through a suspended or re-established session: the outcome must reach ZooKeeper
        for _ in range(100):
            try:
                await self.zk.ensure(directory)
                if await self.zk.write_fenced(f"{directory}/{self.me}", payload, None, fence):
                    return
                if await self.zk.get(f"{directory}/{self.me}") is None:
                    log.warning("dropping the outcome of a replaced attempt", path=directory)
                return  # reported already, or the job moved on to a newer attempt
            except CoordinationError:
                await anyio.sleep(0.2)
        log.error("could not report a job's outcome", path=directory)

    async def _execute(
        self, job: str, attempt: int, version: int, instances: dict[str, str]
    ) -> tuple[JobResult, int | None]:
        """Run this worker's share of the attempt; the result and the checkpoint it resumed from."""
        spec = await spec_of(self.zk, job)
        assert spec is not None
        topology = topology_of(spec)
        addresses = {
            view.worker_id: (view.info["host"], int(view.info["data_port"])) for view in await workers(self.zk)
        }
        placement = Placement(
            job=f"{job}.{attempt}",  # channel ids per attempt: an old attempt's frames never mix in
            local=lambda node, index: instances[instance_id(node, index)] == self.me,
            remote=lambda name, node, index: self.client.channel(addresses[instances[instance_id(node, index)]], name),
            expose=self.server.register,
        )
        await self._publish_endpoints(job, topology, instances)
        checkpoints = self._checkpoints(job, attempt, version, instances, spec.get("checkpoint"))
        running = Job(topology, channel_factory=LocalChannel, placement=placement, coordinator=checkpoints)
        self.jobs[job, attempt] = running
        result = await running.run()
        return result, None if checkpoints is None else checkpoints.restored_from

    async def _restartable(self, job: str, task: str) -> bool:
        spec = await spec_of(self.zk, job)
        return spec is not None and topology_of(spec).nodes[task].on_error == "restart"

    def _checkpoints(
        self, job: str, attempt: int, version: int, instances: dict[str, str], settings: dict[str, Any] | None
    ) -> ClusterCheckpoints | None:
        if settings is None:
            return None
        info = AttemptInfo(job, attempt, self.me, sorted(set(instances.values())), version)
        return ClusterCheckpoints(self.zk, info, Path(settings["directory"]), settings.get("interval"), SystemClock())

    async def _publish_endpoints(self, job: str, topology: Topology, instances: dict[str, str]) -> None:
        # seed 000: where each receiving instance port of this worker is served
        address = f"{self.server.host}:{self.server.port}"
        for node in topology.nodes.values():
            for index in range(node.parallelism):
                if instances[instance_id(node.name, index)] != self.me:
                    continue
                for port in range(node.inputs):
                    path = f"{JOBS}/{job}/channels/{instance_id(node.name, index)}@{port}"
                    try:
                        await self.zk.create(path, address)
                    except NodeExists:
                        await self.zk.set(path, address)


def _records(result: JobResult) -> dict[str, list[list[Any]]]:
    return {name: [[r.key, r.value, r.ts] for r in records] for name, records in result.collected().items()}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)
