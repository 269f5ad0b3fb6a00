"""Inbox: one bounded FIFO per incoming channel, backpressure on put, and one waiting reader."""

from __future__ import annotations

import asyncio

import streamlet as sl
from streamlet.core.model.items import Item
from streamlet.core.model.record import END_OF_STREAM
from streamlet.core.runtime.channel import Inbox


def batch(value: int) -> list[sl.Record]:
    """A one-record batch carrying ``value``."""
    return [sl.Record(None, value)]


def inbox_with(ports: list[int], capacity: int = 8) -> Inbox:
    """An inbox with one bounded channel into each of ``ports``; channel i feeds ``ports[i]``."""
    inbox = Inbox(capacity)
    for port in ports:
        inbox.add_channel(port)
    return inbox


def drain(inbox: Inbox, channel: int) -> list[int]:
    """Pop every item of ``channel``; the value of each one-record batch."""
    taken: list[int] = []
    while not inbox.is_empty(channel):
        item: Item = inbox.pop(channel)
        assert isinstance(item, list)
        taken.append(item[0].value)
    return taken


async def full_inbox(capacity: int = 1) -> Inbox:
    """An inbox whose one channel (into port 0) holds ``capacity`` batches (0, 1, ...)."""
    inbox = inbox_with([0], capacity)
    for value in range(capacity):
        await inbox.put(0, batch(value))
    return inbox


async def test_add_channel_numbers_channels_and_records_their_ports() -> None:
    """add_channel returns 0, 1, 2, ...; ``ports`` maps each channel to its input port."""
    inbox = Inbox(8)
    assert [inbox.add_channel(1), inbox.add_channel(0), inbox.add_channel(1, unbounded=True)] == [0, 1, 2]
    assert (inbox.ports, inbox.channel_count) == ([1, 0, 1], 3)


async def test_each_channel_is_fifo() -> None:
    """Items come out of each channel in the order they were put, channels kept apart."""
    inbox = inbox_with([0, 0])
    for channel, value in [(0, 1), (1, 10), (0, 2), (1, 20), (0, 3)]:
        await inbox.put(channel, batch(value))
    assert drain(inbox, 1) == [10, 20]
    assert drain(inbox, 0) == [1, 2, 3]


async def test_head_peeks_without_taking() -> None:
    """head() shows the next item of a channel and None for an empty one."""
    inbox = inbox_with([0, 1])
    inbox.put_nowait(0, END_OF_STREAM)
    assert inbox.head(0) is END_OF_STREAM
    assert inbox.head(1) is None
    assert inbox.depth() == 1


