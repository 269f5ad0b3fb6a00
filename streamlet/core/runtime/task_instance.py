"""A task instance: user ``execute`` under its error policy, in sync or async mode, windowed or not."""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

from streamlet.core.model.columnar import AggregateTask
from streamlet.core.model.columns import ColumnBatch
from streamlet.core.model.constants import LATE
from streamlet.core.model.encoding import pack_exact, unpackb
from streamlet.core.model.hooks import maybe_await
from streamlet.core.model.joins import EventTimeJoin, JoinCounters, JoinHooks, JoinTask, WindowJoin
from streamlet.core.model.joins.base import LEFT, RIGHT
from streamlet.core.model.joins.table import TableJoin
from streamlet.core.model.ports import Inputs
from streamlet.core.model.record import Barrier, Batch, DeadLetter, Element, Reconfigure, iteration_of, record_of
from streamlet.core.model.task import RecordFailure, ReduceTask, Task, WindowReduceTask, leaves_nothing_on_failure
from streamlet.core.model.timers import TimeDomain, Timers
from streamlet.core.model.windows import WindowSpec
from streamlet.core.model.world import cpu_time, monotonic, note_held
from streamlet.core.runtime.channel import Inbox
from streamlet.core.runtime.error_policy import POLICIES
from streamlet.core.runtime.instances import Environment, Receiver, count_batch
from streamlet.core.runtime.loop_watch import BLOCKED_AFTER, HOLDER, YIELD_AFTER, first_warning
from streamlet.core.runtime.offload import in_thread
from streamlet.core.runtime.outputs import RoutedOutputs
from streamlet.core.state.changelog import changelog, is_changelog, pack_chunk
from streamlet.core.state.expiring import ExpiringState
from streamlet.core.state.keyed import KeyedState
from streamlet.core.state.participant import Section
from streamlet.core.state.regroup import merge_task_snapshots, split_task_snapshot
from streamlet.core.state.rocks_expiring import RocksExpiringState
from streamlet.core.state.rocks_keyed import RocksKeyedState
from streamlet.core.state.rocks_sessions import window_form
from streamlet.core.state.rocks_timers import timer_list
from streamlet.core.state.undo import CallUndo, UndoableState, undoable_state
from streamlet.core.windows.build import logic_for
from streamlet.core.windows.columnar import ColumnarWindowLogic, aggregate_window
from streamlet.core.windows.fold import ClosedWindow, WindowLogic
from streamlet.core.windows.logic import TimeLogic
from streamlet.core.windows.session import SessionLogic
from streamlet.errors import EncodingError, FieldError, StreamletError, TaskError, TopologyError

if TYPE_CHECKING:
    from streamlet.core.model.topology import Node
    from streamlet.core.runtime.reconfiguration import ActiveReconfiguration, ReconfigurationPlan

_T = TypeVar("_T")
TIMED_STATES = (ExpiringState, RocksExpiringState)  # states with a TTL: their write times are checkpointed too
LATE_PORT = LATE  # the late side output: the last output port of every task


