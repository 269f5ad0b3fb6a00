"""The leader's decisions, one round at a time, on the in-memory store (no servers, no sleeps)."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from streamlet.backends.cluster.client import job_commands
from streamlet.backends.cluster.leader.leader import read_view
from streamlet.backends.cluster.tree import jobs, paths
from streamlet.errors import JobError, TopologyError
from tests.unit.backends.cluster.conftest import SECRET, MemoryCluster

LOOP = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("loop")
    source = topology.add_source("numbers", [8])
    halve = topology.map("halve", lambda record: (None, record.value // 2), parallelism=2).set_input(source)
    halve.set_input(halve)
    topology.set_max_iterations(5)
    topology.add_sink("out", sl.CollectSink()).set_input(halve)
    return topology
"""

RESTARTING = """
import streamlet as sl

def build_topology():
    topology = sl.Topology("crashy")
    source = topology.add_source("numbers", [1])
    crashy = topology.map("crashy", lambda record: (None, record.value), on_error="restart", max_failures=1)
    crashy.set_input(source)
    topology.add_sink("out", sl.CollectSink()).set_input(crashy)
    return topology
"""


async def test_a_submitted_job_is_scheduled_over_the_live_workers(cluster: MemoryCluster) -> None:
    """SUBMITTED -> SCHEDULED: attempt 1 places every instance on a registered worker."""
    await cluster.add_worker("w0")
    await cluster.add_worker("w1")
    await cluster.submit("p")
    assert await cluster.state("p") == ("SUBMITTED", "waiting for the leader to schedule it")
    await cluster.leader.round()
    assignment = await cluster.assignment("p")
    assert assignment["attempt"] == 1
    assert sorted(assignment["instances"]) == ["double.0", "double.1", "numbers.0", "out.0"]  # type: ignore[call-overload]
    state, reason = await cluster.state("p")
    assert state == "SCHEDULED"
    assert reason.startswith("assigned to ")


async def test_with_no_worker_a_job_stalls_and_resumes_when_one_joins(cluster: MemoryCluster) -> None:
    """STALLED names why; the round after a worker registers schedules it."""
    await cluster.submit("p")
    await cluster.leader.round()
    assert await cluster.state("p") == ("STALLED", "no live worker can take it: no live worker")
    await cluster.add_worker("w0")
    await cluster.leader.round()
    assert await cluster.state("p") == ("SCHEDULED", "assigned to w0")


async def test_started_then_done_reports_make_a_job_running_then_finished(cluster: MemoryCluster) -> None:
    """RUNNING once every worker of the attempt started; FINISHED once every one reported success."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    await cluster.leader.round()
    await cluster.report("p", 1, "w0", "started", {"at": 0})
    await cluster.leader.round()
    assert await cluster.state("p") == ("RUNNING", "running on w0")
    await cluster.report("p", 1, "w0", "done", {"sinks": {}})
    await cluster.leader.round()
    status = await jobs.job_status(cluster.client, "p")
    assert (status["state"], status["reason"]) == ("FINISHED", "every worker finished (1)")
    assert status["started"] is not None
    assert status["ended"] >= status["started"]


async def test_losing_a_worker_starts_the_next_attempt_on_the_survivor(cluster: MemoryCluster) -> None:
    """Node failover: RUNNING -> RECOVERING with attempt 2 on the live worker only."""
    await cluster.add_worker("w0", capacity=2)
    await cluster.add_worker("w1", capacity=2)
    await cluster.submit("p")
    await cluster.leader.round()
    assert set((await cluster.assignment("p"))["instances"].values()) == {"w0", "w1"}  # type: ignore[attr-defined]
    cluster.workers["w1"].expire()
    await cluster.leader.round()
    assert await cluster.state("p") == ("RECOVERING", "attempt 2: lost w1")
    assignment = await cluster.assignment("p")
    assert assignment["attempt"] == 2
    assert set(assignment["instances"].values()) == {"w0"}  # type: ignore[attr-defined]


async def test_a_lost_workers_instances_are_redeployed_where_their_replicas_are(cluster: MemoryCluster) -> None:
    """w0 and w1 run two instances each (capacity 2), w2 none; the last checkpoint's replicas of w1's are on
    w2: attempt 2 puts them on w2 (co-location would pick w0), and w0's stay where their state is."""
    for worker in ("w0", "w1", "w2"):
        await cluster.add_worker(worker, capacity=2)
    await cluster.submit("p")
    await cluster.leader.round()
    before = (await cluster.assignment("p"))["instances"]
    assert isinstance(before, dict)
    lost = sorted(instance for instance, worker in before.items() if worker == "w1")
    holders = {instance: [worker, "w2" if worker == "w1" else "w1"] for instance, worker in before.items()}
    completed = {"attempt": 1, "epoch": 3, "workers": ["w0", "w1", "w2"], "finished": False, "holders": holders}
    await cluster.client.create(f"{paths.checkpoints('p')}/completed", completed)
    cluster.workers["w1"].expire()
    await cluster.leader.round()
    after = (await cluster.assignment("p"))["instances"]
    assert isinstance(after, dict)
    assert len(lost) == 2
    assert {after[instance] for instance in lost} == {"w2"}
    assert {i: w for i, w in after.items() if i not in lost} == {i: w for i, w in before.items() if i not in lost}


