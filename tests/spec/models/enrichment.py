"""Brute-force models of ``map_async`` and ``lookup_join``, written from docs/enrichment.md alone.

Each function is a plain loop over the whole input that recomputes its answer from scratch: no
concurrency, no batching, no incremental state. What the page leaves to timing (which records share a
batch, which call answers first) is left out of the models; the tests compare only what the page fixes.
"""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

INF = float("inf")


@dataclass(frozen=True)
class Rec:
    """An input record."""

    key: Any
    value: Any
    ts: float | None


@dataclass
class Outcome:
    """What a node gives for the whole input.

    ``outputs`` are ``(key, value, ts)`` in input order (the order the page promises for
    ``ordered=True`` and for ``lookup_join``; for ``ordered=False`` only the multiset counts);
    ``origin[j]`` is the index of the input record of ``outputs[j]``; ``dead`` the input records
    dead-lettered under ``on_error="skip"``, in input order; ``failing`` the records whose failure stops
    the job under ``on_error="fail"`` (the job fails when there is one, naming one of their keys)."""

    outputs: list[tuple[Any, Any, float | None]] = field(default_factory=list)
    origin: list[int] = field(default_factory=list)
    dead: list[Rec] = field(default_factory=list)
    failing: list[Rec] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ map_async

#: ``fn(key, value) -> (key, value) | None``: the answer of the call for one record.
AsyncFn = Callable[[Any, Any], "tuple[Any, Any] | None"]
#: ``fails(index, record) -> bool``: whether the call for this record raises (or answers something that
#: is neither ``None`` nor a ``(key, value)`` pair, or takes longer than ``timeout``) every time it is made.
Fails = Callable[[int, Rec], bool]


def map_async(records: Sequence[Rec], fn: AsyncFn, on_error: str = "skip", fails: Fails | None = None) -> Outcome:
    """``map_async`` over ``records``: every record's answer, ``None`` dropping it, keeping its ``ts``.

    * ``"skip"``: a failing call dead-letters its record, the others go on;
    * ``"restart"``: the call is made again; a transient failure (``fails`` false the next time) changes
      nothing, so the model is given no ``fails`` at all;
    * ``"fail"``: the job stops; ``failing`` lists the records that may be the one it names (the calls
      run concurrently, so any of them may fail first).
    Ordering (input order or completion order) is not modelled here: ``outputs`` is in input order."""
    out = Outcome()
    for i, record in enumerate(records):
        if fails is not None and fails(i, record):
            if on_error == "skip":
                out.dead.append(record)
            elif on_error == "fail":
                out.failing.append(record)
            continue
        answer = fn(record.key, record.value)
        if answer is None:  # None drops the record
            continue
        key, value = answer
        out.outputs.append((key, value, record.ts))  # results keep their input record's ts
        out.origin.append(i)
    return out


def source_watermarks(records: Sequence[Rec], batch_size: int, out_of_orderness: float) -> list[float]:
    """The watermark a list source (one instance) sends after each of its batches of ``batch_size``
    records: the largest ``ts`` read so far minus ``out_of_orderness``, never going back; ``-inf``
    while no record with a ``ts`` has been read."""
    marks: list[float] = []
    newest = -INF
    for start in range(0, len(records), batch_size):
        for record in records[start : start + batch_size]:
            if record.ts is not None:
                newest = max(newest, record.ts)
        marks.append(newest - out_of_orderness)
    return marks