class TaskInstance(Receiver):
    """Runs a user ``Task`` under its error policy (fail, skip or restart)."""

    def __init__(self, node: Node, index: int, outputs: RoutedOutputs, env: Environment, inbox: Inbox) -> None:
        super().__init__(node, index, outputs, env, inbox)
        self.inputs = Inputs(node.inputs, f"task '{node.name}' instance {index}")
        backend = node.state_backend or env.state_backend
        opens_timers = getattr(backend, "open_timers", None)  # RocksDB keeps timers too
        self.timers: Timers = (
            Timers(env.clock.now) if opens_timers is None else opens_timers(env.job_id, node.name, index, env.clock.now)
        )
        self.failures = 0
        self.join_counters = JoinCounters()  # a join's late and held records (kept across task objects)
        self.arrivals = 0  # records a window join's windows have taken (their arrival numbers)
        self.finished = False  # restored from a checkpoint taken after finish(): do not run it again
        task = self._make_task()
        #: A ``table_join(bootstrap=True)`` whose table side has not caught up yet: its left records wait.
        self.bootstrapping = isinstance(task, TableJoin) and task.bootstrap
        #: Takes back what a failed call did to state and timers before skip or restart replays; only tasks
        #: under those policies that do not isolate their failed records themselves pay for it.
        self.undo: CallUndo | None = None
        self.policy = POLICIES[node.on_error]
        replays = self.policy.replays and not leaves_nothing_on_failure(task)
        if backend is not None:  # RocksDB: it journals a failed call's changes itself
            self.state: KeyedState = backend.open(
                env.job_id, node.name, index, node.max_parallelism, node.state_ttl, env.clock.now
            )
            if replays:
                self.undo = CallUndo(self.state, self.timers)
        elif replays:
            state = undoable_state(node.state_ttl, env.clock.now)
            self.undo = CallUndo(state, self.timers)
            self.state = state
        else:  # with a TTL the store needs the clock; without one, the plain dict-backed store pays nothing for it
            self.state = KeyedState() if node.state_ttl is None else ExpiringState(node.state_ttl, env.clock.now)
        self.task = self._adopt(task)
        self.window: WindowLogic | None = None
        self.windowed_ports: frozenset[int] = frozenset()
        #: Records per call when a plain execute's calls run past ``YIELD_AFTER`` (see ``_execute_in_turns``).
        self._turn_records: int | None = None
        if node.window is not None:
            task = self.task  # a columnar aggregate folds its windows in Arrow
            if isinstance(task, AggregateTask):
                self.window = aggregate_window(node.window, task)
            else:
                self.window = logic_for(node.window)
            self.window.fold = getattr(self.task, "window_fold", None)
            self._keep_windows_in(backend, env, index)
            self.window.emits_results = self._passes_folds_on and self.window.fold is not None
            self.windowed_ports = frozenset(node.windowed_ports)
        self._channels_of: list[list[int]] = []
        self.channels_changed()
        self.joining: ActiveReconfiguration | None = None  # added by a rescale: takes its state before it runs

    def _keep_windows_in(self, backend: Any, env: Environment, index: int) -> None:
        """A fold's open time windows or sessions in the backend's databases (RocksDB), not in memory. Not under
        skip or restart: those copy the open windows before each batch, and a copy of a database is a read of all
        of it."""
        window = self.window
        opens_windows = getattr(backend, "open_windows", None)
        if opens_windows is None or window is None or window.fold is None or self.policy.replays:
            return
        if isinstance(window, TimeLogic) and not isinstance(window, ColumnarWindowLogic):
            store = opens_windows(env.job_id, self.node.name, index, self.node.max_parallelism)
            window.new_folded = store.folded
        elif isinstance(window, SessionLogic):
            window.keep_in(backend.open_sessions(env.job_id, self.node.name, index, self.node.max_parallelism))

    def channels_changed(self) -> None:
        """The channels of each input port (sync mode picks among them)."""
        ports = self.inbox.ports
        self._channels_of = [[c for c, p in enumerate(ports) if p == port] for port in range(self.node.inputs)]

    def _make_task(self) -> Task:
        assert self.node.make_task is not None
        return self.node.make_task()

    def _new_task(self) -> Task:
        task = self._adopt(self._make_task())
        if isinstance(task, EventTimeJoin) and isinstance(self.task, EventTimeJoin):
            # the old object may still be in the middle of a call that goes on adding to its index: the new
            # one shares that index (a copy, or one made anew from the state, would miss what the call adds)
            task.share_index(self.task)
        return task

    def _adopt(self, task: Task) -> Task:
        """Give ``task`` this instance's state and timers; it is the one ``execute`` calls from now on."""
        task.state = self.state
        if isinstance(task, ReduceTask) and self.policy.replays:
            task.keeps_accumulators = True
        if isinstance(task, AggregateTask) and not self.policy.replays:
            task.holds_batches = True  # a failure fails the job: nothing held aside is ever taken back alone
        task.timers = self.timers
        self._handles_failures = isinstance(task, JoinTask)
        self._advances = isinstance(task, EventTimeJoin)  # a join with work due as the watermark rises
        if isinstance(task, JoinTask):
            task.hooks = JoinHooks(self._join_failed, self.join_counters)
        if isinstance(task, TableJoin):  # a new object (restart) keeps waiting as long as this instance does
            task.holding = self.bootstrapping
            task.recount()
        self._execute: Callable[[Inputs, RoutedOutputs], Any] = self._where_it_runs(task)
        self._async = inspect.iscoroutinefunction(task.execute) or self.node.run_in != "loop"
        # the built-in window_reduce task (not a subclass: that may override execute) only passes results on
        self._passes_folds_on = type(task) is WindowReduceTask or isinstance(task, AggregateTask)
        return task

    def _where_it_runs(self, task: Task) -> Callable[[Inputs, RoutedOutputs], Any]:
        """``task.execute``, or an awaitable call of it in a thread or a process of the job's pool (``run_in``)."""
        if self.node.run_in == "thread":
            return in_thread(task.execute)
        if self.node.run_in == "process":
            pool = self.env.process_pool
            assert pool is not None, "a job with a run_in='process' task makes its pool"
            return pool.caller(f"{self.env.job_id}/{self.node.name}")
        return task.execute

    # -- lifecycle ------------------------------------------------------------

    async def open(self) -> None:
        """Prepare the task."""
        self._prepare()
        if self.bootstrapping and self.catch_up.port_caught_up(RIGHT):  # nothing upstream to wait for
            await self.on_port_caught_up(RIGHT)

    async def on_port_caught_up(self, port: int) -> None:
        """A bootstrapping table join's table side caught up: the waiting left records are joined, and the
        left input flows again."""
        if not self.bootstrapping or port != RIGHT:
            return
        self.bootstrapping = False
        task = self.task
        assert isinstance(task, TableJoin)
        task.release(self.outputs)
        await self.outputs.flush()
        self.release_port(LEFT)

    def _bound_waiting(self) -> None:
        """Hold the left input back once the records waiting fill the join's buffer."""
        task = self.task
        assert isinstance(task, TableJoin)
        if task.waiting >= task.bootstrap_buffer:
            self.hold_port(LEFT)

    def _prepare(self) -> None:
        try:
            self.task.prepare(dict(self.node.config))
        except StreamletError:
            raise
        except Exception as exc:
            raise TaskError(
                f"task '{self.node.name}' instance {self.index} failed in prepare(config): {_describe(exc)}",
                task=self.node.name, instance=self.index, key=None,
            ) from exc  # fmt: skip

    async def take_handover(self) -> None:
        """An instance added by a rescale takes the state handed to it before it runs (others: nothing)."""
        joining = self.joining
        if joining is not None:
            self.joining = None
            await self._import(joining)
            self._reconfigured()

    async def run(self) -> None:
        """Run the loop of the task's input mode (a new instance first takes the state handed to it)."""
        await self.take_handover()
        if self.node.sync and self.node.inputs > 1:
            await self.open()
            await self._run_sync()
        else:
            await super().run()

    section: Section | None = "tasks"

    def snapshot(self, incremental: bool = False) -> dict[str, Any]:
        """State (with its write times under a TTL), open windows, timers and whether finish() already ran.
        ``incremental``: for a checkpoint that may hold only what changed in the state since the last one."""
        self.task.settle_state()
        window = None
        if self.window is not None:
            window = self.window.snapshot_increment() if incremental else self.window.snapshot()
        try:
            state = self.state.checkpoint_increment() if incremental else self.state.checkpoint()
            snapshot = {"state": state, "window": window, "finished": self.finished}
            if isinstance(self.state, TIMED_STATES):
                snapshot["state_written"] = self.state.checkpoint_written()
            snapshot["timers"] = self.timers.checkpoint_increment() if incremental else self.timers.checkpoint()
            if isinstance(self.task, EventTimeJoin):  # what decides which records are late, and how many were
                snapshot["join"] = {"watermark": self.timers.watermark, "late": self.join_counters.late}
            if isinstance(self.task, WindowJoin):  # records restored into windows keep their places
                snapshot["arrivals"] = self.arrivals
        except EncodingError as exc:
            where = f"task '{self.node.name}' instance {self.index}"
            raise EncodingError(f"{where}: {exc}", value_type=exc.value_type) from exc.__cause__
        return snapshot

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from :meth:`snapshot`'s data (one taken before timers or a TTL existed too)."""
        self.state.restore(snapshot["state"])
        if isinstance(self.state, TIMED_STATES):
            self.state.restore_written(snapshot.get("state_written"))
        self.timers.restore(timer_list(snapshot.get("timers")))
        if self.window is not None and snapshot["window"] is not None:
            self.window.restore(window_form(self.window, snapshot["window"]))
        self.finished = snapshot["finished"]
        self.arrivals = snapshot.get("arrivals", 0)
        join = snapshot.get("join")
        if join is not None:
            self.timers.watermark = join["watermark"]
            self.join_counters.late = join["late"]
        self._state_replaced()

    def _state_replaced(self) -> None:
        """The state was restored, or keys moved in or out: a join indexes what it holds again."""
        if isinstance(self.task, EventTimeJoin):
            self.task.reindex()
        elif isinstance(self.task, TableJoin):
            self.task.recount()
            if not self.bootstrapping and self.task.waiting:  # moved here from an instance still waiting
                self.task.release(self.outputs)

    def final_snapshot(self) -> Any:
        """The snapshot once inputs ended (after finish)."""
        return self.snapshot(self.env.incremental_checkpoints)

    async def on_aligned(self, epoch: int) -> None:
        """Snapshot, report, and pass the barrier on."""
        self._ack(epoch, self.snapshot(self.env.incremental_checkpoints))
        await self.outputs.flush()
        await self.outputs.broadcast(Barrier(epoch))

    # -- live reconfiguration (``core.runtime.reconfiguration``) ----------------------

    async def on_reconfigure(self, marker: Reconfigure) -> None:
        """Aligned on a reconfiguration: of this task, hand over the keys that move, tell downstream, then
        retire or take the keys that move here; of an upstream task, just note it."""
        active = self.env.reconfiguration
        if marker.task != self.node.name or active is None or active.plan.id != marker.id:
            await super().on_reconfigure(marker)
            return
        plan = active.plan
        await self.outputs.flush()
        if self.index in plan.exporters:
            await self._export(active)
        await self.outputs.broadcast(marker)  # downstream aligns on it: results from before the move come first
        if plan.retiring(self.index):
            self.retired = True
            self.open_ports = 0  # the loop ends here; complete() only ends the outputs
        elif self.index in plan.importers:
            await self._import(active)
        self._reconfigured()

    async def _export(self, active: ActiveReconfiguration) -> None:
        """Split this instance's state by where each key belongs now; keep its own part, send the others."""
        plan = active.plan
        target = plan.target_function(self.index)
        self.task.settle_state()  # everything the task held aside is in its state before the state moves
        parts: dict[int, Any]
        if self.index in plan.relocated:  # all of it goes to this instance's new incarnation
            parts = {self.index: self.snapshot()}
        elif self._plain_state():
            parts = self._move_out(target, plan.importers - {self.index})
        elif self._rocks_by_segment(plan.old.segments):
            parts = self._move_segments_out(plan)
        else:
            split = split_task_snapshot(self.snapshot(), target, plan.width, self.index, self.node.window)
            if not plan.retiring(self.index):
                self.restore(split[self.index])
            else:  # it holds nothing any more: its statistics (a join's held records) count nothing
                self.state.restore(pack_exact({}, "keyed state"))
            parts = dict(enumerate(split))
        self._state_replaced()
        for importer in plan.targets_of(self.index):
            await active.handoff.send(self.index, importer, parts[importer])

    def _plain_state(self) -> bool:
        """Only keyed values to move (no window, no TTL, no timer pending): moved key by key, not re-packed whole."""
        return type(self.state) in (KeyedState, UndoableState) and self._only_keyed_values()

    def _rocks_by_segment(self, segments: int) -> bool:
        """Only keyed values in RocksDB, laid out by the plan's segments: moved by range, segment by segment."""
        state = self.state
        return (
            isinstance(state, RocksKeyedState)
            and state.ttl is None  # write times move with the keys: a split snapshot carries them
            and state.values.segments == segments
            and self._only_keyed_values()
        )

    def _only_keyed_values(self) -> bool:
        """No window and no timer pending: the instance's state is its keyed values."""
        return (
            self.window is None and self.timers.next_due("event") is None and self.timers.next_due("processing") is None
        )

    def _move_segments_out(self, plan: ReconfigurationPlan) -> dict[int, Any]:
        """Take the segments that leave out of this instance's RocksDB by range (the keys that stay are not
        read): O(keys moved), where a split snapshot reads and rewrites them all."""
        state = cast(RocksKeyedState, self.state)
        segments = state.values.segments
        moved = state.hand_over_segments(plan.segment_owners(self.index), self.index)
        return {
            importer: {
                "state": changelog([pack_chunk(moved.get(importer, []))], segments),
                "window": None,
                "finished": self.finished,
            }
            for importer in plan.importers - {self.index}
        }

    def _move_out(self, target: Callable[[Any], int], importers: frozenset[int] | set[int]) -> dict[int, Any]:
        """Take the keys that leave out of this instance's state: O(keys held) lookups, O(keys moved) copies."""
        values, me = self.state.values, self.index
        leaving: dict[int, dict[Any, Any]] = {importer: {} for importer in importers}
        for key, owner in [(key, target(key)) for key in values]:
            if owner != me:
                leaving[owner][key] = values.pop(key)
        return {
            importer: {"state": pack_exact(moved, "keyed state"), "window": None, "finished": self.finished}
            for importer, moved in leaving.items()
        }

    async def _import(self, active: ActiveReconfiguration) -> None:
        """Wait for the part of every exporter, then hold their keys as well as this instance's own."""
        plan = active.plan
        if self.index not in plan.importers:
            return
        parts = await active.handoff.receive(self.index, plan.sources_of(self.index))
        if self._plain_state() and all(_plain_part(part) for part in parts):
            for part in parts:  # keys held here stay as they are: only the arriving ones are unpacked
                self.state.values.update(unpackb(part["state"]))
            self._state_replaced()
            return
        segments = getattr(self.state.values, "segments", None)
        if (
            segments is not None
            and self._rocks_by_segment(segments)
            and all(_by_range(part, segments) for part in parts)
        ):
            for part in parts:  # keys held here stay in the database untouched: the arriving ones are added
                cast(RocksKeyedState, self.state).take_in(part["state"])
            self._state_replaced()
            return
        self.restore(merge_task_snapshots([self.snapshot(), *parts], self.node.window))

    async def complete(self) -> None:
        """Close open windows, fire the event-time timers, run ``finish`` (which may emit final results),
        then end downstream. A retired instance handed all that over: it only ends its outputs."""
        if self.retired:
            self.completed = True
            await self.outputs.end()
            return
        if not self.finished:
            if self.window is not None:
                for window in self.window.close_all():
                    await self._run_window(window)
            if self._advances:  # the input ended: the watermark is at +infinity
                self.task.advance(math.inf, self.outputs)  # type: ignore[attr-defined]  # an EventTimeJoin
            await self._fire_final_timers()
            self.outputs.ts = None
            try:
                await maybe_await(self.task.finish(self.outputs))
            except Exception as exc:
                raise TaskError(
                    f"task '{self.node.name}' instance {self.index} failed in finish(): {_describe(exc)}",
                    task=self.node.name, instance=self.index, key=None,
                ) from exc  # fmt: skip
            self.finished = True
        await super().complete()

    # -- data -------------------------------------------------------------------

    async def process(self, port: int, batch: Batch | ColumnBatch) -> None:
        """A batch from ``port``: into its windows, or to ``execute`` (a columnar one to ``execute_columns``)."""
        if port not in self.windowed_ports:
            if isinstance(batch, ColumnBatch):
                self._execute_columns(port, batch)
            elif self._turn_records is not None and len(batch) > self._turn_records:
                await self._execute_in_turns(port, batch, self._turn_records)
            else:
                await self._execute_batch(port, batch)
            if self.bootstrapping and port == LEFT:
                self._bound_waiting()
            return
        if isinstance(batch, ColumnBatch):  # a columnar aggregate's window folds it in Arrow
            closed, late_rows = self._columnar_call(port, batch, self._add_columns_to_windows)
            if late_rows is not None:
                self.outputs.emit_columns(batch.with_data(batch.data.filter(late_rows)), port=LATE_PORT)
        else:
            if isinstance(self.task, WindowJoin):  # numbered, so a merged session keeps each side's order
                batch = self.task.stamped(batch, self.arrivals)
                self.arrivals += len(batch)
            closed, late = self._add_to_windows(port, batch)
            if late:
                self._send_late(late)
        for window in closed:
            await self._run_window(window)
        if closed:  # a window's results are a batch of their own: send them while they are young
            await self.outputs.flush()

    async def _execute_in_turns(self, port: int, batch: Batch, size: int) -> None:
        """A plain ``def execute`` whose calls hold the loop longer than ``YIELD_AFTER`` gets its batch in pieces
        of about that long (``size`` records), the loop turning between them: the worker's control plane (its
        answers to ZooKeeper, checkpoints, live changes), the network and timers wait one piece, not a batch.
        Records are taken in the same order, each once; only where batches are cut changes, as batch_size
        would change it."""
        for start in range(0, len(batch), size):
            await self._execute_batch(port, batch[start : start + size])

    def _learn_turn(self, seconds: float, cpu: float) -> None:
        """After a plain call of ``seconds`` (``cpu`` of them computing): the records a piece may hold so a call
        stays near ``YIELD_AFTER`` (``None``: whole batches, calls are short). A call counts as long when it
        computed that long, or blocked for ``BLOCKED_AFTER`` (a wall time stretched only by a busy machine is
        neither). Not for joins, whose batches go whole to their policy."""
        if self._handles_failures:
            return
        records = self.inputs.count()
        if (cpu > YIELD_AFTER or seconds > BLOCKED_AFTER) and records > 1:
            self._turn_records = max(1, int(records * YIELD_AFTER / seconds))
        elif self._turn_records is not None and seconds < YIELD_AFTER / 4:
            self._turn_records = None if records * 4 >= self.env.batch_size else records * 4

    def _add_columns_to_windows(self, batch: ColumnBatch) -> tuple[list[ClosedWindow], Any]:
        window = self.window
        assert isinstance(window, ColumnarWindowLogic)  # made by aggregate_window
        return window.add_columns(batch, self.env.clock.now())

    def _add_to_windows(self, port: int, batch: Batch) -> tuple[list[ClosedWindow], Batch]:
        window = self.window
        assert window is not None
        if window.fold is None or not self.policy.replays:
            return self._add_or_fail(port, batch)
        # window_reduce under skip or restart: a fold that raises is taken back whole (from a copy of the
        # windows as they were: a fold may change its accumulator in place), then the policy applies
        before = _windows_as_they_are(window)
        try:
            return window.add(port, batch, self.env.clock.now())
        except Exception as exc:  # noqa: BLE001 - user code: any error follows the policy
            _put_back(window, before)
            if _first_bad_timestamp(batch, self.node.window) is not None:
                return self._add_or_fail(port, batch)  # not the fold's failure: no policy applies
            return self._fold_failed(port, batch, exc)

    def _fold_failed(self, port: int, batch: Batch, error: BaseException) -> tuple[list[ClosedWindow], Batch]:
        """A fold raised on ``batch`` (its windows are as they were before it): restart folds the whole batch
        again with a fresh task object; skip folds it record by record and dead-letters each that fails."""
        if self.policy.retries_batches:
            self.policy.failed(self, batch[0], error, "record with key")  # past max_failures: the TaskError
            return self._add_to_windows(port, batch)
        window = self.window
        assert window is not None
        closed: list[ClosedWindow] = []
        late: Batch = []
        for element in batch:
            before = _windows_as_they_are(window)
            try:
                closed_now, late_now = window.add(port, [element], self.env.clock.now())
            except Exception as exc:  # noqa: BLE001 - user code: the policy says what becomes of the record
                _put_back(window, before)
                self.policy.failed(self, element, exc, "record with key")
                continue
            closed += closed_now
            late += late_now
        return closed, late

    def _add_or_fail(self, port: int, batch: Batch) -> tuple[list[ClosedWindow], Batch]:
        assert self.window is not None
        try:
            return self.window.add(port, batch, self.env.clock.now())
        except Exception as exc:  # a record without a usable ts, or a window_reduce function failed folding
            where = f"task '{self.node.name}' instance {self.index}"
            bad = _first_bad_timestamp(batch, self.node.window)
            if bad is not None:
                raise TaskError(
                    f"{where} input port {port}: the record with key {bad[0]!r} has ts {bad[2]!r}; "
                    f"{_TIMESTAMP_RULE[bad[2] is None]}",
                    task=self.node.name, instance=self.index, key=bad[0],
                ) from exc  # fmt: skip
            raise TaskError(
                f"{where} failed folding a window: {_describe(exc)}", task=self.node.name, instance=self.index, key=None
            ) from exc

    def next_deadline(self) -> float | None:
        """The next time a window closes or a processing-time timer is due by the clock, whichever is first."""
        window = None if self.window is None else self.window.next_deadline()
        timer = self.timers.next_due("processing")
        if timer is None or window is None:
            return window if timer is None else timer
        return min(window, timer)

    async def on_time(self) -> None:
        """Run the windows the clock has closed, then the processing-time timers due."""
        if self.window is not None:
            for window in self.window.on_time(self.env.clock.now()):
                await self._run_window(window)
        await self._fire_timers("processing", self.env.clock.now())

    def late_records(self) -> int:
        """Records that arrived after their windows (or a join's intervals) closed."""
        return (0 if self.window is None else self.window.late) + self.join_counters.late

    def _join_failed(self, element: Element, error: BaseException) -> bool:
        """A join's ``fn`` failed on what ``element`` caused: the policy's verdict (whether to call again)."""
        return self.policy.failed(self, element, error, "record with key")

    def _send_late(self, late: Batch) -> None:
        if isinstance(self.task, WindowJoin):
            late = [self.task.unstamped(element) for element in late]
        on_late = getattr(self.node.window, "on_late", None)
        self.outputs.emit_elements(late, port=LATE_PORT)
        if on_late is not None:
            for element in late:
                on_late(record_of(element))

    async def on_watermark(self, watermark: float) -> None:
        """Fire the windows the watermark closed and the event-time timers it reached, then pass it on
        after their results."""
        if self.window is not None:
            for window in self.window.advance(watermark):
                await self._run_window(window)
        self.timers.watermark = watermark
        if self._advances:
            self.task.advance(watermark, self.outputs)  # type: ignore[attr-defined]  # an EventTimeJoin
        await self._fire_timers("event", watermark)
        await super().on_watermark(watermark)

    # -- timers -------------------------------------------------------------------

    async def _fire_timers(self, time: TimeDomain, until: float) -> None:
        """One pass over the timers of ``time`` due at ``until`` (see :meth:`Timers.due`)."""
        if self.timers.next_due(time) is None:
            return  # the common case, every batch of a job on event time: no generator made
        due = self.timers.due(time, until)
        try:
            for key, when in due:
                await self._run_timer(key, when, time)
        finally:
            due.close()

    async def _fire_final_timers(self) -> None:
        """The input ended, so the watermark is at +infinity: fire every event-time timer, then drop the rest.

        The pass goes up to the latest timer pending now, not to infinity: a
        callback that sets a timer past that (a timer that re-arms itself)
        would otherwise fire for ever. Timers left then, and processing-time
        timers (the job clock will not reach them in this job), are dropped.
        """
        last = self.timers.last_due("event")
        if last is not None:
            await self._fire_timers("event", last)
        self.timers.clear()

    async def _run_timer(self, key: Any, when: float, time: TimeDomain) -> None:
        """``on_timer`` under the error policy: restart retries the timer, skip dead-letters it."""
        self.outputs.ts = when if time == "event" else self.env.clock.now()
        if self._handles_failures:  # a join applies the policy to the record itself, leaving nothing of it
            await maybe_await(self.task.on_timer(key, when, time, self.outputs))
            return
        while True:
            marks = self.outputs.marks()
            try:
                await self._undoable(lambda: self.task.on_timer(key, when, time, self.outputs))
                return
            except TopologyError:
                raise
            except Exception as exc:  # noqa: BLE001 - user code: any error follows the policy
                self.outputs.rollback(marks)
                if not self._timer_failed(key, when, time, exc):
                    return

    def _timer_failed(self, key: Any, when: float, time: TimeDomain, error: BaseException) -> bool:
        """Apply the policy to a failed timer; whether to run it again. A dead letter's record is
        ``Record(key, None, when)``: a timer has no record of its own."""
        timer = (key, None, when)
        what = f"the {time}-time timer at {when!r} for key"
        return self.policy.failed(self, timer, error, what)

    async def _run_window(self, window: ClosedWindow) -> None:
        if window.columns is not None:  # a columnar window's results, one Arrow batch with the window's bounds
            self.outputs.emit_columns(window.columns)
            return
        if window.results is not None:  # made by the logic (emits_results), maybe of many windows fired at once
            self.outputs.emit_elements(window.results)
            return
        if window.folded is not None and self._passes_folds_on:
            self._emit_folded(window)  # window_reduce: its execute would only pass the results on
            return
        self.inputs.window = self.outputs.window = (window.start, window.end)
        self.inputs.firing = self.outputs.firing = window.firing
        assert self.window is not None
        stamp = self.window.result_ts(window)  # a time window's last tick; else the last record's time
        by_port = window.records
        if window.folded is not None:  # a new list: a window kept for late firings still folds into its own
            by_port = {0: self._folded_results(window)}
        records = [element for port in sorted(by_port) for element in by_port[port]]
        if stamp is not None:
            self.outputs.ts = stamp
        elif records:
            self.outputs.ts = records[-1][2]
        batches = [by_port.get(port, []) for port in range(self.node.inputs)]
        if len(by_port) == 1 and not self.node.sync:
            [port] = by_port
            await self._execute_unit(records, lambda: self.inputs.set_one(port, records), "a window starting with key")
        else:
            await self._execute_unit(records, lambda: self.inputs.set_all(batches), "a window starting with key")
        self.inputs.window = self.outputs.window = None
        self.inputs.firing = self.outputs.firing = None

    def _emit_folded(self, window: ClosedWindow) -> None:
        """The per-key results of a folded window, emitted as they are (``window_reduce``'s whole execute)."""
        self.outputs.emit_elements(self._folded_results(window))

    def _folded_results(self, window: ClosedWindow) -> Batch:
        """A folded window's per-key results as window elements, stamped with its result time."""
        assert self.window is not None
        assert window.folded is not None
        stamp = self.window.result_ts(window)
        ts = window.last_ts if stamp is None else stamp
        bounds, firing = (window.start, window.end), window.firing
        results: Batch = [(key, value, ts, 0, bounds, firing) for key, value in window.folded.items()]
        kept: Any = window.folded
        if type(kept) is not dict:  # values a fired window kept in RocksDB: read out once, now they go
            kept.drop()
            window.folded = {}
        return results

    def _execute_columns(self, port: int, batch: ColumnBatch) -> None:
        """A built-in columnar task on a columnar batch: its errors stop the job (no record to isolate)."""
        self.outputs.ts = batch.last_ts()
        execute = self.task.execute_columns  # type: ignore[attr-defined]  # only columnar nodes get one
        self._columnar_call(port, batch, lambda batch: execute(batch, self.outputs))

    def _columnar_call(self, port: int, batch: ColumnBatch, call: Callable[[ColumnBatch], _T]) -> _T:
        """``call(batch)``, its errors named by the task and port."""
        try:
            return call(batch)
        except FieldError as exc:
            raise FieldError(f"task '{self.node.name}' input port {port}: {exc}") from None
        except StreamletError:
            raise
        except Exception as exc:
            first = batch.column(batch.key)[0] if batch.key is not None else None
            raise TaskError(
                f"task '{self.node.name}' instance {self.index} failed on a columnar batch of {len(batch)} rows "
                f"starting with key {first!r}: {_describe(exc)}",
                task=self.node.name, instance=self.index, key=first,
            ) from exc  # fmt: skip

    async def _call(self) -> None:
        if self._async:  # an async execute, or one run in a thread or a process: the loop is free meanwhile
            if self.undo is not None:
                await self._undoable(lambda: self._execute(self.inputs, self.outputs))
            else:  # on_error="fail" (or a shortcut): nothing to take back, nothing paid
                await self._execute(self.inputs, self.outputs)
            return
        # a plain def holds the loop: timed on the world's clocks (a simulation's virtual time stands still in a
        # call, so nothing there depends on how fast this machine runs it)
        began, cpu = monotonic(), cpu_time()
        HOLDER.enter(self.node.name, self.index, began)
        try:
            if self.undo is not None:
                await self._undoable(lambda: self._execute(self.inputs, self.outputs))
            else:
                self._execute(self.inputs, self.outputs)
        finally:
            HOLDER.leave()
            ended = monotonic()
            note_held(ended - began)
            if ended - began > self.env.loop_warning:
                self._held_the_loop(ended - began)
        self._learn_turn(ended - began, cpu_time() - cpu)
        if ended - self.env.yielded > YIELD_AFTER:
            # 50 ms since any instance last waited or yielded (in a simulation, virtual time: only what its loop
            # slept moves it): let the loop run what waits (answers to the network, timers, other instances)
            # before the next call, or a queue of long batches would hold it for their whole sum
            await asyncio.sleep(0)
            self.env.yielded = monotonic()

    def _held_the_loop(self, seconds: float) -> None:
        """A call held the event loop ``seconds`` (past ``loop_warning``): counted, and the task's first warned."""
        self.counters.loop_held += seconds
        if first_warning(self.env.job, self.node.name):
            self.log.warning(
                "task held the event loop",
                seconds=round(seconds, 3),
                threshold=self.env.loop_warning,
                advice=(
                    "nothing else of this process ran meanwhile (other tasks, timers, the cluster's heartbeat "
                    "answers): give the task run_in='thread' (blocking I/O) or run_in='process' (CPU-bound, "
                    "stateless), or make execute async"
                ),
            )

    async def _undoable(self, call: Callable[[], Any]) -> None:
        """One user call (plain or async); under skip or restart, a failure first takes back what it did to
        state, TTLs and timers, so the replay counts each record once."""
        undo = self.undo
        if undo is None:
            await maybe_await(call())
            return
        undo.begin()
        try:
            await maybe_await(call())
        except BaseException:
            undo.take_back()
            raise
        undo.forget()

    async def _execute_batch(self, port: int, batch: Batch) -> None:
        """Execute one batch under the error policy, isolating the failing record."""
        self.outputs.ts = batch[-1][2]
        if self._handles_failures:  # a join applies the policy to the record itself, leaving nothing of it
            self.inputs.set_one(port, batch)
            try:
                await self._call()
            except StreamletError:
                raise
            except Exception as exc:  # not its fn (that goes through the policy): a key it cannot hold
                raise self.task_error(batch[0], exc, what="a batch starting with key") from exc
            return
        held = None  # what a built-in owes from the records before a failed one, emitted with the rest
        while batch or held:
            marks = self.outputs.marks() if self.policy.replays else None
            self.inputs.set_one(port, batch)
            self.inputs.held, held = held, None
            try:
                await self._call()
                return
            except RecordFailure as failure:
                if self.undo is None:
                    held = failure.held
                    batch = self._record_failed(batch, failure.index, failure.__cause__ or failure)
                    continue
                # the records before the failing one were taken back with the rest: replay as any failure
                if marks is not None:
                    self.outputs.rollback(marks)
                batch = await self._batch_failed(port, batch, failure.__cause__ or failure)
            except FieldError as exc:  # a columnar task fed by elements: named as on a columnar batch
                raise FieldError(f"task '{self.node.name}' input port {port}: {exc}") from None
            except TopologyError:
                raise  # a wiring mistake (a partition function), not the task's: no policy applies
            except Exception as exc:  # noqa: BLE001 - user code: any error follows the policy
                if marks is not None:
                    self.outputs.rollback(marks)
                batch = await self._batch_failed(port, batch, exc)

    def _record_failed(self, batch: Batch, index: int, error: BaseException) -> Batch:
        """A shortcut told us which record failed: apply the policy, return what is left."""
        again = self.policy.failed(self, batch[index], error, "record with key")
        return batch[index:] if again else batch[index + 1 :]

    async def _batch_failed(self, port: int, batch: Batch, error: BaseException) -> Batch:
        """``execute`` raised on a whole batch: retry after a restart, or isolate the record.

        Past ``max_failures`` a restart gives up, and the job fails as under ``fail``: the batch is replayed one
        record at a time (on a fresh task object) first, so the ``TaskError`` names the record that fails."""
        giving_up = self.policy.retries_batches and self.failures >= self.node.max_failures and len(batch) > 1
        if self.policy.retries_batches and not giving_up:
            self.policy.failed(self, batch[0], error, "record with key")
            return batch
        after = f" after {self.node.max_failures} restarts" if giving_up else ""
        if giving_up:
            self.failures += 1
            self.task = self._new_task()
            self._prepare()
        for record in batch:  # replay one record at a time so the policy lands on the exact record
            marks = self.outputs.marks()
            self.inputs.set_one(port, [record])
            try:
                await self._call()
            except TopologyError:
                raise
            except Exception as exc:
                self.outputs.rollback(marks)  # the failed call is taken back whole: what it emitted too
                if giving_up:
                    raise self.task_error(record, exc, after=after) from exc
                self.policy.failed(self, record, exc, "record with key")
        if giving_up or not self.policy.replays:  # the replay did not fail again: report the batch
            raise self.task_error(
                batch[0], error, what=f"a batch of {len(batch)} records starting with key", after=after
            )
        return []

    async def _execute_unit(self, records: Batch, set_inputs: Callable[[], None], what: str) -> None:
        """Execute a sync wake-up or a window as one unit: on failure the policy applies to all of it."""
        while True:
            marks = self.outputs.marks()
            set_inputs()
            try:
                await self._call()
                return
            except TopologyError:
                raise
            except Exception as exc:  # user code (or a join that applied its own policy)
                if self._handles_failures and isinstance(exc, TaskError):
                    raise  # a join's own policy failed the job already, naming the record: not wrapped again
                self.outputs.rollback(marks)
                error = exc.__cause__ if isinstance(exc, RecordFailure) and exc.__cause__ else exc
                if not self.policy.failed_unit(self, records, error, what):
                    return

    # -- policies ---------------------------------------------------------------

    def dead_letter(self, element: Element, error: BaseException) -> None:
        """Set ``element`` aside with ``error`` in the job's dead letters (the ``skip`` policy)."""
        record = record_of(element)
        self.env.dead_letters.append(DeadLetter(self.node.name, self.index, record, _describe(error), error))
        self.log.warning("record dead-lettered", key=record.key, error=_describe(error))

    def restart(self, element: Element, error: BaseException, *, what: str = "record with key") -> None:
        """A fresh task object (state kept), or the ``TaskError`` past ``max_failures`` (the ``restart`` policy)."""
        self.failures += 1
        if self.failures > self.node.max_failures:
            raise self.task_error(element, error, what=what, after=f" after {self.node.max_failures} restarts")
        self.log.warning("restarting instance", key=element[0], error=_describe(error), failures=self.failures)
        self.task = self._new_task()
        self._prepare()

    def task_error(
        self, element: Element, error: BaseException, *, what: str = "record with key", after: str = ""
    ) -> TaskError:
        """The ``TaskError`` naming the instance, ``element``'s key and ``error`` (the ``fail`` policy)."""
        key = element[0]
        message = f"task '{self.node.name}' instance {self.index} failed on {what} {key!r}{after}: {_describe(error)}"
        task_error = TaskError(message, task=self.node.name, instance=self.index, key=key)
        task_error.__cause__ = error
        return task_error

    # -- sync mode ----------------------------------------------------------------

    async def _run_sync(self) -> None:
        """Execute when every open port has a batch; markers are taken as they reach a head."""
        while self.open_ports:
            if await self._take_markers():
                continue
            picks = self._sync_picks()
            if picks is None:
                await self.idle()
                continue
            began = monotonic()
            batches = [[] if channel is None else _pop_batch(self.inbox, channel) for channel in picks]
            arrived = self.inbox.last_arrival  # the last batch taken: the one that completed the wake-up
            if self.watermarks.any_idle:  # an idle sender speaks again: it holds the watermark back from now on
                for channel in picks:
                    if channel is not None:
                        self.watermarks.activate(channel)
            records = [element for batch in batches for element in batch]
            self.counters.count_in(len(records))
            self.outputs.ts = records[-1][2]
            if self.cycle is not None:
                self.outputs.iteration = max(map(iteration_of, records))
            if self.windowed_ports:
                for port, batch in enumerate(batches):
                    if batch:
                        await self.process(port, batch)
            else:
                await self._execute_unit(
                    records, partial(self.inputs.set_all, batches), "a sync wake-up starting with key"
                )
            processed = monotonic()
            if self.cycle is None:
                await self.outputs.flush(self.env.batch_size)
            else:
                await self.outputs.flush()
                self.cycle.batches_done(sum(1 for channel in picks if channel is not None))
            count_batch(self.counters, arrived, began, processed, monotonic())
        await self.complete()

    def has_work(self) -> bool:
        """In sync mode: a marker to take, or a batch on every open port."""
        if not (self.node.sync and self.node.inputs > 1):
            return super().has_work()
        return self._marker_at_head() is not None or self._sync_picks() is not None

    def _marker_at_head(self) -> int | None:
        for channel in range(self.inbox.channel_count):
            if not self.blocked[channel]:
                head = self.inbox.head(channel)
                if head is not None and type(head) is not list:
                    return channel
        return None

    async def _take_markers(self) -> bool:
        took = False
        while (channel := self._marker_at_head()) is not None:
            await self.on_marker(channel, self.inbox.pop(channel))  # type: ignore[arg-type]
            took = True
        return took

    def _sync_picks(self) -> list[int | None] | None:
        """Per port the channel to take a batch from (None: ended or held by a barrier), or None if not ready.

        While a checkpoint aligns, a port whose channels all delivered the
        barrier counts as having nothing, so the other ports can reach theirs.
        """
        picks: list[int | None] = []
        for channels in self._channels_of:
            usable = [c for c in channels if self.channel_open[c] and not self.blocked[c]]
            if not usable:
                picks.append(None)
                continue
            ready = next((c for c in usable if type(self.inbox.head(c)) is list), None)
            if ready is None:
                return None
            picks.append(ready)
        return picks if any(pick is not None for pick in picks) else None


