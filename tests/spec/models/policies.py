"""Brute-force models of the error policies of docs/model.md ("Errors in user code", "What a failed record
leaves behind: nothing"), written from the documentation alone.

A record whose call fails leaves nothing behind: under ``skip`` it has no effect at all (no emission,
no change of state, no timer set or cancelled) and is dead-lettered; under ``restart`` a transient
failure changes nothing. So each model is a plain loop over the records that skips the failing ones
(``skip``) or ignores the failure (``restart``: the model is given no failures).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

INF = float("inf")


@dataclass(frozen=True)
class Rec:
    key: Any
    value: Any
    ts: float | None


@dataclass
class Outcome:
    """``outputs`` are ``(key, value, ts)`` in the order one instance emits them (a key's order is what
    the tests compare across instances); ``dead`` the dead letters as ``(key, value, ts)``; ``final``
    the keyed state left at the end (the user task's)."""

    outputs: list[tuple[Any, Any, float | None]] = field(default_factory=list)
    dead: list[tuple[Any, Any, float | None]] = field(default_factory=list)
    final: dict[Any, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ user task
#
# The user task of the tests runs a small program carried by each record: ``record.value`` is
# ``(i, ops)``, each op one of
#
#   ("add",)        v = state.get(key); state.put(key, {"n": n + 1, "log": log + [i]})  (a new value)
#   ("append",)     state.get(key)["log"].append(i) in place (state.put(key, {"n": 0, "log": [i]}) if absent)
#   ("vput",)       state.values[key] = {"n": -i, "log": [i]}
#   ("inplace",)    v = state.values.get(key); v["n"] = 2 * v["n"] + 1 in place (nothing if absent)
#   ("del",)        state.delete(key)
#   ("vdel",)       state.values.pop(key, None)
#   ("emit",)       outputs.emit(key, ("rec", i, snap(state.get(key))), ts=record.ts)
#   ("timer", d)    timers.at(key, record.ts + d)                  (event time)
#   ("cancel", d)   timers.cancel(key, record.ts + d)
#
# with ``snap(v) = None if v is None else (v["n"], tuple(v["log"]))``. ``on_timer(key, when)`` emits
# ``("timer", when, snap(state.get(key)))`` without ``ts`` (so stamped ``when``) and then adds 100 to the
# key's ``n`` in place (``put`` of ``{"n": 100, "log": []}`` if absent); with ``timer_reads_state=False``
# it only emits ``("timer", when)``. ``finish`` emits ``("final", snap(v))`` for every key of the state
# (``ts=None``).

OPS = ("add", "append", "vput", "inplace", "del", "vdel", "emit")


def snap(value: Any) -> Any:
    return None if value is None else (value["n"], tuple(value["log"]))


def run_ops(state: dict[Any, Any], timers: dict[tuple[Any, float], int], seq: list[int], record: Rec) -> list[Any]:
    """One record's program on a plain dict (``state``) and a plain timer table (``timers``:
    ``(key, when) -> the order it was set``); returns what it emits."""
    i, ops = record.value
    key = record.key
    emitted: list[Any] = []
    for op in ops:
        name = op[0]
        v = state.get(key)
        if name == "add":
            state[key] = {"n": (v["n"] if v else 0) + 1, "log": (list(v["log"]) if v else []) + [i]}
        elif name == "append":
            if v is None:
                state[key] = {"n": 0, "log": [i]}
            else:
                v["log"].append(i)
        elif name == "vput":
            state[key] = {"n": -i, "log": [i]}
        elif name == "inplace":
            if v is not None:
                v["n"] = 2 * v["n"] + 1
        elif name in ("del", "vdel"):
            state.pop(key, None)
        elif name == "emit":
            emitted.append((key, ("rec", i, snap(v)), record.ts))
        elif name == "timer":
            assert record.ts is not None
            when = float(record.ts + op[1])
            if (key, when) not in timers:  # one timer per key, time and kind: setting it again changes nothing
                seq[0] += 1
                timers[(key, when)] = seq[0]
        elif name == "cancel":
            assert record.ts is not None
            timers.pop((key, float(record.ts + op[1])), None)
        else:
            raise AssertionError(op)
    return emitted


def user_task(
    records: Sequence[Rec],
    batch_size: int,
    out_of_orderness: float = 0.0,
    failing: Callable[[Rec], bool] | None = None,
    timer_fails: Callable[[Any, float], bool] | None = None,
    timer_reads_state: bool = True,
) -> Outcome:
    """The user task over ``records`` read by a list source in batches of ``batch_size``, under
    ``on_error="skip"`` with ``failing`` records and ``timer_fails`` timers (``None``: no failure, which is
    also the model of ``restart`` with transient failures, and of ``fail`` without any).

    Event time: after each source batch the watermark is the newest ``ts`` read minus
    ``out_of_orderness``; when it rises, every pending event-time timer with ``when <= watermark`` fires,
    in order of ``when``, then of setting (a timer set for a time the watermark has already passed waits
    for the next rise: it is pending, and fires at that rise). When the input ends the watermark is
    +infinity: every pending timer fires, then ``finish``."""
    out = Outcome()
    state: dict[Any, Any] = {}
    timers: dict[tuple[Any, float], int] = {}
    seq = [0]
    watermark = -INF

    def fire(until: float) -> None:
        due = sorted((w, s, k) for (k, w), s in timers.items() if w <= until)  # (when, set order) is unique
        for when, _, key in due:
            del timers[(key, when)]
            if timer_fails is not None and timer_fails(key, when):
                out.dead.append((key, None, when))  # dead-lettered as Record(key, None, when); no effect
                continue
            if not timer_reads_state:
                out.outputs.append((key, ("timer", when), when))
                continue
            v = state.get(key)
            out.outputs.append((key, ("timer", when, snap(v)), when))
            if v is None:
                state[key] = {"n": 100, "log": []}
            else:
                v["n"] += 100

    newest = -INF
    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        for record in batch:
            if failing is not None and failing(record):
                out.dead.append((record.key, record.value, record.ts))  # no effect at all
                continue
            out.outputs.extend(run_ops(state, timers, seq, record))
        for record in batch:
            if record.ts is not None:
                newest = max(newest, record.ts)
        if newest - out_of_orderness > watermark:  # the watermark rises
            watermark = newest - out_of_orderness
            fire(watermark)
    fire(INF)
    for key, v in state.items():
        out.outputs.append((key, ("final", snap(v)), None))
    out.final = {key: snap(v) for key, v in state.items()}
    return out


# ------------------------------------------------------------------------------------------ built-ins

Fails = Callable[[Rec], bool]


def map_(records: Sequence[Rec], fn: Callable[[Rec], tuple[Any, Any]], failing: Fails | None = None) -> Outcome:
    out = Outcome()
    for r in records:
        if failing is not None and failing(r):
            out.dead.append((r.key, r.value, r.ts))
            continue
        key, value = fn(r)
        out.outputs.append((key, value, r.ts))
    return out


def flat_map_(
    records: Sequence[Rec], fn: Callable[[Rec], Iterable[tuple[Any, Any]]], failing: Fails | None = None
) -> Outcome:
    """A failing call emits nothing, even what it yielded before it raised."""
    out = Outcome()
    for r in records:
        if failing is not None and failing(r):
            out.dead.append((r.key, r.value, r.ts))
            continue
        out.outputs.extend((key, value, r.ts) for key, value in fn(r))
    return out


def filter_(records: Sequence[Rec], fn: Callable[[Rec], bool], failing: Fails | None = None) -> Outcome:
    out = Outcome()
    for r in records:
        if failing is not None and failing(r):
            out.dead.append((r.key, r.value, r.ts))
            continue
        if fn(r):
            out.outputs.append((r.key, r.value, r.ts))
    return out


def reduce_(
    records: Sequence[Rec],
    fn: Callable[[Any, Any], Any],
    batch_size: int,
    emit: str = "batch",
    failing: Fails | None = None,
) -> Outcome:
    """``reduce`` per key: the first value of a key is its start (``fn`` is called from its second
    record on, so only those can fail). ``emit="record"``: the running value after every record;
    ``"batch"``: after each batch (of the list source, ``batch_size`` records), one record per key the
    batch touched, with the key's value then and the ``ts`` of its last record in the batch. A failing
    record touches nothing. ``final`` holds each key's last value."""
    out = Outcome()
    acc: dict[Any, Any] = {}
    for start in range(0, len(records), batch_size):
        touched: dict[Any, float | None] = {}
        for r in records[start : start + batch_size]:
            if r.key in acc:
                if failing is not None and failing(r):
                    out.dead.append((r.key, r.value, r.ts))
                    continue
                acc[r.key] = fn(acc[r.key], r.value)
            else:
                acc[r.key] = r.value
            touched[r.key] = r.ts
            if emit == "record":
                out.outputs.append((r.key, acc[r.key], r.ts))
        if emit == "batch":
            out.outputs.extend((key, acc[key], ts) for key, ts in touched.items())
    out.final = dict(acc)
    return out


WindowRow = tuple[Any, Any, tuple[float, float], float]


def window_reduce_(
    records: Sequence[Rec],
    fn: Callable[[Any, Any], Any],
    windows_of: Callable[[float], list[tuple[float, float]]],
    failing: Fails | None = None,
    time_unit: float = 0.001,
) -> tuple[Counter[WindowRow], list[tuple[Any, Any, float | None]]]:
    """``window_reduce`` with a fold ``fn`` over event-time windows (``windows_of(ts)``: the windows a
    record falls in) when no record is late: per key and window the values folded in arrival order, the
    first value of a key in a window being its start, one ``(key, result, window, end - time_unit)``
    per key and window. A record fails when ``failing`` says so and ``fn`` is called with it in one of
    its windows (it is not the first there); a fold that raises is taken out of every window it was
    folded into, so the record is in none. Returns the results and the dead letters."""
    acc: dict[tuple[Any, tuple[float, float]], Any] = {}
    dead: list[tuple[Any, Any, float | None]] = []
    for r in records:
        assert r.ts is not None
        windows = windows_of(r.ts)
        if failing is not None and failing(r) and any((r.key, w) in acc for w in windows):
            dead.append((r.key, r.value, r.ts))
            continue
        for w in windows:
            acc[(r.key, w)] = fn(acc[(r.key, w)], r.value) if (r.key, w) in acc else r.value
    rows = Counter((key, value, w, round(w[1] - time_unit, 6)) for (key, w), value in acc.items())
    return rows, dead


def time_windows(size: float, slide: float | None = None) -> Callable[[float], list[tuple[float, float]]]:
    """The windows of ``TimeWindow(size, slide)`` holding a ``ts`` (whole seconds: plain arithmetic)."""
    step = slide or size

    def windows_of(ts: float) -> list[tuple[float, float]]:
        out = []
        start = (ts // step) * step
        while start > ts - size:
            out.append((float(start), float(start + size)))
            start -= step
        return sorted(out)

    return windows_of


def sessions_(
    records: Sequence[Rec], fn: Callable[[Any, Any], Any], gap: float, time_unit: float = 0.001
) -> Counter[WindowRow]:
    """``window_reduce`` over ``SessionWindow(gap, time="event")`` without failures and without late
    records: per key, records at most ``gap`` apart share a session ``(first, last + gap)``; the values
    folded in arrival order."""
    per_key: dict[Any, list[Rec]] = {}
    for r in records:
        per_key.setdefault(r.key, []).append(r)
    rows: Counter[WindowRow] = Counter()
    for key, rs in per_key.items():
        ordered = sorted(rs, key=lambda r: r.ts)  # type: ignore[arg-type, return-value]
        groups: list[list[Rec]] = []
        for r in ordered:
            assert r.ts is not None
            if groups and r.ts <= max(x.ts for x in groups[-1]) + gap:  # type: ignore[operator, type-var]
                groups[-1].append(r)
            else:
                groups.append([r])
        for group in groups:
            members = [r for r in rs if r in group]  # arrival order
            value = members[0].value
            for r in members[1:]:
                value = fn(value, r.value)
            first = min(r.ts for r in group)  # type: ignore[type-var]
            last = max(r.ts for r in group)  # type: ignore[type-var]
            end = last + gap
            rows[(key, value, (float(first), float(end)), round(end - time_unit, 6))] += 1
    return rows
