"""The ``Task`` base class and the function shortcuts built on it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeAlias

from streamlet.core.model import views
from streamlet.core.model.kept import IMMUTABLE, keep, put_back_into
from streamlet.core.model.ports import Inputs, Outputs, PortDeclarer
from streamlet.core.model.record import Batch, Record, record_of
from streamlet.core.model.state import StateStore
from streamlet.core.model.timers import TimeDomain, Timers
from streamlet.core.model.windows import FoldHow

#: When ``reduce`` emits: each key's value once per batch (the default), or after every record.
ReduceEmit: TypeAlias = Literal["batch", "record"]


class Task(ABC):
    """User logic for one node; the runtime creates one object per instance.

    Override :meth:`execute` (plain or ``async def``); optionally
    :meth:`declare_ports`, :meth:`prepare`, :meth:`on_timer` and :meth:`finish`.

    Example:
        >>> class Upper(Task):
        ...     def execute(self, inputs, outputs):
        ...         for record in inputs.get():
        ...             outputs.emit(record.key, record.value.upper())
    """

    #: Set by function shortcuts that report the failing record themselves.
    #: This instance's keyed state; the runtime sets it before ``prepare``.
    state: StateStore
    #: This instance's per-key timers (they call :meth:`on_timer`); the runtime sets them before ``prepare``.
    timers: Timers

    def declare_ports(self, ports: PortDeclarer) -> None:
        """Declare input/output port counts and the input mode (default 1, 1, async)."""

    def prepare(self, config: dict[str, Any]) -> None:
        """Called once per instance before the first ``execute``."""

    @abstractmethod
    def execute(self, inputs: Inputs, outputs: Outputs) -> Any:
        """Process the batch(es) in ``inputs``; emit results to ``outputs``."""

    def on_timer(self, key: Any, when: float, time: TimeDomain, outputs: Outputs) -> Any:
        """A timer set with ``self.timers.at(key, when, time)`` is due (plain or ``async def``).

        Event-time timers (``time == "event"``) fire once the instance's
        watermark reaches ``when``, before the watermark goes downstream;
        processing-time ones once the job clock reaches ``when``. Records
        emitted without ``ts`` get ``ts=when`` (processing time: the clock's
        time). It may set and cancel timers (see :meth:`Timers.due
        <streamlet.core.model.timers.Timers.due>` for those already due);
        errors follow the task's ``on_error`` policy. When the input ends,
        every pending event-time timer fires before :meth:`finish` (up to the
        latest one pending then), and processing-time ones are dropped.
        Overriding it makes the job track event time (watermarks).
        """

    def finish(self, outputs: Outputs) -> Any:
        """Called once after every input of this instance has ended."""

    def settle_state(self) -> None:
        """Put into ``self.state`` whatever the task holds aside to fold later (plain, not ``async``).

        The runtime calls it before it snapshots the state for a checkpoint or moves it to another
        instance, so a task that batches its state writes in memory (as ``aggregate(..., emit="end")``
        does) never checkpoints without them. The default holds nothing aside.
        """


class RecordFailure(Exception):
    """Raised by a shortcut task: record ``index`` of the batch failed with ``__cause__``.

    ``held``: what the task still owes for the records before ``index`` (``reduce``: the keys they touched),
    handed back to it as ``inputs.held`` when the runtime goes on with the rest of the batch, so a batch with a
    failure emits what one without it would (``reduce``: one record per key), not once per piece."""

    def __init__(self, index: int, held: Any = None) -> None:
        super().__init__(index)
        self.index = index
        self.held = held


def _raised_in(exc: BaseException, method: Callable[..., Any]) -> bool:
    """``exc`` was raised by ``method``'s own code (unpacking a result), not inside the user's function."""
    trace = exc.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    return trace is not None and trace.tb_frame.f_code is method.__code__


def _shape_error(message: str, cause: BaseException) -> TypeError:
    error = TypeError(message)
    error.__cause__ = cause
    return error


# The shortcuts hand their function a record without making one per element: one reusable
# ``Record`` (a view, see ``views``) is refilled from each plain element; after each call the loop
# compares the view's reference count with the count it had free, and a function that kept the
# record gets it for good (the loop makes a new view). Loop and window elements (six wide) get a
# record of their own.
_getrefcount = views.getrefcount
_never_free = views.never_free
_view = views.new_view


class MapTask(Task):
    """``fn(record) -> (key, value)``; the output keeps the input's event time."""

    def __init__(self, fn: Callable[[Record], tuple[Any, Any]]) -> None:
        self.fn = fn

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Map every record of the batch."""
        fn, batch = self.fn, inputs.elements()
        out: Batch = []
        append = out.append
        view = _view()
        free = _getrefcount(view)
        result = None
        try:
            for element in batch:
                try:  # free in CPython 3.11+ unless raised: cheaper than checking each element's width
                    view.key, view.value, view.ts = element
                except ValueError:  # a loop or window element (six wide): a record of its own
                    result = fn(record_of(element))
                else:
                    result = fn(view)
                    if _getrefcount(view) != free:  # the function kept it: a new view from now on
                        view = _view()
                key, value = result  # apart from the call, so a result that is not a pair is told from fn failing
                append((key, value, element[2]))
        except Exception as exc:
            outputs.emit_elements(out)
            if _raised_in(exc, MapTask.execute):
                exc = _shape_error(f"the map function must return a (key, value) pair, got {result!r}", exc)
            raise RecordFailure(len(out)) from exc  # one output per element: the failing one's position
        outputs.emit_elements(out)


class FilterTask(Task):
    """Keeps the records for which ``fn(record)`` is true, unchanged."""

    def __init__(self, fn: Callable[[Record], bool]) -> None:
        self.fn = fn

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Filter the batch."""
        fn, batch = self.fn, inputs.elements()
        kept: Batch = []
        append = kept.append
        view = _view()
        free = _getrefcount(view)
        index = 0  # the failing element's position: by count, as a batch may hold one tuple twice
        try:
            for index, element in enumerate(batch):  # noqa: B007 - index names the element that fails
                try:
                    view.key, view.value, view.ts = element
                except ValueError:  # a loop or window element (six wide): a record of its own
                    keep = fn(record_of(element))
                else:
                    keep = fn(view)
                    if _getrefcount(view) != free:
                        view = _view()
                if keep:
                    append(element)
        except Exception as exc:
            outputs.emit_elements(kept)
            raise RecordFailure(index) from exc
        outputs.emit_elements(kept)


