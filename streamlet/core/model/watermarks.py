"""How a source's instances make watermarks (event-time progress), as plain configuration.

A watermark ``t`` on a channel says that no record with an event time
below ``t`` will follow on it. Each source instance makes one after every
batch it reads (never on a timer: with the source's parallelism and batch
size fixed, the same records are late at any downstream parallelism), and
a task's watermark is the minimum over its inputs. Event-time windows close
on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from streamlet.core.model.record import Record
from streamlet.errors import TopologyError

__all__ = ("Watermarks",)


@dataclass(frozen=True, slots=True)
class Watermarks:
    """A source's watermark strategy.

    By default the watermark after a batch is the largest event time read
    so far minus ``out_of_orderness`` (seconds): records up to that much
    older than the newest one are still on time. A reader that knows better
    (``SourceReader.event_time_progress``, e.g. the minimum over its Kafka
    partitions) is asked first. With ``fn``, the watermark is instead the
    largest ``fn(record)`` that is not ``None`` (punctuated watermarks: a
    record can say "event time has reached t"). A watermark never goes
    back: a lower value from ``fn`` or a reader is ignored, and logged the
    first time per instance.

    With ``idle_after`` (seconds of the job clock), an instance that reads
    nothing for that long declares itself idle, so it holds back no
    downstream watermark until it reads again.

    Example:
        >>> Watermarks(out_of_orderness=5.0, idle_after=30.0)
        Watermarks(out_of_orderness=5.0, idle_after=30.0)
    """

    out_of_orderness: float = 0.0
    idle_after: float | None = None
    fn: Callable[[Record], float | None] | None = field(default=None, compare=False, repr=False)

    def validate(self, where: str) -> None:
        """Raise ``TopologyError`` naming ``where`` for a negative bound or a non-positive idle time."""
        bound = self.out_of_orderness
        if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound >= 0:
            raise TopologyError(f"{where}: watermarks out_of_orderness must be a number >= 0, got {bound!r}")
        idle = self.idle_after
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int | float) or not idle > 0):
            raise TopologyError(f"{where}: watermarks idle_after must be > 0, got {idle!r}")
        if self.fn is not None and not callable(self.fn):
            raise TopologyError(f"{where}: watermarks fn must be callable, got {self.fn!r}")