def watermark_bounds(records: Sequence[Rec], batch_size: int, out_of_orderness: float) -> list[float]:
    """For each record, the newest watermark the source sent before the batch holding it (``-inf`` for
    the first batch). 'A result never overtakes a watermark that followed its record': when a result
    reaches the node downstream, the watermark that node has seen is at most this bound of its record."""
    marks = source_watermarks(records, batch_size, out_of_orderness)
    return [marks[i // batch_size - 1] if i >= batch_size else -INF for i in range(len(records))]


def late_records(records: Sequence[Rec], batch_size: int, out_of_orderness: float) -> list[int]:
    """Indexes of the records behind the watermark that came before them (late for a window downstream
    whatever the window): a test that wants no late record draws inputs where this is empty."""
    bounds = watermark_bounds(records, batch_size, out_of_orderness)
    return [i for i, r in enumerate(records) if r.ts is not None and r.ts < bounds[i]]


def tumbling_sums(
    outputs: Sequence[tuple[Any, Any, float | None]], size: float, time_unit: float = 0.001
) -> Counter[tuple[Any, Any, tuple[float, float], float]]:
    """A ``window_reduce(..., "sum", window=TimeWindow(size, time="event"))`` downstream, when no result
    is late (the page: 'an event-time window downstream gets every result in its window and none
    late'): ``(key, sum, (start, end), end - time_unit)`` per key and window. Times are whole seconds
    here, so the windows are plain arithmetic."""
    sums: dict[tuple[Any, float], Any] = {}
    for key, value, ts in outputs:
        assert ts is not None
        start = (ts // size) * size
        sums[(key, start)] = sums.get((key, start), 0) + value
    return Counter(
        (key, total, (start, start + size), round(start + size - time_unit, 6)) for (key, start), total in sums.items()
    )


# ---------------------------------------------------------------------------------------- lookup_join

#: ``fn(key, value, row) -> value``.
JoinFn = Callable[[Any, Any, Any], Any]
#: ``fn_fails(index, record, row) -> bool``: whether ``fn`` raises for this record, every time.
FnFails = Callable[[int, Rec, Any], bool]


def row_of(rows: dict[Any, Any], key: Any) -> Any:
    """The row the store answers for ``key``: a key missing from the answer, or answered ``None``, has
    no row (``None``)."""
    return rows.get(key)


def lookup_join(
    records: Sequence[Rec],
    rows: dict[Any, Any],
    how: str = "inner",
    fn: JoinFn | None = None,
    on_error: str = "skip",
    fn_fails: FnFails | None = None,
    lookup_fails: Callable[[Any], bool] | None = None,
) -> Outcome:
    """``lookup_join`` over ``records`` against the store ``rows``: each record becomes
    ``(key, fn(key, value, row))`` (by default ``(value, row)``) with its own ``ts``, in input order;
    ``"inner"`` drops the records without a row (``fn`` is not called for them), ``"left"`` keeps them
    with ``row=None``.

    Each record gets a row of its own: whatever ``fn`` (or anything downstream) does to the row it got,
    the next record of the key gets the store's row as it was; the model hands every record a deep copy.

    ``fn_fails`` picks the records whose ``fn`` raises (its own record only: dead-lettered under
    ``"skip"``). ``lookup_fails(key)`` says the lookup of ``key`` raises every time: a model for one
    record per batch (the stepwise driver), where a lookup waits for one record only, which is
    dead-lettered under ``"skip"`` (under ``"fail"`` listed in ``failing``)."""
    out = Outcome()
    for i, record in enumerate(records):
        if lookup_fails is not None and lookup_fails(record.key):
            (out.dead if on_error == "skip" else out.failing).append(record)
            continue
        row = row_of(rows, record.key)
        if row is None and how == "inner":
            continue
        row = copy.deepcopy(row)  # a row of its own
        if fn is None:
            value: Any = (record.value, row)
        else:
            if fn_fails is not None and fn_fails(i, record, row):
                (out.dead if on_error == "skip" else out.failing).append(record)
                continue
            value = fn(record.key, record.value, row)
        out.outputs.append((record.key, value, record.ts))
        out.origin.append(i)
    return out


@dataclass
class CacheStep:
    """What the cache makes of one step: the keys the lookup is called with during the step (once
    each, across the instances), and how many of the step's records were joined from the cache
    (meaningful for a step of one record: in a longer one, whether a record whose key an earlier
    record of the step fetched counts as a hit depends on the batches)."""

    asked: Counter[Any]
    hits: int


def lookup_cache(
    steps: Sequence[tuple[float, Sequence[Any]]],
    instance_of: Callable[[Any], Hashable],
    cache_size: int,
    cache_ttl: float | None,
    lookup_fails: Callable[[Any], bool] | None = None,
) -> list[CacheStep]:
    """The per-instance cache of ``lookup_join`` over ``steps``: each step is the job clock's time and
    the keys of the records sent in it, every lookup of a step done before the next one starts.

    Answers (keys without a row included) are cached per instance (``instance_of(key)``), at most
    ``cache_size`` keys, the least recently used (fetched or hit) evicted first, ``cache_size=0``
    caching nothing; an entry fetched at ``t`` is fresh while the clock is below ``t + cache_ttl`` (a
    hit does not extend it; ``None``: until evicted). A record whose key is fresh is a hit; else its key
    is looked up (once per step: the distinct keys of a batch, and a key already being looked up is not
    asked again). A lookup that fails (``lookup_fails``) caches nothing.

    Which records of a step share a batch is left to timing, so a step of several records needs a cache
    that evicts nothing (``cache_size`` at least the number of distinct keys) and no failing lookup:
    then what is asked does not depend on the batches. A step of one record is one batch."""
    caches: dict[Hashable, OrderedDict[Any, float]] = {}
    out: list[CacheStep] = []
    for now, keys in steps:
        if len(keys) > 1:
            assert cache_size >= len({k for _, ks in steps for k in ks}), "several records a step: no eviction"
            assert lookup_fails is None, "several records a step: no failing lookup"
        asked: Counter[Any] = Counter()
        hits = 0
        asked_now: set[Any] = set()
        for key in keys:
            cache = caches.setdefault(instance_of(key), OrderedDict())
            fetched = cache.get(key)
            if fetched is not None and (cache_ttl is None or now < fetched + cache_ttl):
                cache.move_to_end(key)  # used: the most recent
                hits += 1
                continue
            if key in asked_now:  # already being looked up in this step (one batch or one in flight)
                continue
            asked[key] += 1
            asked_now.add(key)
            if lookup_fails is not None and lookup_fails(key):
                continue  # nothing of that answer is cached
            cache.pop(key, None)
            if cache_size > 0:
                cache[key] = now
                while len(cache) > cache_size:
                    cache.popitem(last=False)
        out.append(CacheStep(asked, hits))
    return out
