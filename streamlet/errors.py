"""Errors raised by streamlet.

Every error a user can cause derives from one root, so ``except StreamletError``
catches them all, and each message names where it happened: the node, the
instance, the port and, where there is one, the record's key::

    StreamletError
    ├── TopologyError        a topology that cannot run (names the node and port)
    │   ├── PortError        a task used a port it did not declare (names task, instance, port)
    │   └── FieldError       a columnar node named a field its Arrow batches lack (names node, port, fields)
    ├── TaskError            user code in a task failed under the ``fail`` policy
    ├── RemoteError          what a task's code raised in a pool process (run_in="process"), named as raised
    ├── SourceError          a source failed to open or read (names source, instance, position)
    ├── SinkError            a sink failed to open, write or commit (names sink, instance, record key)
    ├── EncodingError        a value cannot be encoded (names its type, and the edge, state or file)
    ├── JobError             a job could not start, was stopped, or is misused
    │   ├── NotReplayable    resuming from a checkpoint that holds no position for a source (a generator)
    │   └── ReconfigurationError  a rescale or segment move that cannot be done (the job is left as it was)
    ├── CheckpointError      a checkpoint could not be saved (names the epoch, the path and why)
    │   └── UnusableCheckpoint  no live worker holds an intact copy of some instance's state
    ├── ConnectorError       an outside system (Spark, Kafka) is missing, unreachable or failed
    │   └── KafkaError       a Kafka connector failed
    ├── TransportError       moving batches between processes failed
    │   ├── FrameError       a peer broke the wire protocol (that connection is closed)
    │   ├── AuthenticationError  a peer does not share the cluster secret
    │   ├── RecordTooLarge   one record does not fit in a frame (names the channel, the size and the limit)
    │   ├── PeerUnreachable  a peer's data server has not answered within the bound (names the link)
    │   └── BlobTooLarge     a state or checkpoint blob passed the size its receiver takes
    ├── SimulationStalled    a simulated cluster came to a stop: every task waits for ever, or time never moves
    ├── HostsUnavailable     test hosts (network namespaces) cannot be made here, or a command making them failed
    └── ClusterError         the cluster could not do what was asked
        ├── CoordinationError    ZooKeeper (or the store) unreachable, or a node not as expected
        │   ├── VersionConflict  a conditional write lost to someone else's
        │   ├── NodeExists       the node was already there
        │   ├── NotAuthorized    the store refused: no cluster secret
        │   └── NoQuorum         too few ZooKeeper members serve: nothing can be read or written
        ├── DispatchError    no live worker can take an instance
        ├── PartLost         a worker restarted while its part of an attempt ran: the attempt cannot go on
        ├── LifecycleError   a job state change the lifecycle does not allow
        ├── SpecError        a job spec that must not run (unsigned, or naming other code)
        ├── BuildFailed      a job's topology could not be built to describe it (the build's own words)
        └── ZooKeeperError   a local ZooKeeper server could not be found or started

The errors are defined here and re-exported where they are raised, so both
``streamlet.errors.KafkaError`` and ``streamlet.KafkaError`` name the same class.
"""

from __future__ import annotations

import asyncio
from typing import Any


class StreamletError(Exception):
    """Root of every error streamlet raises."""


class TopologyError(StreamletError):
    """The topology is malformed; the message names the node and the port."""


class PortError(TopologyError):
    """A task emitted on, or read from, a port it did not declare: a wiring mistake, so no error policy applies."""


class FieldError(TopologyError):
    """A columnar node (``where``, ``aggregate``, ``ColumnarSource``) named a field its batches do not have."""


class TaskError(StreamletError):
    """A task's user code raised; the message names task, instance and record key."""

    def __init__(self, message: str, *, task: str, instance: int, key: object) -> None:
        super().__init__(message)
        self.task = task
        self.instance = instance
        self.key = key


class RemoteError(StreamletError):
    """What a task's code raised in a process of the job's pool (``run_in="process"``): each one arrives as a
    subclass named as the original's type (a ``ZeroDivisionError`` there is a ``RemoteError`` named
    ``ZeroDivisionError`` here), its message the original's, ``remote_traceback`` its traceback there. The
    task's ``on_error`` applies to it as to any error of its code."""

    remote_traceback = ""


class SourceError(StreamletError):
    """A source's reader failed to open, seek or read; the message names the source, instance and position."""

    def __init__(self, message: str, *, source: str, instance: int, position: Any = None) -> None:
        super().__init__(message)
        self.source = source
        self.instance = instance
        self.position = position


class SinkError(StreamletError):
    """A sink's writer failed; the message names the sink, the instance and the key of the record it failed on."""

    def __init__(self, message: str, *, sink: str, instance: int, key: object = None) -> None:
        super().__init__(message)
        self.sink = sink
        self.instance = instance
        self.key = key


class EncodingError(StreamletError):
    """A value cannot be encoded (msgpack, JSON); the message names its type, where it sits and where it was going."""

    def __init__(self, message: str, *, value_type: str) -> None:
        super().__init__(message)
        self.value_type = value_type


class SimulationStalled(StreamletError):
    """A simulated cluster (``streamlet.testing.chaos``) came to a stop: nothing is ready and no timer is set
    (every task waits for something that will never come), or callbacks run on and on while time never moves."""


class JobError(StreamletError):
    """A job was used wrongly (unknown source, sent to after it ended, ...)."""