async def test_losing_every_worker_stalls_the_job_until_a_new_one_joins(cluster: MemoryCluster) -> None:
    """All workers gone -> STALLED (not RUNNING on a dead worker); a new worker -> RECOVERING there."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    await cluster.leader.round()
    cluster.workers["w0"].expire()
    await cluster.leader.round()
    assert await cluster.state("p") == ("STALLED", "lost w0; no live worker can take it: no live worker")
    await cluster.add_worker("w9")
    await cluster.leader.round()
    assert await cluster.state("p") == ("RECOVERING", "attempt 2: a worker can take it again")
    assert set((await cluster.assignment("p"))["instances"].values()) == {"w9"}  # type: ignore[attr-defined]


async def test_a_stale_heartbeat_counts_as_a_lost_worker(cluster: MemoryCluster) -> None:
    """A worker whose node is there but whose heartbeat is old is not live."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    cluster.leader.clock = lambda: 1e12  # far past every heartbeat
    await cluster.leader.round()
    assert (await cluster.state("p"))[0] == "STALLED"


async def test_kill_yields_killed_and_is_idempotent(cluster: MemoryCluster) -> None:
    """A second kill changes nothing; kill of an ended job reports its state."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    await cluster.leader.round()
    assert await job_commands.kill(cluster.client, "p") == "SCHEDULED"
    assert await job_commands.kill(cluster.client, "p") == "SCHEDULED"
    await cluster.leader.round()
    assert await cluster.state("p") == ("KILLED", "killed by streamlet kill")
    assert await job_commands.kill(cluster.client, "p") == "KILLED"


async def test_an_ended_job_can_be_removed_and_its_name_reused(cluster: MemoryCluster) -> None:
    """rm refuses a live job, removes an ended one; the name then takes a new job."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    with pytest.raises(JobError, match=r"^job 'p' is SUBMITTED: only an ended job can be removed"):
        await job_commands.remove(cluster.client, "p")
    with pytest.raises(JobError, match=r"^a job called 'p' already exists on cluster 'memory'"):
        await cluster.submit("p")
    await job_commands.kill(cluster.client, "p")
    await cluster.leader.round()
    await job_commands.remove(cluster.client, "p")
    await cluster.submit("p")
    assert await cluster.state("p") == ("SUBMITTED", "waiting for the leader to schedule it")


async def test_a_spec_signed_with_another_secret_fails_without_running(cluster: MemoryCluster) -> None:
    """The leader refuses an unsigned spec before importing its module."""
    await cluster.add_worker("w0")
    await cluster.submit("p", secret=b"someone else")
    await cluster.leader.round()
    assert await cluster.state("p") == (
        "FAILED",
        "cannot load the job: SpecError: job 'p': its spec is not signed with this cluster's secret; "
        "refusing to run it",
    )
    assert await cluster.client.get(paths.assignment("p")) is None


async def test_a_loop_job_is_scheduled_with_its_loop_spread_over_the_workers(cluster: MemoryCluster) -> None:
    """A loop is placed like any chain (its back edge ignored): with room for two instances each, the loop's two
    instances land on different workers."""
    await cluster.add_worker("w0", capacity=2)
    await cluster.add_worker("w1", capacity=2)
    await cluster.submit("loop", source=LOOP)
    await cluster.leader.round()
    assignment = await cluster.assignment("loop")
    assert assignment["instances"] == {"numbers.0": "w0", "halve.0": "w0", "halve.1": "w1", "out.0": "w1"}
    assert await cluster.state("loop") == ("SCHEDULED", "assigned to w0, w1")


async def test_a_loop_with_checkpoints_is_refused_at_submit_naming_the_loop(cluster: MemoryCluster) -> None:
    """Barriers cannot align around a back edge: checkpoints on a loop job are refused before anything is written."""
    spec = job_commands.new_spec(cluster.module(LOOP), {}, {"interval": 1.0, "replicas": None})
    message = "topology 'loop': checkpoints are not supported with cycles yet (back edge from 'halve' into 'halve')"
    with pytest.raises(TopologyError) as refused:
        await job_commands.submit(cluster.client, "loop", spec, SECRET)
    assert str(refused.value) == message
    assert await cluster.client.children(paths.JOBS) == []