class FlatMapTask(Task):
    """``fn(record) -> iterable of (key, value)``; zero or more outputs each."""

    def __init__(self, fn: Callable[[Record], Iterable[tuple[Any, Any]]]) -> None:
        self.fn = fn

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Expand every record of the batch."""
        fn, batch = self.fn, inputs.elements()
        out: Batch = []
        append = out.append
        view = _view()
        free = _getrefcount(view)
        index = 0  # the failing element's position: by count, as a batch may hold one tuple twice
        kept = 0  # the outputs of the elements before it: a generator that yields, then raises, leaves nothing
        try:
            for index, element in enumerate(batch):  # noqa: B007 - index names the element that fails
                ts = element[2]
                kept = len(out)
                try:
                    view.key, view.value, view.ts = element
                except ValueError:  # a loop or window element (six wide): a record of its own
                    for key, value in fn(record_of(element)):
                        append((key, value, ts))
                else:
                    # a lazy iterable (a generator) holds the view until it is used up: count after that
                    for key, value in fn(view):
                        append((key, value, ts))
                    if _getrefcount(view) != free:
                        view = _view()
        except Exception as exc:
            del out[kept:]
            outputs.emit_elements(out)
            if _raised_in(exc, FlatMapTask.execute):
                exc = _shape_error(f"the flat_map function must return an iterable of (key, value) pairs ({exc})", exc)
            raise RecordFailure(index) from exc
        outputs.emit_elements(out)


class KeyByTask(Task):
    """Re-keys records: ``fn(record) -> key``; value and time unchanged."""

    def __init__(self, fn: Callable[[Record], Any]) -> None:
        self.fn = fn

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Re-key every record of the batch."""
        fn, batch = self.fn, inputs.elements()
        out: Batch = []
        append = out.append
        view = _view()
        free = _getrefcount(view)
        try:
            for element in batch:
                try:
                    view.key, view.value, view.ts = element
                except ValueError:  # a loop or window element (six wide): a record of its own
                    key = fn(record_of(element))
                else:
                    key = fn(view)
                    if _getrefcount(view) != free:
                        view = _view()
                append((key, element[1], element[2]))
        except Exception as exc:
            outputs.emit_elements(out)
            raise RecordFailure(len(out)) from exc  # one output per element: the failing one's position
        outputs.emit_elements(out)


