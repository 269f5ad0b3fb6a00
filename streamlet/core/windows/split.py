"""Window state split by key and merged: what live rescaling does with a windowed task's windows.

Rescaling moves key segments between the instances of a task (``core/model/segments.py``), so the
window state of an instance (``logic_for(spec).snapshot()``) must follow its keys:
:func:`split_window_snapshot` cuts one snapshot into one per instance, by ``owner(key)``, and
:func:`merge_window_snapshots` joins the snapshots of several instances into one. Both work on snapshot
data (msgpack-able, exactly or plainly encoded) and give snapshots that ``restore()`` takes.

Splitting:

* Time windows hold many keys each: every open window, and every fired window kept for
  ``allowed_lateness``, is cut per key (records per port, or folded values); a part that gets no key of
  a window gets no window. Records go through ``window_from`` / ``window_data``, so tuples stay tuples.
* Sessions and per-key count windows belong to one key each: they move whole, with the key's rank
  (the order sessions with equal bounds fire in) and its record count.
* Counters (``late``) go to the part ``home`` only, so summing the instances' counters stays right.
  Clocks go to every part: the watermark, ``last_arrival`` (idle timeout), the time of the next early
  firing, a session logic's next rank. A part gets the early-firing marks ("took records since it last
  fired") of the windows it holds.
* ``CountWindow(per_key=False)`` and ``CountOrTimeWindow`` count an instance's records, not a key's
  (:func:`unsplittable`): their state is split only while it holds no open window, into empty copies
  (the record count, which numbers the windows, goes to ``home``).

Merging (the key sets must be disjoint, else ``ValueError``):

* Windows with the same bounds are joined (records appended per port in the order of the snapshots,
  folded values united); sessions and per-key counts are put side by side, session ranks renumbered in
  the order they had (ties between snapshots in the order of the snapshots).
* Counters are summed. The early-firing schedule is the earliest pending one, the dirty marks united;
  ``last_arrival`` is the latest.
* The watermark is the largest: watermarks never go back, and the one an instance saw was sent by
  upstream, so records it declares late are late for every key. A snapshot that saw a smaller
  watermark may hold open windows (or sessions) the merged watermark has passed: they stay open in
  the merged snapshot, and the restored logic fires them, ``"on_time"``, before anything else it does
  (its next ``add``, ``advance``, ``on_time`` or ``close_all``; ``next_deadline()`` says they are due
  now), so each key's window fires on time exactly once, when an unsplit instance would have fired it
  at the latest. When another snapshot had already fired that window (kept for lateness, same start),
  the on-time firing holds only the keys that had not fired; afterwards the two are kept as one fired
  window, so a late record fires it again with every key's records, as an unsplit instance would.
  Sessions and windows kept for lateness that the merged watermark has expired are dropped at that
  same catch-up, so a record for them is judged by the merged watermark alone.
* ``CountWindow(per_key=False)`` and ``CountOrTimeWindow``: at most one snapshot may hold an open
  window. Record counts are summed, and that window's indexes shifted by the others' counts, as if
  their records had come first.

Late and early firings re-emit a whole time window, so which *other* keys ride along depends on which
instance took the record or held the window, after a split as at any parallelism; each key's own
results, and every on-time firing, are those of an unsplit instance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from streamlet.core.model.encoding import hashable
from streamlet.core.model.windows import CountOrTimeWindow, CountWindow, SessionWindow, Ticks, TimeWindow, WindowSpec
from streamlet.core.windows.fold import ClosedWindow, joined, window_data, window_from

__all__ = ("merge_window_snapshots", "split_window_snapshot", "unsplittable")

_COUNTERS = ("late",)  # summed over instances: one part holds each

_PartOf = Callable[[Any], int]


def unsplittable(spec: WindowSpec) -> str | None:
    """Why window state of ``spec`` cannot be split by key (None: it can).

    Example:
        >>> unsplittable(CountWindow(3, per_key=True)) is None
        True
        >>> unsplittable(CountOrTimeWindow(10, 1.0))[:40]
        'a CountOrTimeWindow counts all of an ins'
    """
    if isinstance(spec, CountWindow) and not spec.per_key:
        return (
            "a CountWindow(per_key=False) counts all of an instance's records, not a key's; "
            "use CountWindow(..., per_key=True) to rescale it"
        )
    if isinstance(spec, CountOrTimeWindow):
        return (
            "a CountOrTimeWindow counts all of an instance's records, not a key's; "
            "use a TimeWindow, a SessionWindow or a CountWindow(..., per_key=True) to rescale it"
        )
    if not isinstance(spec, CountWindow | TimeWindow | SessionWindow):
        return f"window state of a {type(spec).__name__} cannot be split by key"
    return None


def split_window_snapshot(
    spec: WindowSpec, snapshot: Any, owner: Callable[[Any], int], parts: int, home: int
) -> list[Any]:
    """``snapshot`` (from ``logic_for(spec).snapshot()``) split into ``parts`` snapshots; part i holds the
    keys with owner(key) == i.

    Counters (``late``...) go to part ``home`` only, so sums stay right; clocks (watermark,
    last_arrival, early-firing schedule) go to every part.
    Raises ``ValueError`` for an unsplittable ``spec`` (:func:`unsplittable`) whose snapshot holds an
    open window, for ``home`` outside the parts, and for an owner outside them.

    Example:
        >>> from streamlet.core.windows.build import logic_for
        >>> logic = logic_for(CountWindow(2, per_key=True))
        >>> _ = logic.add(0, [("a", 1, None), ("b", 2, None)], 0.0)
        >>> mine, yours = split_window_snapshot(CountWindow(2, per_key=True), logic.snapshot(), "ab".index, 2, 0)
        >>> [key for key, _ in mine["keys"]], [key for key, _ in yours["keys"]]
        (['a'], ['b'])
    """
    if not 0 <= home < parts:
        raise ValueError(f"home part {home} is not one of the {parts} parts")
    part_of = _assigner(owner, parts)
    if isinstance(spec, CountWindow) and spec.per_key:
        pieces = _split_entries(snapshot, "keys", part_of, parts)
    elif isinstance(spec, SessionWindow):
        pieces = _split_entries(snapshot, "sessions", part_of, parts)
    elif isinstance(spec, TimeWindow):
        pieces = _split_time(spec, snapshot, part_of, parts)
    else:
        pieces = _split_whole(spec, snapshot, parts, home)
    return _counters_at_home(pieces, home)


def merge_window_snapshots(spec: WindowSpec, snapshots: list[Any]) -> Any:
    """One snapshot holding the keys of all ``snapshots`` (disjoint key sets), counters summed.

    The watermark is the largest; open windows it has passed fire on time when the merged logic next
    runs (see the module docstring). Raises ``ValueError`` when a key is in two snapshots, and for an
    unsplittable ``spec`` when more than one snapshot holds an open window.

    Example:
        >>> spec = CountWindow(2, per_key=True)
        >>> merged = merge_window_snapshots(spec, [{"keys": [["a", {"seen": 1, "open": []}]]}, {"keys": []}])
        >>> merged["keys"]
        [['a', {'seen': 1, 'open': []}]]
    """
    if not snapshots:
        raise ValueError("no window snapshot to merge")
    if isinstance(spec, CountWindow) and spec.per_key:
        merged = _merge_entries(snapshots, "keys")
    elif isinstance(spec, SessionWindow):
        merged = _merge_sessions(spec, snapshots)
    elif isinstance(spec, TimeWindow):
        merged = _merge_time(spec, snapshots)
    else:
        merged = _merge_whole(spec, snapshots)
    for name in _COUNTERS:
        if name in merged:
            merged[name] = sum(snapshot[name] for snapshot in snapshots)
    return merged


# -- keys to parts ----------------------------------------------------------------------------------


def _assigner(owner: Callable[[Any], int], parts: int) -> _PartOf:
    """``owner`` checked against ``parts`` and remembered per key (a window holds a key many times)."""
    known: dict[Any, int] = {}

    def part_of(key: Any) -> int:
        part = known.get(key)
        if part is None:
            part = known[key] = owner(key)
            if not isinstance(part, int) or not 0 <= part < parts:
                raise ValueError(f"owner({key!r}) gave {part!r}, not one of the {parts} parts")
        return part

    return part_of


def _counters_at_home(pieces: list[dict[str, Any]], home: int) -> list[Any]:
    for index, piece in enumerate(pieces):
        if index != home:
            for name in _COUNTERS:
                if name in piece:
                    piece[name] = 0
    return pieces


# -- sessions and per-key counts: entries of one key each ---------------------------------------------


def _split_entries(snapshot: Any, field: str, part_of: _PartOf, parts: int) -> list[dict[str, Any]]:
    """``snapshot[field]`` is a list of ``[key, ...]`` entries: each goes whole to its key's part."""
    buckets: list[list[Any]] = [[] for _ in range(parts)]
    for entry in snapshot[field]:
        buckets[part_of(hashable(entry[0]))].append(entry)  # plain msgpack gives lists for tuple keys
    return [{**snapshot, field: bucket} for bucket in buckets]


