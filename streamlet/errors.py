"""Errors raised by streamlet.

Every error derives from one root, so ``except StreamletError`` catches them all::

    StreamletError
    ├── TopologyError        a topology that cannot run (names the node and port)
    ├── TaskError            user code in a task failed under the ``fail`` policy
    ├── JobError             a job could not start, was stopped, or is misused
    ├── CheckpointError      a checkpoint could not be saved (names the epoch, the path and why)
    ├── ConnectorError       an outside system (Spark, Kafka) is missing, unreachable or failed
    │   └── KafkaError       (streamlet.connectors.kafka) a Kafka connector failed
    └── TransportError       moving batches between processes failed
        ├── FrameError       a peer broke the wire protocol (that connection is closed)
        ├── AuthenticationError  a peer does not share the cluster secret
        └── RecordTooLarge   one record does not fit in a frame (names the channel, the size and the limit)
"""

from __future__ import annotations


class StreamletError(Exception):
    """Root of every error streamlet raises."""


class TopologyError(StreamletError):
    """The topology is malformed; the message names the node and the port."""


class TaskError(StreamletError):
    """A task's user code raised; the message names task, instance and record key."""

    def __init__(self, message: str, *, task: str, instance: int, key: object) -> None:
        super().__init__(message)
        self.task = task
        self.instance = instance
        self.key = key


class JobError(StreamletError):
    """A job was used wrongly (unknown source, sent to after it ended, ...)."""


class CheckpointError(StreamletError):
    """A checkpoint could not be saved (a full disk, say); the message names epoch, path and the OS error."""


class ConnectorError(StreamletError):
    """A connector's outside system is missing (a pip extra, Java) or failed; the message says which."""


class TransportError(StreamletError):
    """A channel between processes failed."""


class AuthenticationError(TransportError):
    """The other side of a data connection does not know the cluster secret (retrying will not help)."""


class RecordTooLarge(TransportError):
    """A record cannot go over TCP: even alone in a frame it is over the frame limit (retrying will not help)."""