class ReduceTask(Task):
    """Per key, ``fn(accumulated, value) -> value``; emits each key's running value once per batch.

    The first value of a key is its initial accumulator. A batch folds all its
    records first, then emits one record per key it touched (in the order the
    keys first appear in it) with the key's value after the batch and the event
    time of the key's last record: what a downstream sees converges to the same
    values as one emission per record would, with one output per key per batch
    instead of one per record. With ``emit="record"`` it emits the running value
    after every record instead (every intermediate value, one output per input).
    Route its input by ``SAME_KEY`` when it runs in parallel, so each key lives
    in one instance.
    """

    def __init__(self, fn: Callable[[Any, Any], Any], emit: ReduceEmit = "batch") -> None:
        if emit not in ("batch", "record"):
            raise ValueError(f"emit must be 'batch' or 'record', got {emit!r}")
        self.fn = fn
        self.per_record = emit == "record"
        #: Set by the runtime under a replaying error policy: a failing ``fn`` that changed its accumulator
        #: in place leaves it as it was (the record it failed on has no effect).
        self.keeps_accumulators = False

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Fold the batch into the running values, then emit the keys it touched (or every value)."""
        if getattr(self.state, "ttl", None) is not None or self.per_record:
            self._execute_through_store(inputs, outputs)
            return
        if self.keeps_accumulators:
            self._execute_keeping(inputs, outputs)
            return
        fn, totals, batch = self.fn, self.state.values, inputs.elements()
        touched = _touched_before(inputs)  # key -> event time of its last record in the batch
        index = 0  # the failing element's position: by count, as a batch may hold one tuple twice
        missing = _MISSING
        try:
            for index, element in enumerate(batch):  # noqa: B007 - index names the element that fails
                key = element[0]
                current = totals.get(key, missing)
                totals[key] = element[1] if current is missing else fn(current, element[1])
                touched[key] = element[2]
        except Exception as exc:
            raise RecordFailure(index, touched) from exc  # emitted with the rest of the batch
        _emit_touched(touched, totals, outputs)

    def _execute_keeping(self, inputs: Inputs, outputs: Outputs) -> None:
        """:meth:`execute`'s fast path, putting back an accumulator that a failing ``fn`` changed in place."""
        fn, totals, batch = self.fn, self.state.values, inputs.elements()
        touched = _touched_before(inputs)
        index = 0
        missing, immutable = _MISSING, IMMUTABLE
        try:
            for index, element in enumerate(batch):  # noqa: B007 - index names the element that fails
                key = element[0]
                current = totals.get(key, missing)
                if current is missing:
                    totals[key] = element[1]
                elif type(current) in immutable:
                    totals[key] = fn(current, element[1])
                else:
                    totals[key] = _fold_kept(fn, current, element[1], totals, key)
                touched[key] = element[2]
        except Exception as exc:
            raise RecordFailure(index, touched) from exc
        _emit_touched(touched, totals, outputs)

    def _execute_through_store(self, inputs: Inputs, outputs: Outputs) -> None:
        """:meth:`execute` through ``get``/``put`` (with ``state_ttl`` the store times each write, which
        the fast path, writing the dict directly, would hide from it), and with ``emit="record"``."""
        fn, state, batch = self.fn, self.state, inputs.elements()
        touched = _touched_before(inputs)
        values = {key: state.get(key) for key in touched}
        every: Batch = []
        index = 0  # the failing element's position: by count, as a batch may hold one tuple twice
        try:
            for index, element in enumerate(batch):  # noqa: B007 - index names the element that fails
                key = element[0]
                current = state.get(key, _MISSING)
                if current is _MISSING:
                    value = element[1]
                elif self.keeps_accumulators:
                    value = _fold_kept(fn, current, element[1], state.values, key)
                else:
                    value = fn(current, element[1])
                values[key] = value
                state.put(key, value)
                if self.per_record:
                    every.append((key, value, element[2]))
                else:
                    touched[key] = element[2]
        except Exception as exc:
            outputs.emit_elements(every)
            raise RecordFailure(index, touched) from exc
        outputs.emit_elements(every)
        _emit_touched(touched, values, outputs)


def _fold_kept(fn: Callable[[Any, Any], Any], current: Any, value: Any, totals: dict[Any, Any], key: Any) -> Any:
    """``fn(current, value)``; when it raises, ``totals[key]`` is ``current`` as it was before the call."""
    kept = keep(current)
    try:
        return fn(current, value)
    except Exception:
        # into the object itself (a record emitted before may hold it); the dict, not put(): the key's write
        # time under a TTL stays as it was
        totals[key] = put_back_into(current, kept)
        raise


def _touched_before(inputs: Inputs) -> dict[Any, Any]:
    """The keys the records before a failed one touched (see :class:`RecordFailure`), taken, or none."""
    held, inputs.held = inputs.held, None
    return dict(held) if held else {}


def _emit_touched(touched: dict[Any, Any], values: Any, outputs: Outputs) -> None:
    """One element per key of ``touched`` with its value now and the time of its last record."""
    if touched:
        outputs.emit_elements([(key, values[key], ts) for key, ts in touched.items()])


class WindowReduceTask(Task):
    """Per window and key, the values folded by ``how`` (see ``Topology.window_reduce``).

    The window folds records as they arrive, so ``execute`` receives the
    per-key results of a closed window and passes them on.
    """

    def __init__(self, how: FoldHow) -> None:
        self.window_fold = how

    def execute(self, inputs: Inputs, outputs: Outputs) -> None:
        """Emit the window's per-key results."""
        outputs.emit_elements(inputs.elements())


_MISSING: Any = object()


_SHORTCUTS: frozenset[type[Task]] = frozenset({MapTask, FilterTask, FlatMapTask, KeyByTask, ReduceTask})


def leaves_nothing_on_failure(task: Task) -> bool:
    """Whether ``task`` is a built-in join (it applies the error policy itself, see
    ``core.model.joins.base``) or a built-in shortcut: it names its failing record (``RecordFailure``), the records
    before it took effect once and the failing one left nothing (``reduce`` writes a key only after ``fn``
    returned), so a replaying error policy needs no undo of its state. The exact classes only: a subclass
    may override ``execute``."""
    return type(task) in _SHORTCUTS or getattr(type(task), "handles_failures", False)
