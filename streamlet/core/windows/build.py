"""From a window spec (model data) to the logic that runs it in one instance."""

from __future__ import annotations

from streamlet.core.model.windows import CountOrTimeWindow, CountWindow, SessionWindow, Ticks, TimeWindow, WindowSpec
from streamlet.core.windows.fold import WindowLogic
from streamlet.core.windows.keyed_count import KeyedCountLogic
from streamlet.core.windows.logic import CountLogic, CountOrTimeLogic, EventTimeLogic, ProcessingTimeLogic
from streamlet.core.windows.session import EventTimeSessionLogic, ProcessingTimeSessionLogic


def logic_for(spec: WindowSpec) -> WindowLogic:
    """Fresh window logic for one instance of a task windowed by ``spec``.

    Example:
        >>> logic_for(CountWindow(3)).__class__.__name__
        'CountLogic'
    """
    if isinstance(spec, CountWindow):
        count_logic = KeyedCountLogic if spec.per_key else CountLogic
        return count_logic(spec.size, spec.size if spec.slide is None else spec.slide)
    if isinstance(spec, SessionWindow):
        return _session_logic(spec)
    if isinstance(spec, TimeWindow):
        slide = spec.size if spec.slide is None else spec.slide
        ticks = Ticks(spec.time_unit)
        if spec.time == "event":
            logic = EventTimeLogic(
                spec.size, slide, spec.allowed_lateness, spec.idle_timeout, ticks, spec.offset, spec.early_firing
            )
            logic.refuse_missing_ts = spec.missing_ts == "fail"
            return logic
        return ProcessingTimeLogic(spec.size, slide, ticks, spec.offset, spec.early_firing)
    if isinstance(spec, CountOrTimeWindow):
        return CountOrTimeLogic(spec.count, spec.seconds)
    raise TypeError(f"no window logic for {type(spec).__name__}")


def _session_logic(spec: SessionWindow) -> WindowLogic:
    ticks = Ticks(spec.time_unit)
    if spec.time == "event":
        return EventTimeSessionLogic(spec.gap, spec.allowed_lateness, ticks, spec.missing_ts == "fail")
    return ProcessingTimeSessionLogic(spec.gap, ticks)
