"""Every seam of streamlet in one place: the protocols and base classes that the layers plug into.

Each is defined next to the code that uses it and re-exported here, so an extension (a new source, a
state store, a channel, a coordination store) can see at a glance what it has to implement:

- what users subclass: :class:`Task`, :class:`Source` / :class:`SourceReader`, :class:`Sink` /
  :class:`SinkWriter`, and the :class:`WindowSpec` data;
- what a task sees: :class:`Inputs`, :class:`Outputs`, :class:`PortDeclarer` and its keyed state, a
  :class:`StateStore`;
- time: :class:`Clock` and its :class:`Timer`;
- moving batches: :class:`Channel` (the in-memory ``LocalChannel`` in core, TCP in ``transport``) and
  the :data:`ChannelFactory` that makes one per edge;
- checkpoints: :class:`CheckpointStore` (where documents go), :class:`Participant` (what an instance
  does for one), :class:`Agreement` (how processes agree on an epoch: the cluster's is ZooKeeper);
- loops split between processes: :class:`Quiescence`;
- coordination: :class:`ClusterStore` (ZooKeeper, or memory in tests).
"""

from __future__ import annotations

from streamlet.backends.cluster.tree.store import ClusterStore
from streamlet.core.model.clock import Clock, Timer
from streamlet.core.model.ports import Inputs, Outputs, PortDeclarer
from streamlet.core.model.sinks import ElementWriter, Sink, SinkWriter
from streamlet.core.model.sources import Source, SourceReader
from streamlet.core.model.state import StateStore
from streamlet.core.model.task import Task
from streamlet.core.model.windows import WindowSpec
from streamlet.core.runtime.channel import Channel, ChannelFactory
from streamlet.core.runtime.cycles import Quiescence
from streamlet.core.state.checkpoints import Agreement
from streamlet.core.state.participant import Participant
from streamlet.core.state.store import CheckpointStore

__all__ = (
    "Agreement",
    "Channel",
    "ChannelFactory",
    "CheckpointStore",
    "Clock",
    "ClusterStore",
    "Inputs",
    "Outputs",
    "Participant",
    "PortDeclarer",
    "Quiescence",
    "Sink",
    "SinkWriter",
    "ElementWriter",
    "Source",
    "SourceReader",
    "StateStore",
    "Task",
    "Timer",
    "WindowSpec",
)
