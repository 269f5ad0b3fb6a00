"""Every node of a cluster's tree, and the JSON it holds: one function per path.

All paths are relative to the cluster's root ``/streamlet/<cluster>``::

    /leader                               LeaderNode     ephemeral: the leading master and its epoch
    /epoch                                {"epoch": n}   the last epoch handed out (only grows)
    /candidates/c-<seq>                   identity       ephemeral sequential: masters waiting to lead
    /workers/<id>                         WorkerInfo     ephemeral: address, capacity, labels, states
    /loads/<id>                           dict           ephemeral heartbeat: cpu, memory, queues
    /jobs/<job>/spec                      JobSpec        what to run, signed with the cluster secret
    /jobs/<job>/state                     JobStateNode   lifecycle as data, written by the leader
    /jobs/<job>/assignment                Assignment     the attempt: instance -> worker
    /jobs/<job>/started/<attempt>/<id>    {"at": t}      the worker has built its part of the attempt
    /jobs/<job>/done/<attempt>/<id>       DoneReport     how the worker's part ended
    /jobs/<job>/kill                      {"by", "at"}   someone asked for the job to stop
    /jobs/<job>/failures/<inst>/<attempt> Failure        the instance crashed in that attempt
    /jobs/<job>/channels/<inst>@<port>    "host:port"    where a receiving instance port is served
    /jobs/<job>/checkpoints/...           see ``checkpoints``
    /jobs/<job>/reconfigure               ReconfigureRequest  a client asks for a rescale (one at a time)
    /jobs/<job>/reconfigure-refused       {"error", "at"}     why the leader refused the last request
    /jobs/<job>/reconfigurations/<id>     Reconfiguration     the leader's plan of one live change
    /jobs/<job>/reconfigurations/<id>/wired/<worker>          the worker's part is wired in (then all go)
    /jobs/<job>/reconfigurations/<id>/done/<worker>           the worker's part is over
    /jobs/<job>/layout                    Layout         what live changes made of the job: parallelism, tables
    /jobs/<job>/decisions/d-<seq>         {"at", "policy", "action", "reason"}  the adaptation loop decided
    /jobs/<job>/loops/attempt-<n>/round             LoopRound    the termination detector asks for counters
    /jobs/<job>/loops/attempt-<n>/counters/<id>     LoopAnswer   a worker's loop counters for that round
    /jobs/<job>/loops/attempt-<n>/quiet             LoopQuiet    the loops found quiet for good (see ``termination``)
    /cpu-hints                            CpuHints       what the spread policy measured: topology -> task -> hint

(ZooKeeper does not allow children under an ephemeral node, so a worker's
heartbeat lives at ``/loads/<id>``, not under ``/workers/<id>``.)

Who may read what: the root and the cluster's own nodes (:data:`WORLD_READABLE`: who leads, the epoch,
the candidates, the registered workers, the dashboard's URL) are readable by anyone who reaches ZooKeeper;
they hold no job data. Every other node is readable only with the cluster secret: ``/jobs`` and all below it
(job names, specs, reports with collected records and dead letters, layouts, savepoint folders) and
``/loads`` (heartbeats carry per-instance statistics named after jobs and tasks).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from streamlet.backends.cluster.tree.store import NodePath

LEADER = "/leader"
EPOCH = "/epoch"
CANDIDATES = "/candidates"
WORKERS = "/workers"
DASHBOARD = "/dashboard"  # ephemeral: the leader's dashboard URL, {"url", "master"}
LOST = "/lost"  # private (job names): workers the leader lost, until they come back or are forgotten
LOADS = "/loads"
JOBS = "/jobs"
CPU_HINTS = "/cpu-hints"  # private (job data): topology and task names

# Nodes anyone may read (with everything below them, and the root): none holds job data. Every other node is
# readable only with the cluster secret, so a path added later is private until it is listed here.
WORLD_READABLE = (LEADER, EPOCH, CANDIDATES, WORKERS, DASHBOARD)


def world_readable(path: str) -> bool:
    """Whether anyone may read ``path`` (relative to the cluster root; ``""`` is the root itself)."""
    return path == "" or any(path == top or path.startswith(f"{top}/") for top in WORLD_READABLE)


class LeaderNode(TypedDict):
    """``/leader``: who leads, with the fencing epoch."""

    name: str
    pid: int
    host: str
    epoch: int


class WorkerInfo(TypedDict, total=False):
    """``/workers/<id>``: how to reach a worker and what it offers."""

    host: str
    data_port: int
    capacity: int
    labels: list[str]
    pid: int
    bandwidth_mbit: float  # configured, for the backup placement (``streamlet worker --bandwidth``)
    metrics_port: int  # its Prometheus /metrics, when it serves one
    tls: bool  # its data port speaks mutual TLS (False: cleartext, ``--no-tls``)
    zk_state: str  # VOID / STANDBY / LIVE
    local_state: str  # waiting / running
    boot: str  # this process of the worker: a restart under the same id is a new boot


class JobSpec(TypedDict, total=False):
    """``/jobs/<job>/spec``: the topology by reference, never pickled; HMAC-signed (see ``signing``)."""

    target: str  # "pkg.module:name" or "path/to/file.py:name"
    parallelism: dict[str, int]
    checkpoint: dict[str, Any] | None  # {"interval": seconds, "replicas": K or None (one when possible)}
    adapt: dict[str, Any] | None  # AdaptSettings.to_data(): the adaptation policies it runs under
    spread: bool  # --spread: every node's instances over different workers from the start
    state: dict[str, Any] | None  # --state-backend rocksdb: {"backend": "rocksdb", "cache_mb": N}; None: in memory
    sealed: dict[str, str]  # --secret-param NAME=@FILE: sealed with the cluster secret (see ``tree.sealed``)
    params: dict[str, str]  # --param NAME=VALUE: the building function's arguments, as text (signed with the rest)
    submitted: float
    uid: str  # tells a job from an earlier one of the same name
    module_sha256: str  # of the file the target names
    signature: str


class JobStateNode(TypedDict):
    """``/jobs/<job>/state``: the job's lifecycle state (see ``lifecycle``)."""

    state: str
    reason: str
    at: float
    attempt: int
    started: float | None  # first time RUNNING
    ended: float | None
    reconfigurations: int