def _plain_part(part: dict[str, Any]) -> bool:
    """A handed-over part holding keyed values only (what :meth:`TaskInstance._move_out` makes)."""
    return part.get("window") is None and not part.get("timers") and "state_written" not in part


def _by_range(part: dict[str, Any], segments: int) -> bool:
    """A handed-over part holding RocksDB entries laid out by ``segments`` only (``_move_segments_out``'s)."""
    state = part.get("state")
    return _plain_part(part) and is_changelog(state) and cast(dict[str, Any], state)["segments"] == segments


def _pop_batch(inbox: Inbox, channel: int) -> Batch:
    batch = inbox.pop(channel)
    assert type(batch) is list  # the caller saw a batch at the head
    return batch


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


_TIMESTAMP_RULE = {
    False: "an event-time window needs ts in seconds (an int or a float)",
    True: "this window has missing_ts='fail' (give every record a ts, or leave missing_ts='clock')",
}


def _first_bad_timestamp(batch: Batch, window: WindowSpec | None) -> Element | None:
    """The first element an event-time window cannot place: ts not a number, or missing where that is refused."""
    if getattr(window, "time", None) != "event":  # an event-time TimeWindow or SessionWindow
        return None
    missing_ts = getattr(window, "missing_ts", "clock")
    for element in batch:
        ts = element[2]
        if ts is None:
            if missing_ts == "fail":
                return element
        elif type(ts) is bool or not isinstance(ts, int | float):
            return element
    return None


def _windows_as_they_are(window: WindowLogic) -> tuple[Any, int]:
    """A copy of ``window``'s open windows and its late count, for :func:`_put_back` (deep: a fold may change
    its accumulator in place)."""
    return copy.deepcopy(window.snapshot()), window.late


def _put_back(window: WindowLogic, before: tuple[Any, int]) -> None:
    """``window`` as :func:`_windows_as_they_are` found it."""
    window.restore(before[0])
    window.late = before[1]