class NotReplayable(JobError):
    """A job cannot resume from a checkpoint that holds no position for one of its sources (its reader's
    ``position()`` is ``None``: a generator, a queue): reading it again from its start would count its records
    twice. The message names the source, the checkpoint and what to do instead (see :meth:`of`)."""

    def __init__(self, message: str, *, source: str, instance: int, epoch: int | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.instance = instance
        self.epoch = epoch

    @classmethod
    def of(cls, source: str, instance: int, epoch: int | None = None, job: str | None = None) -> NotReplayable:
        """The error for instance ``instance`` of ``source``, resuming from checkpoint ``epoch`` of ``job``."""
        where = "" if epoch is None else f" checkpoint {epoch} of job '{job}' holds no position for it, so"
        message = (
            f"source '{source}' instance {instance} cannot be replayed:{where} resuming would read it again from "
            f"its start and count its records twice; use a replayable source (a list, a file, Kafka, a reader "
            f"with position() and seek()), or run without checkpoints, or start afresh without the checkpoint"
        )
        return cls(message, source=source, instance=instance, epoch=epoch)


class ReconfigurationError(JobError):
    """A rescale, segment move or migration that cannot be done now; the job keeps running as it was."""


class CheckpointError(StreamletError):
    """A checkpoint could not be saved (a full disk, say: the message names epoch, path and the OS error),
    or is of a format this streamlet does not read (the message names the file and the format version)."""


class UnusableCheckpoint(CheckpointError):
    """No live worker holds an intact copy of some instance's state at cluster checkpoint ``epoch``: it is
    marked unusable (with who holds it) and the job waits, STALLED, for a worker that holds it. It never
    resumes from the checkpoint before: its sinks may have committed the last one's output already."""

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


class ConnectorError(StreamletError):
    """A connector's outside system is missing (a pip extra, Java) or failed; the message says which."""


class KafkaError(ConnectorError):
    """A Kafka connector failed: aiokafka is missing, a topic does not exist, a record
    could not be decoded under ``on_error="fail"``, or the broker refused (chained)."""


class TransportError(StreamletError):
    """A channel between processes failed."""


class FrameError(TransportError):
    """A frame broke the protocol; ``reason`` says how (the connection is closed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AuthenticationError(TransportError):
    """The other side of a data connection does not know the cluster secret (retrying will not help)."""


class RecordTooLarge(TransportError):
    """A record cannot go over TCP: even alone in a frame it is over the frame limit (retrying will not help)."""


class PeerUnreachable(TransportError):
    """A peer's data server said nothing within the link's bound (``peer_timeout``): the link between the two
    processes is cut, or the peer hangs. The message names the link; the attempt ends and the job recovers."""


class BlobTooLarge(TransportError):
    """A blob (state or checkpoint bytes) passed the size its receiver takes (retrying will not help)."""


class HostsUnavailable(StreamletError):
    """Test hosts cannot be made on this machine (not root; ``ip`` or ``nft`` missing), or an ``ip``/``nft``
    command making or cutting them failed: the message says which, with the command's own words."""


class ClusterError(StreamletError):
    """The cluster could not do what was asked (a local cluster not started, found or stopped, ...)."""


class CoordinationError(ClusterError):
    """The store could not be reached, or a node was not what we expected."""


class VersionConflict(CoordinationError):
    """A conditional write lost to someone else's."""


class NodeExists(CoordinationError):
    """The node was already there."""


class NotAuthorized(CoordinationError):
    """The store refused a change: this client does not hold the cluster secret."""


class NoQuorum(CoordinationError):
    """Too few members of the ZooKeeper ensemble serve (fewer than a majority): nothing can be read or
    written until enough of them are back. The message names each member and its mode."""


class DispatchError(ClusterError):
    """No worker can take an instance."""


class PartLost(ClusterError):
    """This worker (a new process under the same name) finds it started its part of the attempt before: the
    old process's part, its instances and their progress, are gone, so the attempt cannot go on with it."""


class LifecycleError(ClusterError):
    """A state change that the lifecycle does not allow."""


class SpecError(ClusterError):
    """A job spec that must not run: unsigned, signed with another secret, or naming other code."""


class BuildFailed(ClusterError):
    """A job's topology could not be built to describe it; the message is the build's own last words."""


class ZooKeeperError(ClusterError):
    """A local ZooKeeper server could not be found or started."""


def underlying(exc: BaseException) -> BaseException:
    """What to report for ``exc``: itself, or for an exception group (a task group's "unhandled errors in a
    TaskGroup") the first error in it, depth first, that is no cancellation; a group of cancellations only is
    itself. A reason that says ``ExceptionGroup`` tells the reader nothing of what failed."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    for inner in exc.exceptions:
        found = underlying(inner)
        if not isinstance(found, BaseExceptionGroup) and not _cancellation(found):
            return found
    return exc


def described(exc: BaseException) -> str:
    """``"SinkError: ..."``: the type and message of :func:`underlying` (``exc`` itself when it is no group),
    with ``(and N more)`` when a group held several errors."""
    found = underlying(exc)
    text = f"{type(found).__name__}: {found}"
    others = len(_leaves(exc)) - 1 if found is not exc else 0
    return f"{text} (and {others} more)" if others > 0 else text


def _leaves(exc: BaseException) -> list[BaseException]:
    if not isinstance(exc, BaseExceptionGroup):
        return [] if _cancellation(exc) else [exc]
    return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]


def _cancellation(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.CancelledError)
