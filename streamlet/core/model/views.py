"""Records handed to user code without making one per element: reusable "views" refilled from elements.

A view is a :class:`Record` that the runtime refills from the next plain
element. It is safe because a view is never changed once anything but the
runtime holds it: before refilling one, the runtime compares its reference
count with the count it has when only the runtime holds it
(``sys.getrefcount``, as CPython's own ``zip`` reuses its result tuple).
A record the user kept (in a list, in state, in a closure, as part of a
result) is the user's for good; the runtime makes a new view in its place.

Making a record per element costs ~130 ns and puts an object the garbage
collector tracks in the young generation per element: in a whole pipeline
that measured 360 ns a record against 140 ns refilling a view.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

from streamlet.core.model.record import Batch, Record, Records, record_of, records_of

_counts = itertools.count()


def never_free(_: object) -> int:
    """A count that never repeats: where reference counts cannot be trusted, every view is new each time."""
    return next(_counts)


#: The CPython versions whose reference counting the rule above is known to hold for: the suite proves it on
#: them (tests/unit/core/test_record_views.py keeps records every way it knows), and their interpreters
#: take a strong reference for every value on the evaluation stack, so a view that anything but the runtime
#: holds always counts more than a free one. CPython does not promise that (gh-132346: "reference counts are
#: not considered to be stable or well-defined values ... may be different between versions"), and 3.14
#: broke it: its interpreter borrows references for values it loads onto the stack ("stackrefs", What's New
#: in Python 3.14, Porting: ``sys.getrefcount`` may return smaller values), so a record held only there
#: could look free. Free-threaded builds count references per thread, approximately. Elsewhere (3.14 and
#: newer until proven, a build without its GIL, PyPy and other interpreters) a record is made per element.
VIEWS_PROVEN_ON = ((3, 11), (3, 13))


def counts_exactly(implementation: str, version: tuple[int, ...], gil_enabled: bool) -> bool:
    """Whether records may be reused on this interpreter (see :data:`VIEWS_PROVEN_ON`)."""
    first, last = VIEWS_PROVEN_ON
    return implementation == "cpython" and gil_enabled and first <= tuple(version[:2]) <= last


EXACT_COUNTS = counts_exactly(
    sys.implementation.name, (sys.version_info[0], sys.version_info[1]), getattr(sys, "_is_gil_enabled", lambda: True)()
)
getrefcount: Callable[[object], int] = sys.getrefcount if EXACT_COUNTS else never_free


def new_view() -> Record:
    """An empty record to refill."""
    return Record(None, None, None)


class RecordViews:
    """The records of one input port's batches, refilled wake-up after wake-up (see the module's doc).

    Position ``i`` of every batch reuses the same view while nobody kept the
    one handed out before; up to ``limit`` positions keep a view (a larger
    batch gets new records past it), so the views held stay bounded.

    Example:
        >>> views = RecordViews()
        >>> first = views.records_of([("a", 1, None)])
        >>> kept = first[0]
        >>> del first
        >>> second = views.records_of([("b", 2, None)])
        >>> (kept.key, second[0].key)  # the kept record is the user's: position 0 got a new view
        ('a', 'b')
    """

    __slots__ = ("_free", "_views", "limit")

    def __init__(self, limit: int = 4096) -> None:
        view = new_view()
        self._views: list[Record] = [view]
        # Held by the list, this local and the call's argument: the same shape as in records_of's loop.
        self._free = getrefcount(view)
        self.limit = limit

    def records_of(self, batch: Batch) -> Records:
        """The records ``batch`` carries, as a new list of views (six-wide elements get records of their own)."""
        limit = self.limit
        if len(batch) > limit:
            return self.records_of(batch[:limit]) + records_of(batch[limit:])
        views = self._views
        if len(views) < len(batch):
            views.extend([new_view() for _ in range(len(batch) - len(views))])
        free, count = self._free, getrefcount
        records: Records = []
        append = records.append
        index = 0
        try:
            for element in batch:  # the hot loop: no per-element check but the reference count
                view = views[index]
                if count(view) != free:  # handed out before and kept: the user's now
                    view = views[index] = new_view()
                view.key, view.value, view.ts = element  # a six-wide element fails here, before any field
                append(view)
                index += 1
        except ValueError:
            self._mixed(batch, index, records)
        return records

    def _mixed(self, batch: Batch, start: int, records: Records) -> None:
        """From ``start`` on, a batch with loop or window elements among plain ones."""
        views, free, count = self._views, self._free, getrefcount
        for index in range(start, len(batch)):
            element = batch[index]
            if len(element) != 3:
                records.append(record_of(element))
                continue
            view = views[index]
            if count(view) != free:
                view = views[index] = new_view()
            view.key, view.value, view.ts = element
            records.append(view)
