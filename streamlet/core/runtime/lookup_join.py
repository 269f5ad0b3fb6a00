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
wait to be called beyond those in flight, or while ``concurrency + 1``
batches of records wait to leave. A checkpoint stores the records not yet joined (looked
up again after a restore) and the joined ones held back by order; the cache is
not stored: it is only a cache.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from streamlet.core.model.encoding import unpackb
from streamlet.core.model.lookups import Lookup, LookupJoinTask, pair, row_copier
from streamlet.core.model.record import Batch, Element
from streamlet.core.runtime.async_calls import CALLING, DONE, EMITTED, UNCALLED, MapAsyncInstance
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.instances import Environment
from streamlet.core.runtime.outputs import RoutedOutputs
from streamlet.errors import TaskError

if TYPE_CHECKING:
    from streamlet.core.model.topology import Node

NO_ROW = object()  # cached for a key the store has no row for
PENDING = object()  # a record's output while its key's lookup is out


class BatchEntry:
    """A batch taken: its records and, position by position, each one's output element (``None``: none, a
    drop) or ``PENDING`` while its key's lookup is out; done once nothing is pending."""

    __slots__ = ("elements", "pending", "results", "state")

    def __init__(self, elements: Batch, results: list[Any], pending: int) -> None:
        self.elements = elements
        self.results = results
        self.pending = pending
        self.state = DONE if not pending else UNCALLED


class KeyLookup:
    """One ``await lookup(keys)``: its distinct keys, the records waiting for each, the answer or error."""

    __slots__ = ("answer", "error", "keys", "records", "state", "waiting")

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self.waiting: dict[Any, list[tuple[BatchEntry, int]]] = {}  # key -> its records (entry, position)
        self.records: list[tuple[BatchEntry, int]] = []  # every record waiting, in input order (taken in order)
        self.state = UNCALLED
        self.answer: Any = None
        self.error: BaseException | None = None

    def wait_for(self, key: Any, entry: BatchEntry, position: int) -> None:
        waiting = self.waiting.get(key)
        if waiting is None:
            self.keys.append(key)
            self.waiting[key] = waiting = []
        waiting.append((entry, position))
        self.records.append((entry, position))