def _merge_entries(snapshots: list[Any], field: str) -> dict[str, Any]:
    entries = [entry for snapshot in snapshots for entry in snapshot[field]]
    _require_disjoint(hashable(entry[0]) for entry in entries)
    return {**snapshots[0], field: entries}


def _merge_sessions(spec: SessionWindow, snapshots: list[Any]) -> dict[str, Any]:
    # Ranks only order sessions with equal bounds: the parts' ranks overlap, so they are renumbered in
    # the order they had (a snapshot's ties before the next snapshot's).
    ranked = [(rank, index, key, held) for index, s in enumerate(snapshots) for key, rank, held in s["sessions"]]
    ranked.sort(key=lambda entry: (entry[0], entry[1]))  # unique: a snapshot's ranks are
    _require_disjoint(hashable(entry[2]) for entry in ranked)
    sessions = [[key, new_rank, held] for new_rank, (_, _, key, held) in enumerate(ranked)]
    merged = {**snapshots[0], "sessions": sessions, "next_rank": len(sessions)}
    if spec.time == "event":
        merged["watermark"] = max(snapshot["watermark"] for snapshot in snapshots)
    return merged


def _require_disjoint(keys: Iterable[Any]) -> None:
    seen: set[Any] = set()
    for key in keys:
        if key in seen:
            raise _shared(key)
        seen.add(key)


