"""From a window spec (model data) to the logic that runs it in one instance."""

from __future__ import annotations

from streamlet.core.model.windows import CountOrTimeWindow, CountWindow, Ticks, TimeWindow, WindowSpec
from streamlet.core.windows.fold import WindowLogic
from streamlet.core.windows.logic import CountLogic, CountOrTimeLogic, EventTimeLogic, ProcessingTimeLogic


def logic_for(spec: WindowSpec) -> WindowLogic:
    """Fresh window logic for one instance of a task windowed by ``spec``.

    Example:
        >>> logic_for(CountWindow(3)).__class__.__name__
        'CountLogic'
    """
    if isinstance(spec, CountWindow):
        return CountLogic(spec.size, spec.size if spec.slide is None else spec.slide)
    if isinstance(spec, TimeWindow):
        slide = spec.size if spec.slide is None else spec.slide
        ticks = Ticks(spec.time_unit)
        if spec.time == "event":
            logic = EventTimeLogic(spec.size, slide, spec.allowed_lateness, spec.idle_timeout, ticks)
            logic.refuse_missing_ts = spec.missing_ts == "fail"
            return logic
        return ProcessingTimeLogic(spec.size, slide, ticks)
    if isinstance(spec, CountOrTimeWindow):
        return CountOrTimeLogic(spec.count, spec.seconds)
    raise TypeError(f"no window logic for {type(spec).__name__}")
