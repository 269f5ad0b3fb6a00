"""A histogram of durations in doubling buckets: latencies, checkpoint durations."""

from __future__ import annotations


class LatencyHistogram:
    """Latencies in buckets doubling from 1 µs (bucket b holds [2^(b-1), 2^b) µs): cheap to add to, to merge
    and to send, and within a factor of two at any quantile."""

    __slots__ = ("counts",)

    BUCKETS = 40  # 2^39 µs is six days: enough for any latency worth reporting

    def __init__(self, counts: list[int] | None = None) -> None:
        self.counts = counts if counts is not None else [0] * self.BUCKETS

    def add(self, seconds: float) -> None:
        """Count one latency."""
        bucket = int(seconds * 1_000_000).bit_length()
        self.counts[bucket if bucket < self.BUCKETS else self.BUCKETS - 1] += 1

    @property
    def total(self) -> int:
        """Latencies counted."""
        return sum(self.counts)

    def quantile(self, q: float) -> float | None:
        """The upper bound, in seconds, of the bucket holding quantile ``q`` (``None``: nothing counted)."""
        total = self.total
        if not total:
            return None
        rank, seen = q * total, 0
        for bucket, count in enumerate(self.counts):
            seen += count
            if seen >= rank and count:
                return (1 << bucket) / 1_000_000
        return (1 << (self.BUCKETS - 1)) / 1_000_000

    def since(self, earlier: LatencyHistogram) -> LatencyHistogram:
        """What was counted after ``earlier`` (a snapshot of this one) was taken."""
        return LatencyHistogram([now - before for now, before in zip(self.counts, earlier.counts, strict=True)])

    def copy(self) -> LatencyHistogram:
        """A snapshot of the counts."""
        return LatencyHistogram(list(self.counts))
