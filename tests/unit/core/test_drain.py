"""A stopped instance hands over what is queued for it: ``drain()`` next to ``snapshot()``."""

from __future__ import annotations

import streamlet as sl
from streamlet.core.model.record import END_OF_STREAM, Barrier, Watermark
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.clock import SystemClock
from streamlet.core.runtime.instances import Environment
from streamlet.core.runtime.outputs import RoutedOutputs
from streamlet.core.runtime.routing import DiscardRoute
from streamlet.core.runtime.task_instance import TaskInstance


async def test_drain_takes_every_queued_item_per_channel_in_order_and_empties_the_inbox() -> None:
    """Two senders into one task: batches and markers come out channel by channel, oldest first."""
    topology = sl.Topology("drain")
    source = topology.add_source("in", [1])
    topology.map("w", lambda r: (r.key, r.value)).set_input(source)
    inbox = Inbox(capacity=8)
    first, second = inbox.add_channel(0), inbox.add_channel(0)
    a, b, c = [sl.Record("k", 1)], [sl.Record("k", 2)], [sl.Record("j", 3)]
    for channel, item in ((first, a), (second, c), (first, Barrier(4)), (second, Watermark(7.0)), (first, b)):
        await inbox.put(channel, item)
    await inbox.put(second, END_OF_STREAM)
    outputs = RoutedOutputs([[DiscardRoute()], [DiscardRoute()]], late=True)
    instance = TaskInstance(topology.nodes["w"], 0, outputs, Environment(10, SystemClock()), inbox)
    assert instance.drain() == [
        (first, a),
        (first, Barrier(4)),
        (first, b),
        (second, c),
        (second, Watermark(7.0)),
        (second, END_OF_STREAM),
    ]
    assert (inbox.depth(), instance.drain()) == (0, [])
