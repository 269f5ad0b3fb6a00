"""The instance of a ``lookup_join`` task: batches of keys looked up while it takes more input.

It is a ``map_async`` instance (``core.runtime.async_calls``) in order, whose
calls are lookups: every record taken is an entry of the queue, in input order;
a record whose key is cached is joined at once, the others wait for a
:class:`KeyLookup` of their batch's distinct keys that are neither cached nor
already being looked up (a key in flight is not asked twice). Up to
``concurrency`` lookups run at a time; the loop emits the joined records at
the head of the queue, so the output keeps the input's order, and watermarks
wait behind the records before them.

Backpressure: the instance takes no more data while ``concurrency`` lookups
wait to be called beyond those in flight, or while ``concurrency`` batches of
records wait to leave. A checkpoint stores the records not yet joined (looked
up again after a restore) and the joined ones held back by order; the cache is
not stored: it is only a cache.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from streamlet.core.model.encoding import unpackb
from streamlet.core.model.lookups import Lookup, LookupJoinTask
from streamlet.core.model.record import Batch, Element
from streamlet.core.runtime.async_calls import CALLING, DONE, UNCALLED, Call, MapAsyncInstance
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.instances import Environment
from streamlet.core.runtime.outputs import RoutedOutputs

if TYPE_CHECKING:
    from streamlet.core.model.topology import Node

NO_ROW = object()  # cached for a key the store has no row for


class KeyLookup:
    """One ``await lookup(keys)``: its distinct keys, the records waiting for each, the answer or error."""

    __slots__ = ("answer", "error", "keys", "records", "state", "waiting")

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self.waiting: dict[Any, list[Call]] = {}  # key -> its records' entries, in input order
        self.records: list[Call] = []  # every entry waiting, in input order (records are taken in order)
        self.state = UNCALLED
        self.answer: Any = None
        self.error: BaseException | None = None

    def wait_for(self, key: Any, call: Call) -> None:
        self.records.append(call)
        waiting = self.waiting.get(key)
        if waiting is None:
            self.keys.append(key)
            self.waiting[key] = [call]
        else:
            waiting.append(call)


class LookupCache:
    """The rows of recently looked-up keys (``NO_ROW`` for none), least recently used first; each lives
    ``ttl`` seconds of the job clock from its fetch (``None``: until evicted)."""

    def __init__(self, size: int, ttl: float | None) -> None:
        self.size, self.ttl = size, ttl
        self.rows: OrderedDict[Hashable, tuple[Any, float]] = OrderedDict()  # key -> (row, expiry)

    def get(self, key: Hashable, now: float) -> Any:
        """The key's cached row, ``NO_ROW`` if cached without one, ``None`` if not cached (or expired)."""
        entry = self.rows.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self.rows[key]
            return None
        self.rows.move_to_end(key)  # recently used; its expiry stays
        return entry[0]

    def put(self, key: Hashable, row: Any, now: float) -> None:
        if not self.size:
            return
        self.rows[key] = (row, float("inf") if self.ttl is None else now + self.ttl)
        self.rows.move_to_end(key)
        if len(self.rows) > self.size:
            self.rows.popitem(last=False)


class LookupCounters:
    """A lookup join's work, summed over its task objects: lookups made, records joined from the cache."""

    __slots__ = ("cache_hits", "lookups")

    def __init__(self) -> None:
        self.lookups = 0
        self.cache_hits = 0