def _shared(key: Any) -> ValueError:
    return ValueError(f"key {key!r} is in more than one window snapshot: their key sets must be disjoint")


# -- time windows: many keys per window ----------------------------------------------------------


def _split_time(spec: TimeWindow, snapshot: Any, part_of: _PartOf, parts: int) -> list[dict[str, Any]]:
    ticks = Ticks(spec.time_unit)
    opened = _split_windows(snapshot["windows"], part_of, parts)
    pieces = [{**snapshot, "windows": windows} for windows in opened]
    dirty = set(snapshot.get("dirty", ()))
    for piece in pieces:  # the next early firing ("next_early") is a clock: every part keeps it
        piece["dirty"] = sorted(dirty & {ticks.of(data[0]) for data in piece["windows"]})
    for index, piece in enumerate(pieces):  # a fold's dirty keys go where the keys go
        piece["dirty_keys"] = [
            [start, [key for key in keys if part_of(hashable(key)) == index]]
            for start, keys in snapshot.get("dirty_keys", ())
        ]
    if spec.time == "event":
        for piece, fired in zip(pieces, _split_windows(snapshot["fired"], part_of, parts), strict=True):
            piece["fired"] = fired
    return pieces


def _split_windows(windows: list[Any], part_of: _PartOf, parts: int) -> list[list[Any]]:
    """Each window's keys per part (as window data); a part gets no window where it has no key."""
    out: list[list[Any]] = [[] for _ in range(parts)]
    for data in windows:
        window = window_from(data)  # keys back as tuples
        cut = [ClosedWindow(window.start, window.end, {}, None, window.last_ts) for _ in range(parts)]
        for port, records in window.records.items():
            for record in records:
                cut[part_of(record[0])].records.setdefault(port, []).append(record)
        for key, value in (window.folded or {}).items():
            piece = cut[part_of(key)]
            if piece.folded is None:
                piece.folded = {}
            piece.folded[key] = value
        for index, piece in enumerate(cut):
            if piece.records or piece.folded:
                out[index].append(window_data(piece))
    return out


