"""streamlet: asyncio-native stream processing.

The layers stack like this: ``core`` holds the model (records, tasks,
topologies) and the in-process runtime; ``transport`` moves batches between
instances; ``backends`` decide where instances run (``local`` is the embedded
default); ``adaptation`` changes placement and routing from statistics. This
module only re-exports the public API.
"""

from __future__ import annotations

from streamlet.adaptation.settings import AdaptSettings
from streamlet.backends.local import run, start
from streamlet.backends.local_adaptation import balance_segments
from streamlet.connectors.files import FileSink, FileSource, read_file_sink
from streamlet.connectors.kafka import KafkaError, KafkaSink, KafkaSource
from streamlet.connectors.spark import SparkSink
from streamlet.core.model.clock import Clock
from streamlet.core.model.columnar import ColumnarSource
from streamlet.core.model.constants import LATE, SHED
from streamlet.core.model.partition import BROADCAST, ROUND_ROBIN, SAME_KEY, SESSION_TABLE, Partitioning, stable_hash
from streamlet.core.model.ports import Inputs, Outputs, PortDeclarer
from streamlet.core.model.qos import QoS
from streamlet.core.model.record import DeadLetter, FiredWindowRecord, Record, WindowRecord
from streamlet.core.model.segments import SegmentTable
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
from streamlet.core.state.store import CheckpointStore, DirectoryCheckpointStore, InMemoryCheckpointStore
from streamlet.errors import (
    CheckpointError,
    ConnectorError,
    EncodingError,
    FieldError,
    JobError,
    PortError,
    ReconfigurationError,
    SinkError,
    SourceError,
    StreamletError,
    TaskError,
    TopologyError,
    TransportError,
)
from streamlet.gc_policy import tune_gc

__all__ = (
    "AdaptSettings",
    "BROADCAST",
    "QoS",
    "SHED",
    "balance_segments",
    "tune_gc",
    "LATE",
    "ROUND_ROBIN",
    "SAME_KEY",
    "SESSION_TABLE",
    "CallbackSink",
    "CheckpointError",
    "CheckpointStore",
    "Clock",
    "ColumnarSource",
    "CollectSink",
    "ConnectorError",
    "CountOrTimeWindow",
    "CountWindow",
    "DeadLetter",
    "DirectoryCheckpointStore",
    "EncodingError",
    "FieldError",
    "FileSink",
    "FileSource",
    "InMemoryCheckpointStore",
    "Inputs",
    "IterableSource",
    "Job",
    "JobError",
    "JobResult",
    "JobStatistics",
    "KafkaError",
    "KafkaSink",
    "KafkaSource",
    "KeyedState",
    "ManualClock",
    "NodeHandle",
    "NodeStatistics",
    "Outputs",
    "Partitioning",
    "PortDeclarer",
    "PortError",
    "QueueSource",
    "ReconfigurationError",
    "Record",
    "RestorePoint",
    "SegmentTable",
    "SessionWindow",
    "Sink",
    "SinkContext",
    "SinkError",
    "SinkWriter",
    "ElementWriter",
    "Source",
    "SourceContext",
    "SourceError",
    "SourceReader",
    "SparkSink",
    "StateStore",
    "StreamletError",
    "SystemClock",
    "Task",
    "TaskError",
    "TimeWindow",
    "Timers",
    "Topology",
    "TopologyError",
    "TransportError",
    "WindowRecord",
    "Watermarks",
    "FiredWindowRecord",
    "WindowSpec",
    "read_file_sink",
    "run",
    "stable_hash",
    "start",
)