class Assignment(TypedDict):
    """``/jobs/<job>/assignment``: one attempt of the job; its node version fences the attempt."""

    epoch: int  # the leader's
    attempt: int
    instances: dict[str, str]  # "task.index" -> worker id
    boots: NotRequired[dict[str, str]]  # worker id -> the boot (process) of it the attempt was given to


class ReconfigureRequest(TypedDict, total=False):
    """``/jobs/<job>/reconfigure``: what a client asked for (``streamlet rescale``)."""

    task: str
    instances: int
    moves: dict[str, int]  # segment (as text: JSON keys) -> instance
    migrate: int  # the instance to move ...
    to: str  # ... to this worker
    by: str
    at: float


class Reconfiguration(TypedDict):
    """``/jobs/<job>/reconfigurations/<id>``: one live change of a task, as the leader planned it."""

    id: int
    attempt: int  # the attempt it changes (a later attempt starts from the layout instead)
    task: str
    old: dict[str, Any]  # SegmentTable.to_data()
    new: dict[str, Any]
    placed: dict[str, str]  # new instance id (or a relocated one's) -> worker
    relocated: list[int]  # instances of the task that move to another worker (a migration)
    workers: list[str]  # every worker of the attempt: each wires its part, then all go
    epoch: int  # the leader's
    boots: NotRequired[dict[str, str]]  # worker -> its boot when the change began (a restart is a loss)


class Layout(TypedDict):
    """``/jobs/<job>/layout``: the job's shape after its live changes (a next attempt starts from it).

    ``placed`` and ``incarnations`` are the per-instance entries of ``attempt``: where each instance a live
    change put somewhere runs, and the id of that change (its version: channel names carry it)."""

    attempt: int
    parallelism: dict[str, int]
    tables: dict[str, dict[str, Any]]
    placed: dict[str, str]  # instances added or moved in ``attempt`` -> worker
    incarnations: NotRequired[dict[str, int]]  # the same instances -> the change that placed them


class Failure(TypedDict):
    """``/jobs/<job>/failures/<instance>/<attempt>``."""

    attempt: int
    worker: str
    error: str


class LoopRound(TypedDict):
    """``/jobs/<job>/loops/attempt-<n>/round``: the round the detector (the attempt's first worker) runs."""

    round: int


class LoopAnswer(TypedDict):
    """``/jobs/<job>/loops/attempt-<n>/counters/<id>``: a worker's counters, per loop, taken in ``round``."""

    round: int
    loops: dict[str, dict[str, Any]]  # loop name -> {"sent", "received", "external_open", "busy"}


