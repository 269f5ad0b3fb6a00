"""streamlet: asyncio-native stream processing.

The layers stack like this: ``core`` holds the model (records, tasks,
topologies) and the in-process runtime; ``transport`` moves batches between
instances; ``backends`` decide where instances run (``local`` is the embedded
default); ``adaptation`` changes placement and routing from statistics. This
module only re-exports the public API.
"""

from __future__ import annotations

from typing import Any

from streamlet.adaptation.settings import AdaptSettings
from streamlet.backends.local import run, start
from streamlet.backends.local_adaptation import balance_segments
from streamlet.connectors.files import FileSink, FileSource, read_file_sink
from streamlet.connectors.kafka import KafkaError, KafkaSink, KafkaSource
from streamlet.connectors.postgres import PostgresLookup, PostgresSink, PostgresSource
from streamlet.connectors.spark import SparkSink
from streamlet.core.model.clock import Clock
from streamlet.core.model.columnar import ColumnarSource
from streamlet.core.model.constants import LATE, SHED
from streamlet.core.model.joins import LEFT, RIGHT
from streamlet.core.model.partition import BROADCAST, ROUND_ROBIN, SAME_KEY, SESSION_TABLE, Partitioning
from streamlet.core.model.ports import Inputs, Outputs, PortDeclarer
from streamlet.core.model.qos import QoS
from streamlet.core.model.record import DeadLetter, FiredWindowRecord, Record, WindowRecord
from streamlet.core.model.sinks import (
    CallbackSink,
    CollectSink,
    ElementWriter,
    RestorePoint,
    Sink,
    SinkContext,
    SinkWriter,
)
from streamlet.core.model.sources import IterableSource, QueueSource, Source, SourceContext, SourceReader
from streamlet.core.model.state import StateStore
from streamlet.core.model.task import Task
from streamlet.core.model.timers import Timers
from streamlet.core.model.topology import NodeHandle, Topology
from streamlet.core.model.watermarks import Watermarks
from streamlet.core.model.windows import CountOrTimeWindow, CountWindow, SessionWindow, TimeWindow, WindowSpec
from streamlet.core.runtime.clock import ManualClock, SystemClock
from streamlet.core.runtime.job import Job, JobResult
from streamlet.core.runtime.statistics import JobStatistics, NodeStatistics
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.rocks import RocksDBState
from streamlet.core.state.store import CheckpointStore, DirectoryCheckpointStore, InMemoryCheckpointStore
from streamlet.errors import (
    CheckpointError,
    ConnectorError,
    EncodingError,
    FieldError,
    JobError,
    NotReplayable,
    PortError,
    ReconfigurationError,
    RemoteError,
    SinkError,
    SourceError,
    StreamletError,
    TaskError,
    TopologyError,
    TransportError,
)
from streamlet.gc_policy import tune_gc

__all__ = (
    # building a topology
    "AdaptSettings",
    "BROADCAST",
    "DeadLetter",
    "FiredWindowRecord",
    "Inputs",
    "LATE",
    "LEFT",
    "NodeHandle",
    "Outputs",
    "Partitioning",
    "PortDeclarer",
    "QoS",
    "Record",
    "RIGHT",
    "ROUND_ROBIN",
    "SAME_KEY",
    "SESSION_TABLE",
    "SHED",
    "Task",
    "Topology",
    "WindowRecord",
    # windows, event time and timers
    "CountOrTimeWindow",
    "CountWindow",
    "SessionWindow",
    "Timers",
    "TimeWindow",
    "Watermarks",
    "WindowSpec",
    # sources and sinks
    "CallbackSink",
    "CollectSink",
    "ColumnarSource",
    "ElementWriter",
    "FileSink",
    "FileSource",
    "IterableSource",
    "KafkaSink",
    "KafkaSource",
    "PostgresLookup",
    "PostgresSink",
    "PostgresSource",
    "QueueSource",
    "read_file_sink",
    "RestorePoint",
    "Sink",
    "SinkContext",
    "SinkWriter",
    "Source",
    "SourceContext",
    "SourceReader",
    "SparkSink",
    # state and checkpoints
    "CheckpointStore",
    "DirectoryCheckpointStore",
    "InMemoryCheckpointStore",
    "KeyedState",
    "RocksDBState",
    "StateStore",
    # running
    "balance_segments",
    "Clock",
    "Job",
    "JobResult",
    "JobStatistics",
    "ManualClock",
    "NodeStatistics",
    "run",
    "start",
    "SystemClock",
    "tune_gc",
    # errors
    "CheckpointError",
    "ConnectorError",
    "EncodingError",
    "FieldError",
    "JobError",
    "KafkaError",
    "NotReplayable",
    "PortError",
    "ReconfigurationError",
    "RemoteError",
    "SinkError",
    "SourceError",
    "StreamletError",
    "TaskError",
    "TopologyError",
    "TransportError",
)

# Internals once exported here, each now imported from the module that owns it; the old names still work, with a
# DeprecationWarning saying where the name lives.
_MOVED = {
    "stable_hash": "streamlet.core.model.partition",
    "SegmentTable": "streamlet.core.model.segments",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'streamlet' has no attribute {name!r}")
    import importlib
    import warnings

    warnings.warn(f"streamlet.{name} is deprecated: import it from {module}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), name)
