"""The session-table load balancer (SpeedStream): even out a keyed task's instances by moving key segments.

A ``SESSION_TABLE`` edge routes each key through its segment to the
instance the segment table names, and its senders count every segment's
records. From one window of those counts the balancer finds the most and
the least loaded instance and moves segments from the first to the second,
the least active first (they carry the least state and the fewest records
in flight), as long as each move narrows the gap, until every instance is
within ``tolerance`` of the mean or no move helps (a segment hotter than the
mean is left where it is, alone if need be: no key-to-instance mapping can
split one key). The moves are carried out with ``move_segments``, whose
protocol holds a moved segment's records until its state has arrived, so no
key's records are lost or reordered.

Also here, for comparison: Partial Key Grouping (two hash choices per key,
the sender's less loaded one; a keyed aggregation then needs a merge step)
and the seed's balance measure S. Pure functions: loads in, moves out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streamlet.core.model.partition import SESSION_TABLE, stable_hash
from streamlet.core.model.topology import Topology

DEFAULT_TOLERANCE = 0.05  # instances within 5 % of the mean are balanced
MAX_STEPS = 64  # most donor -> receiver steps one decision takes


@dataclass(frozen=True, slots=True)
class SegmentMove:
    """Move ``segment`` (``load`` records in the window) from instance ``source`` to ``target``."""

    segment: int
    source: int
    target: int
    load: float


@dataclass(frozen=True, slots=True)
class Balancing:
    """A balancer's decision: the moves, and the imbalance (max / mean instance load) before and after them."""

    moves: tuple[SegmentMove, ...]
    before: float
    after: float
    reason: str

    def table_moves(self) -> dict[int, int]:
        """``{segment: new owner}``, what ``move_segments`` takes."""
        return {move.segment: move.target for move in self.moves}


def session_tasks(topology: Topology) -> list[str]:
    """The tasks fed through a ``SESSION_TABLE`` edge (the balancer's), in name order."""
    return sorted({edge.downstream for edge in topology.edges if edge.partitioning is SESSION_TABLE})


def instance_loads(loads: Sequence[float], owners: Sequence[int], instances: int) -> list[float]:
    """Each instance's load: the loads of the segments it owns."""
    per = [0.0] * instances
    for segment, owner in enumerate(owners):
        per[owner] += loads[segment]
    return per


def imbalance(per_instance: Sequence[float]) -> float:
    """Max over mean of the instances' loads (1.0: even; also 1.0 when nothing was sent)."""
    total = sum(per_instance)
    return 1.0 if total <= 0 else max(per_instance) * len(per_instance) / total


def best_possible(loads: Sequence[float], instances: int) -> float:
    """The imbalance no segment table can beat: 1, or the hottest segment's load over the mean if higher."""
    total = sum(loads)
    return 1.0 if total <= 0 else max(1.0, max(loads) * instances / total)


def balance(
    loads: Sequence[float], owners: Sequence[int], instances: int, tolerance: float = DEFAULT_TOLERANCE
) -> Balancing:
    """The segment moves that even out ``instances`` whose segments (``owners[segment] -> instance``) carried
    ``loads[segment]`` records in the last window; no moves when they are even within ``tolerance`` (or as
    even as the hottest segment allows)."""
    if len(loads) != len(owners):
        raise ValueError(f"{len(loads)} segment loads for a table of {len(owners)} segments")
    per = instance_loads(loads, owners, instances)
    before = imbalance(per)
    total = sum(per)
    if total <= 0:
        return Balancing((), before, before, "no records in the window")
    goal = total / instances * (1 + tolerance)
    owned = [_by_load(loads, owners, instance) for instance in range(instances)]
    moves: dict[int, SegmentMove] = {}
    for _ in range(MAX_STEPS):
        step = _step(loads, per, owned, goal)
        if not step:
            break
        for move in step:  # a segment moved twice keeps its first source
            first = moves.get(move.segment, move)
            moves[move.segment] = SegmentMove(move.segment, first.source, move.target, move.load)
    final = tuple(move for move in moves.values() if move.source != move.target)
    after = imbalance(per)
    if not final:
        even = max(per) <= goal
        reason = f"imbalance {before:.2f}: " + ("even enough" if even else "no move helps (a hot segment)")
        return Balancing((), before, after, reason)
    return Balancing(final, before, after, f"imbalance {before:.2f} -> {after:.2f} by moving {len(final)} segments")


def _by_load(loads: Sequence[float], owners: Sequence[int], instance: int) -> list[int]:
    """The segments ``instance`` owns that carried records, least active first."""
    return sorted((s for s, owner in enumerate(owners) if owner == instance and loads[s] > 0), key=loads.__getitem__)


def _step(loads: Sequence[float], per: list[float], owned: list[list[int]], goal: float) -> list[SegmentMove]:
    """One donor -> receiver step (updating ``per`` and ``owned``): from the most loaded instance above
    ``goal`` that has a segment worth moving, to the least loaded one."""
    target = min(range(len(per)), key=per.__getitem__)
    for donor in sorted(range(len(per)), key=per.__getitem__, reverse=True):
        gap = per[donor] - per[target]
        if per[donor] <= goal or gap <= 0:
            return []
        chosen = _least_active_within(loads, owned[donor], gap / 2)
        if not chosen:  # no small ones: one segment that still narrows the gap
            chosen = [s for s in owned[donor] if loads[s] < gap][:1]
        if chosen:
            for segment in chosen:
                owned[donor].remove(segment)
                owned[target].append(segment)
                per[donor] -= loads[segment]
                per[target] += loads[segment]
            owned[target].sort(key=loads.__getitem__)
            return [SegmentMove(segment, donor, target, loads[segment]) for segment in chosen]
    return []


def _least_active_within(loads: Sequence[float], segments: list[int], room: float) -> list[int]:
    """The least active of ``segments`` (sorted by load) whose loads add up to at most ``room``."""
    chosen, taken = [], 0.0
    for segment in segments:
        if taken + loads[segment] > room:
            break
        chosen.append(segment)
        taken += loads[segment]
    return chosen


def partial_key_grouping(keys: Iterable[Any], instances: int) -> list[int]:
    """Records per instance when one sender routes ``keys`` by Partial Key Grouping (Nasir et al.): each key
    has two candidate instances (two independent hashes) and goes to the one this sender has sent fewer
    records so far. A key's records end up on two instances: an aggregation needs a merge step after."""
    sent = [0] * instances
    choices: dict[Any, tuple[int, int]] = {}
    for key in keys:
        pair = choices.get(key)
        if pair is None:
            first = stable_hash(key) % instances
            second = stable_hash(["pkg-second-choice", key]) % instances
            pair = choices[key] = (first, second if second != first else (first + 1) % instances)
        chosen = pair[0] if sent[pair[0]] <= sent[pair[1]] else pair[1]
        sent[chosen] += 1
    return sent


def speedstream_s(cpu: Sequence[float], memory: Sequence[float]) -> float:
    """The seed's balance measure S over nodes: the mean distance of each node's CPU and memory load from
    their means (summed), halved. 0 is perfectly even."""
    if not cpu or len(cpu) != len(memory):
        raise ValueError("S needs one CPU and one memory figure per node")
    cpu_mean, memory_mean = sum(cpu) / len(cpu), sum(memory) / len(memory)
    spread = [abs(c - cpu_mean) + abs(m - memory_mean) for c, m in zip(cpu, memory, strict=True)]
    return sum(spread) / len(spread) / 2