async def test_put_on_full_channel_waits_for_a_pop() -> None:
    """A put on a full channel stays pending until pop() frees a place, then completes."""
    inbox = await full_inbox()
    putter = asyncio.create_task(inbox.put(0, batch(1)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert putter.done() is False
    assert inbox.depth() == 1
    inbox.pop(0)
    await asyncio.sleep(0)
    assert putter.done() is True
    assert drain(inbox, 0) == [1]


async def test_full_channel_does_not_block_another_into_the_same_port() -> None:
    """Channel 1 takes a put while channel 0, into the same input port, is full."""
    inbox = inbox_with([0, 0], capacity=1)
    await inbox.put(0, batch(0))
    blocked = asyncio.create_task(inbox.put(0, batch(1)))
    other = asyncio.create_task(inbox.put(1, batch(2)))
    await asyncio.sleep(0)
    assert (blocked.done(), other.done()) == (False, True)
    blocked.cancel()
    await asyncio.sleep(0)
    assert blocked.cancelled() is True


async def test_one_pop_admits_the_first_waiting_putter_only() -> None:
    """With two putters waiting, a pop lets in the one that waited first."""
    inbox = await full_inbox()
    first = asyncio.create_task(inbox.put(0, batch(1)))
    await asyncio.sleep(0)
    second = asyncio.create_task(inbox.put(0, batch(2)))
    await asyncio.sleep(0)
    inbox.pop(0)
    await asyncio.sleep(0)
    assert (first.done(), second.done()) == (True, False)
    inbox.pop(0)
    await asyncio.sleep(0)
    assert second.done() is True
    assert drain(inbox, 0) == [2]


async def test_put_nowait_ignores_capacity() -> None:
    """put_nowait appends to a full channel at once."""
    inbox = await full_inbox()
    inbox.put_nowait(0, batch(1))
    inbox.put_nowait(0, batch(2))
    assert inbox.depth() == 3
    assert drain(inbox, 0) == [0, 1, 2]


async def test_unbounded_channel_never_waits() -> None:
    """Puts to a channel added with unbounded=True complete at once past the capacity."""
    inbox = Inbox(1)
    inbox.add_channel(0, unbounded=True)

    async def put_five() -> None:
        for value in range(5):
            await inbox.put(0, batch(value))

    putter = asyncio.create_task(put_five())
    await asyncio.sleep(0)
    assert putter.done() is True
    assert drain(inbox, 0) == [0, 1, 2, 3, 4]


async def test_unbounded_channel_leaves_other_channels_bounded() -> None:
    """Only the channel added unbounded is; the next one keeps the capacity."""
    inbox = Inbox(1)
    inbox.add_channel(0, unbounded=True)
    inbox.add_channel(0)
    await inbox.put(1, batch(0))
    putter = asyncio.create_task(inbox.put(1, batch(1)))
    await asyncio.sleep(0)
    assert putter.done() is False
    inbox.pop(1)
    await asyncio.sleep(0)
    assert putter.done() is True


async def test_wait_returns_after_a_put() -> None:
    """A waiting reader is woken by a put on any channel."""
    inbox = inbox_with([0, 1])
    reader = asyncio.create_task(inbox.wait())
    await asyncio.sleep(0)
    assert reader.done() is False
    await inbox.put(1, batch(0))
    await asyncio.sleep(0)
    assert reader.done() is True


async def test_wait_returns_after_put_nowait() -> None:
    """A control marker put with put_nowait wakes the reader too."""
    inbox = inbox_with([0])
    reader = asyncio.create_task(inbox.wait())
    await asyncio.sleep(0)
    inbox.put_nowait(0, END_OF_STREAM)
    await asyncio.sleep(0)
    assert reader.done() is True


async def test_wake_returns_a_waiting_reader_without_data() -> None:
    """wake() (a timer fell due) ends wait() with nothing queued."""
    inbox = inbox_with([0])
    reader = asyncio.create_task(inbox.wait())
    await asyncio.sleep(0)
    inbox.wake()
    await asyncio.sleep(0)
    assert (reader.done(), inbox.depth()) == (True, 0)


async def test_wake_without_a_reader_is_harmless() -> None:
    """wake() with nobody waiting does nothing, and a later wait() still waits."""
    inbox = inbox_with([0])
    inbox.wake()
    reader = asyncio.create_task(inbox.wait())
    await asyncio.sleep(0)
    assert reader.done() is False
    reader.cancel()
    await asyncio.sleep(0)
    assert reader.cancelled() is True


async def test_wait_ignores_items_put_before_it() -> None:
    """wait() waits for the next put; callers check depth() first."""
    inbox = inbox_with([0])
    inbox.put_nowait(0, batch(0))
    reader = asyncio.create_task(inbox.wait())
    await asyncio.sleep(0)
    assert reader.done() is False
    inbox.put_nowait(0, batch(1))
    await asyncio.sleep(0)
    assert reader.done() is True


async def test_cancelled_woken_putter_passes_its_turn_on() -> None:
    """A putter cancelled after a pop woke it hands the free place to the next putter."""
    inbox = await full_inbox()
    first = asyncio.create_task(inbox.put(0, batch(1)))
    second = asyncio.create_task(inbox.put(0, batch(2)))
    await asyncio.sleep(0)
    inbox.pop(0)  # wakes `first` ...
    first.cancel()  # ... which is cancelled before it runs
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert (first.cancelled(), second.done(), second.cancelled()) == (True, True, False)
    assert drain(inbox, 0) == [2]


async def test_cancelled_waiting_putter_is_skipped_by_pop() -> None:
    """A putter cancelled while still waiting does not swallow the next pop's wakeup."""
    inbox = await full_inbox()
    first = asyncio.create_task(inbox.put(0, batch(1)))
    second = asyncio.create_task(inbox.put(0, batch(2)))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    assert (first.cancelled(), second.done()) == (True, False)
    inbox.pop(0)
    await asyncio.sleep(0)
    assert second.done() is True
    assert drain(inbox, 0) == [2]


async def test_depth_counts_items_over_all_channels() -> None:
    """depth() sums queued items (batches and markers) over every channel."""
    inbox = inbox_with([0, 0, 1])
    assert inbox.depth() == 0
    await inbox.put(0, batch(0))
    await inbox.put(2, batch(1))
    inbox.put_nowait(2, END_OF_STREAM)
    assert inbox.depth() == 3
    inbox.pop(2)
    assert inbox.depth() == 2


async def test_full_means_every_bounded_channel_is_at_capacity() -> None:
    """full() is the overload signal: true only when every bounded sender would wait; unbounded ones don't count."""
    inbox = Inbox(2)
    inbox.add_channel(0)
    inbox.add_channel(0)
    inbox.add_channel(1, unbounded=True)
    assert inbox.full() is False
    for value in range(2):
        await inbox.put(0, batch(value))
    assert (inbox.full(), inbox.depth()) == (False, 2)  # the second channel still has room
    for value in range(2):
        await inbox.put(1, batch(value))
    assert (inbox.full(), inbox.depth()) == (True, 4)
    inbox.pop(1)
    assert inbox.full() is False