async def test_a_task_error_fails_the_job_with_the_workers_error(cluster: MemoryCluster) -> None:
    """An error report without retry -> FAILED, with the error and the worker."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    await cluster.leader.round()
    await cluster.report("p", 1, "w0", "done", {"error": "TaskError: boom"})
    await cluster.leader.round()
    assert await cluster.state("p") == ("FAILED", "TaskError: boom (on w0)")


async def test_a_restartable_crash_moves_the_task_then_fails_past_max_failures(cluster: MemoryCluster) -> None:
    """Instance failover: attempt 2 avoids the worker where it crashed; a second crash exceeds max_failures=1."""
    await cluster.add_worker("w0", capacity=3)
    await cluster.add_worker("w1", capacity=3)
    await cluster.submit("c", source=RESTARTING)
    await cluster.leader.round()
    first = (await cluster.assignment("c"))["instances"]["crashy.0"]  # type: ignore[index]
    crash = {"error": "TaskError: no", "instance": "crashy.0", "retry": True}
    await cluster.report("c", 1, first, "done", crash)
    await cluster.leader.round()
    assert await cluster.state("c") == ("RECOVERING", f"attempt 2: crashy.0 crashed on {first}")
    second = (await cluster.assignment("c"))["instances"]["crashy.0"]  # type: ignore[index]
    assert second != first
    await cluster.report("c", 2, second, "done", crash)
    await cluster.leader.round()
    where = ", ".join(sorted({first, second}))
    assert await cluster.state("c") == (
        "FAILED",
        f"instance 'crashy.0' failed 2 times (max_failures=1) on {where}; last error: TaskError: no",
    )


async def test_a_deposed_leader_changes_nothing(cluster: MemoryCluster) -> None:
    """A write based on a stale read of the state is refused (conditional on its version)."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    view = await read_view(cluster.leader.store, "p")
    await job_commands.kill(cluster.client, "p")
    await cluster.leader.round()
    assert view is not None
    assert await cluster.leader._schedule(view) is None
    assert await cluster.state("p") == ("KILLED", "killed by streamlet kill")


async def test_a_module_changed_after_submit_fails_the_job_naming_the_file(cluster: MemoryCluster) -> None:
    """The spec records the module's SHA-256: code that differs from what was submitted does not run."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    module = cluster.tmp_path / "job_module.py"
    module.write_text(module.read_text() + "\n# changed\n", encoding="utf-8")
    await cluster.leader.round()
    state, reason = await cluster.state("p")
    assert state == "FAILED"
    assert reason.startswith(f"cannot load the job: SpecError: job 'p': {module} here differs from the module that")


async def test_a_heartbeat_missed_while_the_leader_could_not_see_the_store_is_not_held_against_the_worker(
    cluster: MemoryCluster,
) -> None:
    """The job runs on w0, whose last heartbeat is 60 s old: a leader that has seen the store all along counts
    w0 lost; one whose view came back a second ago (the store was down, or out of quorum) gives w0 the usual
    5 s from then, and counts it lost only once they pass without a beat."""
    await cluster.add_worker("w0")
    await cluster.submit("p")
    await cluster.leader.round()
    beat = float((await cluster.client.get(paths.load("w0"))).data["ts"])  # type: ignore[union-attr]
    now = [beat + 60.0]
    cluster.leader.clock = lambda: now[0]
    cluster.leader.seeing_since = now[0] - 1.0
    await cluster.leader.round()
    assert (await cluster.state("p"))[0] == "SCHEDULED"
    now[0] += 4.5  # 5.5 s since it saw the store again
    await cluster.leader.round()
    assert await cluster.state("p") == ("STALLED", "lost w0; no live worker can take it: no live worker")


async def test_the_leader_counts_staleness_from_when_its_store_connection_came_back(cluster: MemoryCluster) -> None:
    """The leader's rounds skip while its store is suspended; the first look after it is connected again
    marks the moment, by the leader's clock."""
    await cluster.add_worker("w0")
    leader = cluster.leader
    now = [1000.0]
    leader.clock = lambda: now[0]
    store = leader.store
    async with anyio.create_task_group() as group:
        group.start_soon(leader.run)
        await wait_all_tasks_blocked()
        made = leader.seeing_since  # when it was made: its term began
        store.state = "suspended"
        await cluster.add_worker("w1")  # wakes the leader: it sees the store suspended
        await wait_all_tasks_blocked()
        assert leader.seeing_since == made
        now[0] = 1042.0
        store.state = "connected"
        await cluster.add_worker("w2")
        await wait_all_tasks_blocked()
        assert leader.seeing_since == 1042.0
        group.cancel_scope.cancel()
