"""A lost worker stays listed: the leader records it (since when, why, the jobs it held) and warns once; status
shows it LOST until it registers again or ``cluster forget-worker`` removes it."""

from __future__ import annotations

from structlog.testing import capture_logs

from streamlet.backends.cluster.client.status import _data_plane
from streamlet.backends.cluster.leader.lost_workers import HEARTBEATS_STOPPED, SESSION_ENDED
from streamlet.backends.cluster.tree import paths
from streamlet.backends.cluster.tree.lost import forget, lost_workers
from streamlet.backends.cluster.tree.status import _gone_row, read_status
from tests.unit.backends.cluster.conftest import MemoryCluster


def row(status: dict[str, object], worker: str) -> dict[str, object]:
    [found] = [w for w in status["workers"] if w["id"] == worker]  # type: ignore[attr-defined]
    return found  # type: ignore[no-any-return]


async def test_a_worker_whose_session_ended_is_listed_lost_with_the_jobs_it_held(cluster: MemoryCluster) -> None:
    await cluster.add_worker("w0", capacity=2)
    await cluster.add_worker("w1", capacity=2)
    await cluster.submit("p")
    await cluster.leader.round()
    held = sorted(i for i, w in (await cluster.assignment("p"))["instances"].items() if w == "w1")  # type: ignore[attr-defined]
    assert held
    cluster.workers["w1"].expire()
    with capture_logs() as logs:
        await cluster.leader.round()
        await cluster.leader.round()  # a second look warns no more
    [warning] = [line for line in logs if line["event"] == "worker lost"]
    assert (warning["log_level"], warning["worker"], warning["why"], warning["jobs"]) == (
        "warning", "w1", SESSION_ENDED, ["p"],
    )  # fmt: skip
    record = (await lost_workers(cluster.client))["w1"]
    assert (record["why"], record["jobs"]) == (SESSION_ENDED, ["p"])
    shown = row(await read_status(cluster.client), "w1")
    assert (shown["state"], shown["address"], shown["lost"]["why"]) == ("LOST", "-", SESSION_ENDED)  # type: ignore[index]
    assert shown["heartbeat"].startswith("lost ")  # type: ignore[attr-defined]
    assert row(await read_status(cluster.client), "w0")["state"] != "LOST"


async def test_a_worker_back_is_no_longer_lost_and_forget_removes_a_record(cluster: MemoryCluster) -> None:
    await cluster.add_worker("w0")
    await cluster.add_worker("w1")
    await cluster.leader.round()
    cluster.workers["w1"].expire()
    await cluster.leader.round()
    assert sorted(await lost_workers(cluster.client)) == ["w1"]
    await cluster.add_worker("w1")  # the same name registers and beats again
    with capture_logs() as logs:
        await cluster.leader.round()
    assert [line["worker"] for line in logs if line["event"] == "lost worker back"] == ["w1"]
    assert await lost_workers(cluster.client) == {}
    assert row(await read_status(cluster.client), "w1")["state"] != "LOST"
    cluster.workers["w0"].expire()
    await cluster.leader.round()
    assert (await forget(cluster.client, "w0"), await forget(cluster.client, "w0")) == (True, False)
    assert [w["id"] for w in (await read_status(cluster.client))["workers"]] == ["w1"]


async def test_a_registered_worker_whose_heartbeats_stopped_is_lost_for_that_reason(cluster: MemoryCluster) -> None:
    await cluster.add_worker("w0")
    await cluster.leader.round()
    cluster.leader.clock = lambda: 1e12  # far past every heartbeat: still registered, no longer live
    await cluster.leader.round()
    assert (await lost_workers(cluster.client))["w0"]["why"] == HEARTBEATS_STOPPED
    assert await cluster.client.get(paths.worker("w0")) is not None
    assert row(await read_status(cluster.client), "w0")["state"] == "LOST"


async def test_a_new_leader_reports_none_it_never_saw_live(cluster: MemoryCluster) -> None:
    """The first look only learns who is live: a worker gone before it is not its to report."""
    await cluster.add_worker("w0")
    cluster.workers["w0"].expire()
    await cluster.leader.round()
    assert await lost_workers(cluster.client) == {}


def test_a_lost_worker_no_longer_registered_does_not_make_the_data_plane_look_mixed() -> None:
    """Its row knows nothing of its TLS (``None``): the data plane is what the registered workers say."""
    registered = {"id": "w0", "tls": True}
    gone = _gone_row("w1", ["p/a.0"])
    assert gone["tls"] is None
    assert _data_plane([registered, gone]) == "mutual TLS (the cluster's CA)"
    assert _data_plane([{"id": "w0", "tls": False}, gone]) == "cleartext (--no-tls: loopback only)"
    assert _data_plane([registered, {"id": "w2", "tls": False}]).startswith("MIXED")