class LookupJoinInstance(MapAsyncInstance):
    """Runs a :class:`~streamlet.core.model.lookups.LookupJoinTask`: lookups in flight, order kept."""

    def __init__(self, node: Node, index: int, outputs: RoutedOutputs, env: Environment, inbox: Inbox) -> None:
        super().__init__(node, index, outputs, env, inbox)
        task = self.task
        assert isinstance(task, LookupJoinTask)
        self.lookup: Lookup = task.lookup  # the instance's own once it runs (kept across restarts)
        self.cache = LookupCache(task.cache_size, task.cache_ttl)
        self.lookup_counters = LookupCounters()
        self.uncalled_lookups: deque[KeyLookup] = deque()
        self.looking_up: dict[Any, KeyLookup] = {}  # key -> the lookup (queued or in flight) that asks for it

    async def run(self) -> None:
        """Run with this instance's own lookup: ``lookup.connect()``'s, when the lookup has one (a pool of
        connections per instance, opened here and closed when the instance ends), else the lookup itself."""
        task = self.task
        assert isinstance(task, LookupJoinTask)
        connect = getattr(task.lookup, "connect", None)
        if connect is None:
            self.lookup = task.lookup
            await super().run()
            return
        async with connect() as lookup:
            self.lookup = lookup
            await super().run()

    def _full(self) -> bool:
        pending = len(self.uncalled_lookups)
        return pending >= self.concurrency or self.entries >= self.concurrency * self.env.batch_size

    def _take(self, batch: Batch) -> None:
        """Join the cached keys' records now; the others wait for this batch's lookup (or one in flight)."""
        now = self.env.clock.now()
        lookup = KeyLookup()
        for element in batch:
            self._enter(element, now, lookup)
        self.entries += len(batch)
        if lookup.keys:
            self.uncalled_lookups.append(lookup)
        self._start_calls()

    def _enter(self, element: Element, now: float, lookup: KeyLookup) -> None:
        call = Call(element, 0)  # in order: no watermark segments
        self.queue.append(call)
        key = element[0]
        row = self.cache.get(key, now)
        if row is not None:
            self.lookup_counters.cache_hits += 1
            self._join(call, row)
            return
        pending = self.looking_up.get(key)
        if pending is None:
            self.looking_up[key] = pending = lookup
        pending.wait_for(key, call)

    def _start_calls(self) -> None:
        group = self.group
        if group is None:
            return  # not running yet (restored): the loop starts them
        while self.uncalled_lookups and self.calling < self.concurrency:
            lookup = self.uncalled_lookups.popleft()
            lookup.state = CALLING
            self.calling += 1
            self.lookup_counters.lookups += 1
            group.start_soon(self._run_lookup, lookup)

    async def _run_lookup(self, lookup: KeyLookup) -> None:
        """One ``await lookup(keys)``; its answer or error is handled by the loop."""
        try:
            if self.timeout is None:
                lookup.answer = await self.lookup(list(lookup.keys))
            else:  # real time (the event loop's clock): a lookup's budget, not the job clock the cache uses
                with anyio.move_on_after(self.timeout) as scope:
                    lookup.answer = await self.lookup(list(lookup.keys))
                if scope.cancelled_caught:
                    lookup.error = TimeoutError(f"the lookup took longer than timeout={self.timeout!r} seconds")
        except Exception as exc:  # noqa: BLE001 - user code: the loop applies the policy
            lookup.error = exc
        self.calling -= 1
        self.finished_calls.append(lookup)
        self._start_calls()
        self.inbox.wake()

    def _answered(self, lookup: KeyLookup) -> None:  # its calls are lookups
        """A completed lookup: its error to the policy for every record waiting (again: back to the front),
        or its rows cached and joined with the records waiting."""
        error = lookup.error
        answer, lookup.answer, lookup.error = lookup.answer, None, None
        if error is None and not isinstance(answer, Mapping):
            error = TypeError(f"the lookup must return a dict of key -> row, got {answer!r:.80}")
        if error is not None:
            self._lookup_failed(lookup, error)
            return
        now = self.env.clock.now()
        for key in lookup.keys:
            row = answer.get(key)
            row = NO_ROW if row is None else row
            self.cache.put(key, row, now)
            del self.looking_up[key]
            for call in lookup.waiting[key]:
                self._join(call, row)

    def _lookup_failed(self, lookup: KeyLookup, error: BaseException) -> None:
        calls = lookup.records
        if self.policy.failed_unit(self, [call.element for call in calls], error, "lookup of the batch with key"):
            lookup.state = UNCALLED
            self.uncalled_lookups.appendleft(lookup)  # looked up again, before any later batch
            return
        for key in lookup.keys:
            del self.looking_up[key]
        for call in calls:  # dead-lettered: each leaves without output
            call.state = DONE

    def _join(self, call: Call, row: Any) -> None:
        """The record's output from its key's row (``NO_ROW``: none), by the task's ``fn`` and kind; a failing
        ``fn`` follows the policy for that record (again: with a new task object)."""
        key, value = call.element[0], call.element[1]
        while True:
            task = self.task
            assert isinstance(task, LookupJoinTask)
            if row is NO_ROW and task.how == "inner":
                break
            try:
                call.result = (key, task.fn(key, value, None if row is NO_ROW else row))
                break
            except Exception as exc:  # noqa: BLE001 - user code: the policy decides
                if not self.policy.failed(self, call.element, exc, "record with key"):
                    break
        call.state = DONE

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from the snapshot: the joined records held again, the others looked up again."""
        stored = snapshot.get("calls")
        super().restore({**snapshot, "calls": None})
        self.uncalled_lookups, self.looking_up = deque(), {}
        lookup = KeyLookup()
        for key, value, ts, answer in [] if stored is None else unpackb(stored):
            call = Call((key, value, ts), 0)
            self.queue.append(call)
            self.entries += 1
            if answer is None:
                pending = self.looking_up.setdefault(key, lookup)
                pending.wait_for(key, call)
            else:
                call.state, call.result = DONE, None if answer is False else tuple(answer)
        if lookup.keys:
            self.uncalled_lookups.append(lookup)
