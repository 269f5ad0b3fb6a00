"""Where a task's plain ``def execute`` runs: ``add_task(..., run_in="loop" | "thread" | "process")``.

- ``"loop"`` (the default): on the event loop of the process that drives the instance. A call that
  computes or blocks for a second holds that loop, and everything else of the process, for that second.
- ``"thread"``: in a thread of the loop's pool (``anyio.to_thread``), the loop free meanwhile to run other
  instances, timers and the cluster's control plane. Blocking I/O (a ``requests`` call, a ``time.sleep``)
  gains the most; CPU-bound Python code still competes for the GIL. State, timers, error policies and
  checkpoints are as on the loop: the instance waits for its call, so no other code touches them meanwhile.
- ``"process"``: in a process of a pool the job starts (forked from the process that runs the instance),
  so CPU-bound code uses other cores. The batch goes there and what ``execute`` emitted comes back
  packed with the state codec (values must be encodable, as between processes); ``execute`` has no
  ``self.state`` and no timers there, so only a stateless task may run so (a window, ``state_ttl``,
  ``on_timer``, ``reduce``, a join or a columnar task is refused when the topology is built, and a task
  that reads ``self.state`` anyway fails with a ``TopologyError``).

An ``async def execute`` already leaves the loop while it awaits: it takes ``"loop"`` only.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, TypeAlias

from streamlet.core.model.windows import WindowSpec
from streamlet.errors import TopologyError

RunIn: TypeAlias = Literal["loop", "thread", "process"]
RUN_IN: tuple[str, ...] = ("loop", "thread", "process")


def check_run_in(name: str, run_in: Any, probe: Any, *, window: WindowSpec | None, state_ttl: float | None) -> None:
    """``run_in`` is one this task can take (``probe``: one of its task objects)."""
    if run_in not in RUN_IN:
        raise TopologyError(f"task '{name}': run_in must be one of {RUN_IN}, got {run_in!r}")
    if run_in == "loop":
        return
    if inspect.iscoroutinefunction(probe.execute) or getattr(probe, "runs_calls_itself", False):
        raise TopologyError(
            f"task '{name}': run_in={run_in!r} is for a plain def execute; an async one already leaves the event "
            "loop free while it awaits (leave run_in='loop')"
        )
    if run_in == "thread":
        return
    why = _stateful(probe, window, state_ttl)
    if why is not None:
        raise TopologyError(
            f"task '{name}': run_in='process' runs execute in another process, which has no self.state or "
            f"timers, so it takes stateless tasks only, and this one {why}; use run_in='thread', or keep the "
            "state in a task of its own"
        )


def _stateful(probe: Any, window: WindowSpec | None, state_ttl: float | None) -> str | None:
    """Why ``probe`` needs its instance's state or timers, or ``None`` when it does not."""
    from streamlet.core.model.task import ReduceTask, Task, WindowReduceTask

    if window is not None:
        return "has a window"
    if state_ttl is not None:
        return "has a state_ttl"
    if type(probe).on_timer is not Task.on_timer:
        return "has on_timer"
    if isinstance(probe, ReduceTask | WindowReduceTask):
        return "folds per key (reduce)"
    if getattr(probe, "keyed_inputs", False):
        return "is a join"
    if getattr(probe, "columnar", False):
        return "is columnar"
    return None