class LoopQuiet(TypedDict):
    """``/jobs/<job>/loops/attempt-<n>/quiet``: the loops the detector found quiet, and in which round."""

    loops: list[str]
    round: int


def leader() -> NodePath[LeaderNode]:
    """The leader's ephemeral node."""
    return NodePath(LEADER)


def epoch() -> str:
    """The epoch counter."""
    return EPOCH


def candidate_prefix() -> str:
    """Prefix of a master's ephemeral sequential candidate node."""
    return f"{CANDIDATES}/c-"


def worker(worker_id: str) -> NodePath[WorkerInfo]:
    """A worker's ephemeral registration."""
    return NodePath(f"{WORKERS}/{worker_id}")


def lost(worker_id: str) -> str:
    """A lost worker's record: ``{"since", "why", "jobs"}`` (see ``leader.lost_workers``)."""
    return f"{LOST}/{worker_id}"


def load(worker_id: str) -> str:
    """A worker's ephemeral heartbeat."""
    return f"{LOADS}/{worker_id}"


def job(name: str) -> str:
    """Everything of a job, under one node (``rm`` deletes it)."""
    return f"{JOBS}/{name}"


def spec(name: str) -> NodePath[JobSpec]:
    """What the job runs."""
    return NodePath(f"{JOBS}/{name}/spec")


def state(name: str) -> NodePath[JobStateNode]:
    """The job's lifecycle state."""
    return NodePath(f"{JOBS}/{name}/state")


def assignment(name: str) -> NodePath[Assignment]:
    """The job's current attempt."""
    return NodePath(f"{JOBS}/{name}/assignment")


def started(name: str, attempt: int) -> str:
    """Workers that have started their part of ``attempt``."""
    return f"{JOBS}/{name}/started/{attempt}"


def done(name: str, attempt: int) -> str:
    """Workers' outcomes of ``attempt``."""
    return f"{JOBS}/{name}/done/{attempt}"


def kill(name: str) -> str:
    """Present once someone asked for the job to stop."""
    return f"{JOBS}/{name}/kill"


def failures(name: str, instance: str) -> str:
    """The attempts in which ``instance`` crashed."""
    return f"{JOBS}/{name}/failures/{instance}"


def channel(name: str, instance: str, port: int) -> str:
    """Where a receiving instance's input port is served."""
    return f"{JOBS}/{name}/channels/{instance}@{port}"


def checkpoints(name: str) -> str:
    """The job's checkpoint agreement (see ``checkpoints``)."""
    return f"{JOBS}/{name}/checkpoints"


def completed(name: str) -> str:
    """The job's last completed checkpoint (see ``checkpoints``)."""
    return f"{checkpoints(name)}/completed"


def backups(name: str) -> str:
    """Where each instance's checkpoint replicas go, as the leader's backup location controller placed them."""
    return f"{JOBS}/{name}/backups"


def unusable(name: str) -> str:
    """Checkpoints found with an instance no holder has intact: a restore skips them (one child per epoch)."""
    return f"{checkpoints(name)}/unusable"


def reconfigure_request(name: str) -> NodePath[ReconfigureRequest]:
    """A client's request for a live change, until the leader takes it up."""
    return NodePath(f"{JOBS}/{name}/reconfigure")


def shedding(name: str) -> str:
    """The share of its records the job's sources shed now, as the shed policy set it (see ``control``)."""
    return f"{JOBS}/{name}/shed"


def decisions(name: str) -> str:
    """The adaptation loop's decisions about the job, one sequential child each (see ``control``)."""
    return f"{JOBS}/{name}/decisions"


class CpuHint(TypedDict):
    """What the spread policy measured of one CPU-bound task: the share of a core its co-located instances
    took, when, in which job."""

    cpu: float
    at: float
    job: str


CpuHints = dict[str, dict[str, CpuHint]]  # topology name -> task -> hint


def reconfigure_refused(name: str) -> str:
    """Why the leader refused the last request (for the client that asked)."""
    return f"{JOBS}/{name}/reconfigure-refused"


def reconfigurations(name: str) -> str:
    """The job's live changes, by id."""
    return f"{JOBS}/{name}/reconfigurations"


def reconfiguration(name: str, ident: int) -> NodePath[Reconfiguration]:
    """Live change ``ident`` of the job."""
    return NodePath(change(name, change_name(ident)))


def change_name(ident: int) -> str:
    """The node name of live change ``ident`` (zero-padded: names sort as the changes were made)."""
    return f"{ident:06d}"


