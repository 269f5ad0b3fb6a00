"""Which instance a task node gets: its own kind for a task with calls in flight."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamlet.core.runtime.async_calls import MapAsyncInstance
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.instances import Environment
from streamlet.core.runtime.lookup_join import LookupJoinInstance
from streamlet.core.runtime.outputs import RoutedOutputs
from streamlet.core.runtime.task_instance import TaskInstance

if TYPE_CHECKING:
    from streamlet.core.model.topology import Node

KINDS: dict[str, type[TaskInstance]] = {"": TaskInstance, "map": MapAsyncInstance, "lookup": LookupJoinInstance}


def task_instance(node: Node, index: int, outputs: RoutedOutputs, env: Environment, inbox: Inbox) -> TaskInstance:
    """The instance a task node gets: a ``map_async`` or ``lookup_join`` one of its own kind."""
    return KINDS[node.async_calls](node, index, outputs, env, inbox)