class LookupCache:
    """The rows of recently looked-up keys (``NO_ROW`` for none), least recently used first; each lives
    ``ttl`` seconds of the job clock from its fetch (``None``: until evicted)."""

    def __init__(self, size: int, ttl: float | None) -> None:
        self.size, self.ttl = size, ttl
        # key -> (row, expiry, how it is handed out: see ``row_copier``)
        self.rows: OrderedDict[Hashable, tuple[Any, float, Callable[[Any], Any]]] = OrderedDict()

    def put(self, key: Hashable, row: Any, now: float, copier: Callable[[Any], Any]) -> None:
        if not self.size:
            return
        self.rows[key] = (row, float("inf") if self.ttl is None else now + self.ttl, copier)
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
        async with contextlib.AsyncExitStack() as opened:
            try:
                self.lookup = await opened.enter_async_context(connect())
            except Exception as exc:  # say which join could not open it (the lookup says which database, why)
                where = f"task '{self.node.name}' instance {self.index}"
                message = f"{where} could not open its lookup: {type(exc).__name__}: {exc}"
                raise TaskError(message, task=self.node.name, instance=self.index, key=None) from exc
            await super().run()

    def _full(self) -> bool:
        pending = len(self.uncalled_lookups)
        return pending >= self.concurrency or self.entries >= (self.concurrency + 1) * self.env.batch_size

    def _take(self, batch: Batch) -> None:
        """Join the cached keys' records now; the others wait for this batch's lookup (or one in flight)."""
        task = self.task
        assert isinstance(task, LookupJoinTask)
        now, cache = self.env.clock.now(), self.cache
        rows, recent = cache.rows, cache.rows.move_to_end  # cache.get, inlined: the path every record takes
        fn, inner, looking_up = task.fn, task.how == "inner", self.looking_up
        results: list[Any] = []
        entry = BatchEntry(batch, results, 0)
        lookup: KeyLookup | None = None
        hits = 0
        paired = fn is pair  # the default fn, inlined
        for element in batch:
            key = element[0]
            cached = rows.get(key)
            if cached is not None and cached[1] <= now:
                del rows[key]  # expired
                cached = None
            if cached is None:
                results.append(PENDING)
                entry.pending += 1
                pending = looking_up.get(key)
                if pending is None:
                    if lookup is None:
                        lookup = KeyLookup()
                    looking_up[key] = pending = lookup
                place = (entry, len(results) - 1)  # KeyLookup.wait_for, inlined
                waiting = pending.waiting.get(key)
                if waiting is None:
                    pending.keys.append(key)
                    pending.waiting[key] = [place]
                else:
                    waiting.append(place)
                pending.records.append(place)
                continue
            hits += 1
            recent(key)  # recently used; its expiry stays
            row = cached[0]
            if row is NO_ROW:
                results.append(None if inner else self._joined(element, None))
                continue
            row = cached[2](row)  # a row of its own: what fn or a task downstream does to it stays there
            if paired:
                results.append((key, (element[1], row), element[2]))
                continue
            try:
                results.append((key, fn(key, element[1], row), element[2]))
            except Exception:  # noqa: BLE001 - user code: the policy decides, for this record
                results.append(self._joined(element, row))
        self.lookup_counters.cache_hits += hits
        entry.state = UNCALLED if entry.pending else DONE
        self.queue.append(entry)
        self.entries += len(batch)
        if lookup is not None:
            self.uncalled_lookups.append(lookup)
        self._start_calls()

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
        task = self.task
        assert isinstance(task, LookupJoinTask)
        now, inner, paired, looking_up = self.env.clock.now(), task.how == "inner", task.fn is pair, self.looking_up
        put = self.cache.put
        for key in lookup.keys:
            row = answer.get(key)
            row = NO_ROW if row is None else row
            copier = row_copier(row)
            put(key, row, now, copier)
            del looking_up[key]
            for entry, position in lookup.waiting[key]:
                element = entry.elements[position]
                if row is NO_ROW:
                    result = None if inner else self._joined(element, None)
                elif paired:  # the default fn, inlined
                    result = (key, (element[1], copier(row)), element[2])
                else:
                    result = self._joined(element, copier(row))
                entry.results[position] = result
                entry.pending -= 1
                if not entry.pending:
                    entry.state = DONE

    def _lookup_failed(self, lookup: KeyLookup, error: BaseException) -> None:
        elements = [entry.elements[position] for entry, position in lookup.records]
        if self.policy.failed_unit(self, elements, error, "lookup of the batch with key"):
            lookup.state = UNCALLED
            self.uncalled_lookups.appendleft(lookup)  # looked up again, before any later batch
            return
        for key in lookup.keys:
            del self.looking_up[key]
        for entry, position in lookup.records:  # dead-lettered: each leaves without output
            self._settled(entry, position, None)

    @staticmethod
    def _settled(entry: BatchEntry, position: int, result: Any) -> None:
        entry.results[position] = result
        entry.pending -= 1
        if not entry.pending:
            entry.state = DONE

    def _joined(self, element: Element, row: Any) -> Element | None:
        """The record's output element from its key's row (``None``: no row, a left join's), by the task's
        ``fn``; a failing ``fn`` follows the policy for that record (again: with a new task object)."""
        key, value = element[0], element[1]
        while True:
            task = self.task
            assert isinstance(task, LookupJoinTask)
            try:
                return (key, task.fn(key, value, row), element[2])
            except Exception as exc:  # noqa: BLE001 - user code: the policy decides
                if not self.policy.failed(self, element, exc, "record with key"):
                    return None

    def _emit(self, entry: BatchEntry) -> None:  # type: ignore[override]  # the queue's entries are batches
        """A done batch leaves: its output elements, in order."""
        self.outputs.emit_elements([result for result in entry.results if result is not None])
        entry.state = EMITTED
        entry.results = []
        self.entries -= len(entry.elements)

    def _stored_entries(self) -> list[tuple[Any, Any, Any, Any]]:
        """Every record not yet emitted as ``(key, value, ts, answer)``: ``None`` to look up again,
        ``False`` for a drop, else the output ``[key, value]``."""
        stored: list[tuple[Any, Any, Any, Any]] = []
        for entry in self.queue:
            if type(entry) is not BatchEntry or entry.state == EMITTED:
                continue
            for element, result in zip(entry.elements, entry.results, strict=True):
                answer = None if result is PENDING else False if result is None else [result[0], result[1]]
                stored.append((element[0], element[1], element[2], answer))
        return stored

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from the snapshot: the joined records held again, the others looked up again."""
        stored = snapshot.get("calls")
        super().restore({**snapshot, "calls": None})
        self.uncalled_lookups, self.looking_up = deque(), {}
        records = [] if stored is None else unpackb(stored)
        if not records:
            return
        elements = [(key, value, ts) for key, value, ts, _answer in records]
        results = [
            PENDING if answer is None else None if answer is False else (*answer, ts) for *_, ts, answer in records
        ]
        entry = BatchEntry(elements, results, 0)
        lookup = KeyLookup()
        for position, result in enumerate(results):
            if result is PENDING:
                entry.pending += 1
                key = elements[position][0]
                self.looking_up.setdefault(key, lookup).wait_for(key, entry, position)
        entry.state = UNCALLED if entry.pending else DONE
        self.queue.append(entry)
        self.entries = len(elements)
        if lookup.keys:
            self.uncalled_lookups.append(lookup)


def _result(answer: Any, ts: Any) -> Any:
    """A stored record's output element again: ``PENDING`` (look up again), ``None`` (a drop), or the element."""
    return PENDING if answer is None else None if answer is False else (answer[0], answer[1], ts)