def _merge_time(spec: TimeWindow, snapshots: list[Any]) -> dict[str, Any]:
    merged = {**snapshots[0], "windows": _joined_windows([s["windows"] for s in snapshots])}
    merged["dirty"] = sorted({start for snapshot in snapshots for start in snapshot.get("dirty", ())})
    dirty_keys: dict[int, list[Any]] = {}
    for snapshot in snapshots:
        for start, keys in snapshot.get("dirty_keys", ()):
            dirty_keys.setdefault(start, []).extend(keys)
    merged["dirty_keys"] = [[start, keys] for start, keys in sorted(dirty_keys.items())]
    pending = [s["next_early"] for s in snapshots if s.get("next_early") is not None]
    merged["next_early"] = min(pending, default=None)
    if spec.time == "event":
        merged["fired"] = _joined_windows([s["fired"] for s in snapshots])
        merged["watermark"] = max(snapshot["watermark"] for snapshot in snapshots)
        merged["last_arrival"] = max(snapshot["last_arrival"] for snapshot in snapshots)
    return merged


def _joined_windows(groups: list[list[Any]]) -> list[Any]:
    """Windows of several snapshots, those with the same bounds joined; each key in one snapshot only."""
    spans: dict[tuple[float, float], ClosedWindow] = {}
    owners: dict[Any, int] = {}  # key -> the snapshot that holds it
    for index, windows in enumerate(groups):
        for window in map(window_from, windows):
            for key in _keys(window):
                if owners.setdefault(key, index) != index:
                    raise _shared(key)
            into = spans.get((window.start, window.end))
            spans[(window.start, window.end)] = window if into is None else joined(into, window)
    return [window_data(window) for window in spans.values()]


def _keys(window: ClosedWindow) -> set[Any]:
    keys = {record[0] for records in window.records.values() for record in records}
    return keys.union(window.folded or ())


# -- counted over the whole instance: split only while empty -------------------------------------------


def _holds_open(spec: WindowSpec, snapshot: Any) -> bool:
    """Whether an unsplittable ``snapshot`` holds a window with a record or a value in it."""
    if isinstance(spec, CountWindow):
        return any(_has_content(data) for data in snapshot["open"])
    if isinstance(spec, CountOrTimeWindow):
        return snapshot["current"] is not None and _has_content(snapshot["current"])
    raise ValueError(unsplittable(spec))  # no snapshot layout known for it


def _has_content(data: list[Any]) -> bool:
    _, _, ports, folded, _ = data
    return any(records for _, records in ports) or bool(folded)


def _split_whole(spec: WindowSpec, snapshot: Any, parts: int, home: int) -> list[dict[str, Any]]:
    if _holds_open(spec, snapshot):
        raise ValueError(unsplittable(spec))
    if isinstance(spec, CountWindow):
        # the record count numbers the windows and is summed on merge: home keeps it, the others start at 0
        return [{**snapshot, "open": [], "seen": snapshot["seen"] if index == home else 0} for index in range(parts)]
    return [{**snapshot, "current": None} for _ in range(parts)]


def _merge_whole(spec: WindowSpec, snapshots: list[Any]) -> dict[str, Any]:
    holders = [snapshot for snapshot in snapshots if _holds_open(spec, snapshot)]
    if len(holders) > 1:
        raise ValueError(f"{len(holders)} of the snapshots hold open windows: {unsplittable(spec)}")
    base = holders[0] if holders else snapshots[0]
    if not isinstance(spec, CountWindow):
        return {**base}
    # the others' records come first: the open windows' indexes move up by their counts
    shift = sum(snapshot["seen"] for snapshot in snapshots) - base["seen"]
    return {**base, "seen": base["seen"] + shift, "open": [_shifted(data, shift) for data in base["open"]]}


def _shifted(data: list[Any], shift: int) -> list[Any]:
    start, end, *rest = data
    return [start + shift, end + shift, *rest]
