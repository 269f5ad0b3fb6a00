"""Key segments: the one place that decides which instance a key belongs to.

A key falls in one of ``segments`` segments by its ``stable_hash``, mixed
(:func:`segment_of`; ``segments`` is the task's ``max_parallelism``, 128
unless set), and a versioned
:class:`SegmentTable` says which instance owns each segment. Routing, keyed
state, timers, window state and rescaling all ask this module, so moving a
segment moves exactly its keys and nothing else: changing the number of
instances never rehashes every key (Flink's key groups, SpeedStream's
session table).

Example:
    >>> table = SegmentTable.contiguous(8, 2)
    >>> table.owners
    (0, 0, 0, 0, 1, 1, 1, 1)
    >>> table.moved_to({3: 1}).owners
    (0, 0, 0, 1, 1, 1, 1, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamlet.core.model.partition import stable_hash

DEFAULT_SEGMENTS = 128


def segment_of(key: Any, segments: int) -> int:
    """The segment ``key`` falls in, the same in every process and run (see :func:`spread`)."""
    return spread(stable_hash(key), segments)


def spread(hashed: int, segments: int) -> int:
    """A 32-bit hash's segment: mixed first (Fibonacci hashing: times 2^32 / phi), then scaled to ``range(segments)``.

    CRC-32 is linear: keys that differ in one character (``s0`` .. ``s7``,
    ``user1`` .. ``user9``) differ in a fixed pattern of bits, and a plain
    ``% 128`` left all eight in the first half of the segments, so contiguous
    ranges put them on one instance. The multiplication carries every bit of
    the hash into the high bits that pick the segment.
    """
    return (((hashed * 0x9E3779B1) & 0xFFFFFFFF) * segments) >> 32


@dataclass(frozen=True, slots=True)
class SegmentTable:
    """Which instance owns each segment of one task: ``owners[segment] -> instance index``.

    ``instances`` is the task's number of instances (an instance may own no
    segment for a while); ``version`` grows by one with every change.
    """

    owners: tuple[int, ...]
    instances: int
    version: int = 0

    @classmethod
    def contiguous(cls, segments: int, instances: int, version: int = 0) -> SegmentTable:
        """Segments in ``instances`` contiguous ranges of (nearly) equal size: the default layout."""
        if not 1 <= instances <= segments:
            raise ValueError(f"{instances} instances cannot share {segments} segments (1 to {segments})")
        return cls(tuple(segment * instances // segments for segment in range(segments)), instances, version)

    @property
    def segments(self) -> int:
        """How many segments the keys are spread over."""
        return len(self.owners)

    def owner(self, key: Any) -> int:
        """The instance that owns ``key``."""
        return self.owners[segment_of(key, len(self.owners))]

    def owner_function(self) -> Callable[[Any], int]:
        """``owner`` as a plain function (what state splitting calls per key)."""
        owners, segments = self.owners, len(self.owners)
        return lambda key: owners[segment_of(key, segments)]

    def segments_of(self, instance: int) -> list[int]:
        """The segments ``instance`` owns, in order."""
        return [segment for segment, owner in enumerate(self.owners) if owner == instance]

    def moved_to(self, moves: Mapping[int, int]) -> SegmentTable:
        """The next version with ``moves`` (segment -> new owner) applied."""
        owners = list(self.owners)
        for segment, owner in moves.items():
            owners[segment] = owner
        return SegmentTable(tuple(owners), self.instances, self.version + 1)

    def rescaled(self, instances: int) -> SegmentTable:
        """The next version spread over ``instances``: contiguous ranges, so a rescale moves few segments."""
        return SegmentTable.contiguous(len(self.owners), instances, self.version + 1)

    def changes(self, new: SegmentTable) -> dict[int, tuple[int, int]]:
        """Segments whose owner differs in ``new``: segment -> (old owner, new owner)."""
        return {
            segment: (old, after)
            for segment, (old, after) in enumerate(zip(self.owners, new.owners, strict=True))
            if old != after
        }

    def to_data(self) -> dict[str, Any]:
        """As plain data (for checkpoints and the cluster store)."""
        return {"owners": list(self.owners), "instances": self.instances, "version": self.version}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SegmentTable:
        """Back from :meth:`to_data`, checked: every owner is an instance index."""
        owners, instances = tuple(int(owner) for owner in data["owners"]), int(data["instances"])
        if not owners or any(not 0 <= owner < instances for owner in owners):
            raise ValueError(f"a segment table names instances outside 0..{instances - 1}: {list(owners)[:16]}")
        return cls(owners, instances, int(data.get("version", 0)))