def layout(name: str) -> NodePath[Layout]:
    """The job's shape after its live changes."""
    return NodePath(f"{JOBS}/{name}/layout")


def loops(name: str, attempt: int) -> str:
    """Everything of the termination detection of ``attempt``'s loops."""
    return f"{JOBS}/{name}/loops/attempt-{attempt}"


def loop_round(name: str, attempt: int) -> NodePath[LoopRound]:
    """The detector's current round: every worker answers it with its counters."""
    return NodePath(f"{loops(name, attempt)}/round")


def loop_counters(name: str, attempt: int, worker_id: str) -> NodePath[LoopAnswer]:
    """A worker's answer to the last round it saw."""
    return NodePath(f"{loops(name, attempt)}/counters/{worker_id}")


def loop_quiet(name: str, attempt: int) -> NodePath[LoopQuiet]:
    """The loops found quiet for good: every worker ends them."""
    return NodePath(f"{loops(name, attempt)}/quiet")


def instance_id(node: str, index: int) -> str:
    """``count.1``: how instances are named in the tree."""
    return f"{node}.{index}"


def task_of(instance: str) -> str:
    """``count`` from ``count.1``."""
    return instance.rsplit(".", 1)[0]


def checkpoint_attempt(name: str, attempt: int) -> str:
    """The checkpoints of one attempt of the job: its trigger, acknowledgements and finished marks."""
    return f"{checkpoints(name)}/attempt-{attempt}"


def attempt_of(node: str) -> int | None:
    """``3`` from ``attempt-3`` (a child of :func:`checkpoints`); ``None`` for any other child."""
    return int(node.removeprefix("attempt-")) if node.startswith("attempt-") else None


def trigger_path(name: str, attempt: int) -> str:
    """The checkpoint trigger of ``attempt`` (see ``checkpoint_agreement``): the leader holds it during a change."""
    return f"{checkpoint_attempt(name, attempt)}/trigger"


def next_trigger(previous: dict[str, Any] | None, epoch: int, **fields: Any) -> dict[str, Any]:
    """The data of an attempt's trigger asking for ``epoch`` (with ``fields``: final, pause, at, export...),
    carrying ``since``: the attempt's first epoch. A worker begins the epochs of its attempt from there on,
    never one an earlier attempt triggered after this one had started (that epoch never completes here, and
    a sink that staged its last records under it would never publish them)."""
    since = None if previous is None else previous.get("since")
    return {"epoch": epoch, **fields, "since": int(since) if since else epoch}


def checkpoint_acks(name: str, attempt: int, epoch: int | None = None) -> str:
    """Where the workers of ``attempt`` acknowledge their parts (of checkpoint ``epoch``, when given)."""
    acks = f"{checkpoint_attempt(name, attempt)}/acks"
    return acks if epoch is None else f"{acks}/{epoch}"


def replica_ack(name: str, attempt: int, epoch: int, owner: str, backup: str) -> str:
    """``backup`` stored its copy of ``owner``'s part of checkpoint ``epoch``."""
    return f"{checkpoint_acks(name, attempt, epoch)}/{owner}~{backup}"


def checkpoint_finished(name: str, attempt: int) -> str:
    """The workers of ``attempt`` whose part took its final checkpoint."""
    return f"{checkpoint_attempt(name, attempt)}/finished"


def unusable_epoch(name: str, epoch: int) -> str:
    """Checkpoint ``epoch`` of the job cannot be restored (no intact copy of some instances)."""
    return f"{unusable(name)}/{epoch}"


def decision_prefix(name: str) -> str:
    """The prefix of a sequential node under :func:`decisions`."""
    return f"{decisions(name)}/d-"


def candidate(master: str) -> str:
    """A master's candidacy (a child of ``/candidates``)."""
    return f"{CANDIDATES}/{master}"


def change(name: str, node: str) -> NodePath[Reconfiguration]:
    """Live change ``node`` (a child of :func:`reconfigurations`, see :func:`change_name`)."""
    return NodePath(f"{reconfigurations(name)}/{node}")


def change_done(name: str, node: str) -> str:
    """The workers that finished their side of live change ``node``."""
    return f"{change(name, node)}/done"


def change_wired(name: str, node: str) -> str:
    """The workers that wired their side of live change ``node``."""
    return f"{change(name, node)}/wired"


def child(parent: str, name: str) -> str:
    """The node ``name`` under ``parent`` (a worker's entry under a directory node)."""
    return f"{parent}/{name}"
